"""`pycni-agent`: the node-local agent (cni.agent.server) as a command. Runs in the DaemonSet next to
the installer; SIGTERM or SIGINT stops accepting at once (the socket is removed, new calls run
in-process) and lets the requests in flight finish."""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
from typing import Any

from cni.agent.client import DEFAULT_SOCKET


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pycni-agent", description=__doc__)
    ap.add_argument("--socket", default=DEFAULT_SOCKET,
                    help=f"unix socket to serve (default {DEFAULT_SOCKET})")
    ap.add_argument("--max-inflight", type=int, default=128,
                    help="requests executed at once; more are refused and run in-process (default 128)")
    ap.add_argument("--grace", type=float, default=30.0,
                    help="seconds to let requests in flight finish on SIGTERM (default 30)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from cni.__main__ import build_id
    from cni.agent.server import Agent, say, warm

    warm()
    agent = Agent(args.socket, build_id(), max_inflight=args.max_inflight)
    try:
        agent.bind()
    except OSError as e:
        say(f"cannot serve {args.socket}: {e.strerror or e}")
        return 1

    def stop(*_: Any) -> None:
        agent.stop()

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.serve(args.grace)
    return 0
