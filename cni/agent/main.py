"""`pycni-agent`: the node-local agent (cni.agent.server) as a command, and its composition root: the
one module of cni that imports the IPAM (the layer contracts of `make lint`, pyproject.toml), to hand
the server what it warms up. Runs in the DaemonSet next to the installer; SIGTERM or SIGINT stops
taking requests at once (the FIFO is removed, new calls run in-process) and lets the requests in flight
finish. Prometheus metrics (cni.exporter) are served on --metrics (default 127.0.0.1:9736,
PYCNI_METRICS overrides the default, `off` disables them)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cni.agent.client import DEFAULT_FIFO
from cni.agent.server import IPAM_TIMEOUT
from cni.metrics import parse_address

METRICS_ENV = "PYCNI_METRICS"
DEFAULT_METRICS = "127.0.0.1:9736"  # == cni.exporter.default_address(AGENT), without importing it
BIND_RETRY = 5.0  # seconds between attempts to bind a metrics address that was taken
WATCH_RETRY = 5.0  # seconds between looks for the flat file the pod watch needs


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pycni-agent", description=__doc__)
    ap.add_argument("--fifo", default=DEFAULT_FIFO,
                    help=f"the FIFO the plugin entries write their requests to (default {DEFAULT_FIFO})")
    ap.add_argument("--max-inflight", type=int, default=128,
                    help="requests executed at once; more are refused and run in-process (default 128)")
    ap.add_argument("--ipam-timeout", type=positive, default=IPAM_TIMEOUT, metavar="SECONDS",
                    help="seconds an IPAM plugin the agent execs (a third-party one on CNI_PATH; pycni's own "
                         "runs in-process) may run before it is killed with its process group; it is "
                         "killed at once when the calling plugin process goes away, killed by the "
                         "runtime's timeout (default 240: the kubelet's RunPodSandbox deadline, twice its "
                         "default --runtime-request-timeout of 2m)")
    ap.add_argument("--grace", type=float, default=30.0,
                    help="seconds from SIGTERM for the requests in flight and the pool batches they "
                         "started to finish: one budget, to fit the pod's terminationGracePeriodSeconds "
                         "(default 30)")
    ap.add_argument("--metrics", default=os.environ.get(METRICS_ENV) or DEFAULT_METRICS, metavar="ADDR",
                    type=metrics_address,
                    help="serve Prometheus metrics on HOST:PORT (port 0: any free one), or `off` "
                         f"(default {DEFAULT_METRICS}, or ${METRICS_ENV})")
    ap.add_argument("--pod-watch", default="auto", metavar="auto|off|PATH",
                    help="watch this node's pods (NODENAME) and free what deleted pods held, on the "
                         "Kubernetes store of the node's flat file (PATH: that file or its directory; "
                         "auto: where the plugin finds it, when NODENAME is set; default auto)")
    ap.add_argument("--claim-watch", default="auto", metavar="auto|off|PATH",
                    help="free what deleted IPAMClaims held, on the Kubernetes store of the node's flat "
                         "file, while this node holds claims (PATH: that file or its directory; auto: "
                         "where the plugin finds it; default auto)")
    ap.add_argument("--claim-records", default="", metavar="DIR",
                    help="where the plugins record the IPAMClaims this node allocated for (default: "
                         "claims/ beside the flat file's local_db, /var/lib/cni/pycni/claims; give the "
                         "NADs' when they name another local_db)")
    return ap.parse_args(argv)


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def remaining(grace: float, stopped_at: float, now: float | None = None) -> float:
    """What is left of the stop's budget (`grace` seconds from `stopped_at`, monotonic) for the pool
    writes still to come, after the requests in flight took their part of it."""
    return max(0.0, grace - ((time.monotonic() if now is None else now) - stopped_at))


def metrics_address(text: str) -> tuple[str, int] | None:
    try:
        return parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def serve_metrics(where: tuple[str, int] | None, build: str, every: float = BIND_RETRY) -> None:
    """Install the exporter and serve it. The agent is there for the calls, so an address that cannot
    be bound is not fatal: it is logged and tried again every `every` seconds in the background (a
    port still held by the agent being replaced, say), and the hooks count meanwhile."""
    from cni.agent.server import say

    if where is None:
        say("metrics off")
        return
    try:
        from cni.exporter import AGENT, install, url
    except ImportError as e:  # a bundle built without prometheus_client: serve the calls all the same
        say(f"metrics not available in this build: {e}")
        return
    exporter = install(AGENT, build)

    def bind(first: bool) -> bool:
        try:
            say(f"metrics on {url(*exporter.serve(*where))}")
            return True
        except OSError as e:
            if first:
                say(f"metrics not served on {where[0]}:{where[1]}: {e.strerror or e}; trying again every "
                    f"{every:g} s")
            return False

    def keep_trying() -> None:
        while not bind(first=False):
            time.sleep(every)

    if not bind(first=True):
        threading.Thread(target=keep_trying, name="metrics-bind", daemon=True).start()


def start_pod_watch(spec: str, env: dict[str, str] | os._Environ[str] = os.environ,
                    every: float = WATCH_RETRY,
                    open_watch: Callable[..., Any] | None = None) -> threading.Event | None:  # fmt: skip
    """Start the pod watch (ipam.podwatch) in the background, unless `spec` is off or no NODENAME is set
    (auto). Until the flat file names a store (the installer writes it next to us) it is looked for
    every `every` seconds; a store other than Kubernetes ends it (logged: the reconciler frees then). A
    watch whose credentials the server refuses is opened again from the flat file (the kubeconfig it
    names may have changed since). While it is down, the gauge pycni_podwatch_up says 0 and one warning
    says why (ipam/watchhealth.py). The event stops it. It never holds up or fails a plugin call: its
    own threads, its own clients. `open_watch`: ipam.podwatch.open_pod_watch, or a test's stand-in."""
    from cni.agent.server import say

    node = env.get("NODENAME", "")
    if spec == "off" or (spec == "auto" and not node):
        say("pod watch off" + ("" if spec == "off" else " (no NODENAME)"))
        return None
    if not node:
        say("pod watch off: NODENAME is not set")
        return None
    from ipam.watchhealth import Health

    path = "" if spec == "auto" else spec
    stop = threading.Event()
    health = Health(say)  # down (0) until the watch lists and watches

    def open_once() -> bool:
        """Open the watch and run it until it is refused or stopped; False when it is over for good."""
        from cni.errors import ConfigError
        from ipam import podwatch

        try:
            watch = (open_watch or podwatch.open_pod_watch)(node, path, say, health)
        except podwatch.NotKubernetes as e:
            health.off(f"the node's store is {e}, not kubernetes (the reconciler frees)")
            return False
        except Exception as e:  # no flat file yet, a kubeconfig that cannot be used yet: again later
            why = e.msg if isinstance(e, ConfigError) else str(e) or type(e).__name__
            health.down("open", f"not started ({why}); trying again every {every:g} s")
            return not stop.wait(every)
        say(f"pod watch on node {node}")
        try:
            watch.start()  # its parts (watch, sweep) starting: up once they run, not before
            health.up("open", f"pod watch up: the pods of node {node} listed and watched")
            while not stop.wait(every) and not watch.refused.is_set():
                pass
        finally:
            watch.close()
        if stop.is_set():
            return False
        health.starting("open")  # refused (said by the watch): opened again from the flat file
        return True

    def opener() -> None:
        """Never ends by an exception: whatever escapes is said, and the watch opened again."""
        while not stop.is_set():
            try:
                if not open_once():
                    return
            except Exception as e:
                if health.down("open", f"the opener failed ({e!r}); trying again every {every:g} s"):
                    from cni import log

                    say(log.traceback_text())
                stop.wait(every)

    threading.Thread(target=opener, name="pod-watch-open", daemon=True).start()
    return stop


def start_claim_watch(spec: str, records: str = "", every: float = WATCH_RETRY) -> threading.Event | None:
    """Start the IPAMClaim watch (ipam.claimwatch) in the background, unless `spec` is off; opened like
    the pod watch (the flat file looked for every `every` seconds, another store than Kubernetes ends
    it), with the node's claim records in `records` (default: beside the flat file's local_db). It
    makes no request while the node holds no claim. The event stops it."""
    from cni.agent.server import say

    if spec == "off":
        say("claim watch off")
        return None
    path = "" if spec == "auto" else spec
    stop = threading.Event()

    def opener() -> None:
        from ipam.claimwatch import NotKubernetes, open_claim_watch

        while not stop.is_set():
            try:
                watch = open_claim_watch(path, say, records)
            except NotKubernetes:
                return  # no claims on another store (the plugin refuses allowPersistentIPs there)
            except Exception:  # no flat file yet, or a kubeconfig that cannot be used yet: again later
                stop.wait(every)
                continue
            watch.start()
            stop.wait()
            watch.close()
            return

    threading.Thread(target=opener, name="claim-watch-open", daemon=True).start()
    return stop


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from cni.agent.server import Agent, say, warm
    from cni.buildid import build_id
    from cni.registry import LAZY_MODULES
    from ipam import batch
    from ipam.store.handles import keep_warm

    # the agent's own network namespace and directory, for the threads that write pools (ipam.batch):
    # not inherited from whichever call thread started them
    home = (os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC),
            os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))  # fmt: skip
    # every plugin, tool, IPAM and store module; cluster store connections outlive a request
    warm(LAZY_MODULES, hooks=(keep_warm, lambda: batch.install(home)))
    agent = Agent(args.fifo, build_id(), max_inflight=args.max_inflight, ipam_timeout=args.ipam_timeout)
    try:
        agent.bind()
    except OSError as e:
        say(f"cannot serve {args.fifo}: {e.strerror or e}")
        return 1
    serve_metrics(args.metrics, build_id())
    watching = start_pod_watch(args.pod_watch)
    claims = start_claim_watch(args.claim_watch, args.claim_records)

    def stop(*_: Any) -> None:
        agent.stop()

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.serve(args.grace)
    for watch in (watching, claims):
        if watch is not None:
            watch.set()
    from ipam.combiner import settle_all

    if not settle_all(remaining(args.grace, agent.stopped_at)):  # batches of calls still in flight
        say("stopping with pool batches still under way (their calls get code 11 or run again)")
    return 0
