"""The node-local agent (cni.agent) with real namespaces: 50 concurrent ADDs into 50 namespaces, an
agent killed mid-request, stopped with a request in flight, restarted, and refusing non-root callers.
Each test runs its own agent on its own FIFO (from source, or the frozen `pycni-agent` in the frozen
pass) and counts in the agent's log which requests it served."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni import procs
from cni.agent import client
from ipam.store.local import LocalStore
from tests.agentutil import Agent
from tests.ipamutil import write_wrappers
from tests.nsutil import Call, Topology
from tests.waits import until

ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=agent;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
PODS = 50


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path / "run" / "agent.fifo", tmp_path / "agent.log").start()
    yield a
    a.stop()


def cni_path(tmp_path: Path) -> str:
    """Our whereabouts: the frozen bundle's entry (served in-process there) or a from-source wrapper."""
    bindir = os.environ.get("PYCNI_PLUGIN_DIR") or str(write_wrappers(tmp_path / "bin"))
    return f"{bindir}:/usr/lib/cni"


def conf(topo: Topology, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    ipam = {"type": "whereabouts", "range": "198.51.100.0/24", "exclude": ["198.51.100.1"],
            "datastore": "local", "local_db": str(tmp_path / "ipam.db"),
            "configuration_path": str(tmp_path / "flat.conf")}
    (tmp_path / "flat.conf").write_text("{}")
    return {"cniVersion": "1.0.0", "name": "agentnet", "type": "macvlan", "master": topo.uplink,
            "dad": "off", "ipam": ipam, **extra}


def run(topo: Topology, a: Agent, command: str, cfg: dict[str, Any], pod: str, i: int, tmp: Path) -> Call:
    return topo.run("macvlan", command, cfg, netns=pod, container_id=f"c{i}", path=cni_path(tmp),
                    cni_args=ARGS.format(pod=f"p{i}"), env={"PYCNI_AGENT_FIFO": str(a.fifo), **PATIENT})


# the shims wait for the agent to take their request however loaded the machine (default 2 s, then
# in-process): which calls the agent serves must not depend on it keeping pace with 50 at once
PATIENT = {"PYCNI_AGENT_TIMEOUT": "120"}


def allocations(tmp_path: Path) -> list[str]:
    store = LocalStore(str(tmp_path / "ipam.db"))
    try:
        return [a.container_id for pool in store.iter_pools() for a in pool.allocations.values()]
    finally:
        store.close()


def process_state(pid: int) -> tuple[int, str, str]:
    """(open fds, network namespace, cwd) of the agent's process."""
    return (len(os.listdir(f"/proc/{pid}/fd")), os.readlink(f"/proc/{pid}/ns/net"),
            os.readlink(f"/proc/{pid}/cwd"))


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def settled(pid: int, want: int) -> None:
    """Until the request threads of the agent `pid` have ended (they end right after answering)."""
    until(lambda: threads(pid) == want, lambda: f"{want} threads in the agent, not {threads(pid)}", 60)


def test_fifty_concurrent_adds_into_fifty_namespaces(topo: Topology, agent: Agent, tmp_path: Path) -> None:
    cfg = conf(topo, tmp_path)
    debug = {**cfg, "logLevel": "debug"}
    pods = [topo.pod(f"{i:02d}") for i in range(PODS)]
    before, idle = process_state(agent.pid), threads(agent.pid)
    # odd ones log at debug level (their info lines show): that must stay theirs
    with ThreadPoolExecutor(PODS) as pool:
        adds = list(pool.map(lambda i: run(topo, agent, "ADD", debug if i % 2 else cfg, pods[i], i, tmp_path),
                             range(PODS)))
    failed = "\n".join(f"{a.out}\n{a.stderr[-3000:]}" for a in adds if not a.ok)  # all of it, untruncated
    assert [a.rc for a in adds] == [0] * PODS, failed
    got = [a.out["ips"][0]["address"] for a in adds]
    assert len(set(got)) == PODS
    for i, pod in enumerate(pods):
        assert topo.addrs(pod, "net1") == [got[i]]
        assert ("info:" in adds[i].stderr) == bool(i % 2), (i, adds[i].stderr)
    assert len(agent.served("served macvlan ADD rc=0")) == PODS  # through the agent, none in-process
    assert sorted(allocations(tmp_path)) == sorted(f"c{i}" for i in range(PODS))
    with ThreadPoolExecutor(PODS) as pool:
        dels = list(pool.map(lambda i: run(topo, agent, "DEL", cfg, pods[i], i, tmp_path), range(PODS)))
    assert [d.rc for d in dels] == [0] * PODS, [d for d in dels if not d.ok][:3]
    assert len(agent.served("served macvlan DEL rc=0")) == PODS
    assert allocations(tmp_path) == []
    assert all(topo.link(pod, "net1") is None for pod in pods)
    assert sorted(x["ifname"] for x in topo.links(topo.host)) == sorted(["lo", topo.uplink, topo.peer])
    settled(agent.pid, idle)
    assert process_state(agent.pid) == before  # no fd, namespace or cwd change outlived a request


def slow_ipam(tmp_path: Path) -> tuple[str, Path]:
    """A CNI_PATH dir whose `slowipam` records each ADD, then waits to be killed (other commands
    succeed at once: the rollback's DEL)."""
    bindir = tmp_path / "slow"
    bindir.mkdir()
    marks = tmp_path / "starts"
    script = bindir / "slowipam"
    script.write_text(f'#!/bin/sh\n[ "$CNI_COMMAND" = ADD ] || exit 0\necho $$ >> {marks}\nexec sleep 60\n')
    script.chmod(0o755)
    return str(bindir), marks


def kill_sleeper(pid: str) -> None:
    """SIGKILL a slowipam that still sleeps: a pid whose process has exited may already be another's (a
    parallel session's API server: pids wrap at 32768 here)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return  # gone
    if argv[:1] == [b"sleep"]:
        os.kill(int(pid), signal.SIGKILL)


def wait_for(path: Path) -> list[str]:
    until(lambda: path.exists() and path.read_text().strip(), f"{path} written")
    return path.read_text().split()


def test_agent_killed_mid_request_gives_code_11_and_runs_nothing_twice(
    topo: Topology, agent: Agent, tmp_path: Path
) -> None:
    bindir, marks = slow_ipam(tmp_path)
    cfg = {"cniVersion": "1.0.0", "name": "slow", "type": "macvlan", "master": topo.uplink,
           "ipam": {"type": "slowipam"}}
    pod = topo.pod()
    env = {"PYCNI_AGENT_FIFO": str(agent.fifo)}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(topo.run, "macvlan", "ADD", cfg, netns=pod, path=bindir, env=env)
        pids = wait_for(marks)  # the agent is executing the ADD: the IPAM has started
        agent.signal(signal.SIGKILL)
        add = pending.result(timeout=60)
        for pid in pids:
            kill_sleeper(pid)
    assert add.rc == 1 and add.out["code"] == 11 and add.out["cniVersion"] == "1.0.0", add
    assert marks.read_text().split() == pids and len(pids) == 1  # not executed a second time
    # the agent is gone, its FIFO stays (nobody reads it): the DEL runs in-process and cleans up
    assert agent.fifo.exists()
    host_local = {"type": "host-local", "dataDir": str(tmp_path / "hl"), "subnet": "198.51.100.0/24"}
    delete = topo.run("macvlan", "DEL", {**cfg, "ipam": host_local}, netns=pod, path="/usr/lib/cni", env=env)
    assert delete.ok, delete
    assert topo.link(pod, "net1") is None


DAY = 86400
WAVE = 65  # two waves: 130 calls, more than the agent's --max-inflight (128), none refused as busy


def day_ipam(tmp_path: Path) -> tuple[str, Path]:
    """A CNI_PATH dir whose third-party `dayipam` never answers an ADD: it sleeps for a day in a child
    of its own (killing the IPAM alone would leave that sleeping) after recording "PID PPID CHILD"
    (PPID: the agent when it execs the IPAM, the plugin process when the call ran in-process)."""
    bindir = tmp_path / "day"
    bindir.mkdir()
    marks = tmp_path / "days"
    script = bindir / "dayipam"
    script.write_text(f'#!/bin/sh\n[ "$CNI_COMMAND" = ADD ] || exit 0\nsleep {DAY} &\n'
                      f'echo "$$ $PPID $!" >> {marks}\nwait\n')
    script.chmod(0o755)
    return str(bindir), marks


def days(marks: Path) -> list[list[str]]:
    return [line.split() for line in marks.read_text().splitlines()] if marks.exists() else []


def running(pid: str) -> bool:
    """Whether `pid` is a dayipam or its sleep, not yet exited (a zombie has: the killed sleep waits for
    init to reap it, the IPAM for the agent). Pids may be reused: the command line must be theirs."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return state != b"Z" and (b"dayipam" in argv or argv == f"sleep\0{DAY}\0".encode())


def started(marks: Path, n: int) -> None:
    until(lambda: len(days(marks)) == n, lambda: f"{len(days(marks))} IPAMs started, not {n}", 120)


def test_an_exec_d_ipam_that_never_answers_ends_with_its_caller(
        topo: Topology, agent: Agent, tmp_path: Path) -> None:
    """Issue 45: 130 ADDs (more than --max-inflight) whose third-party IPAM sleeps for a day, each shim
    killed once the agent runs its IPAM (as the runtime's timeout kills the plugin process): the agent
    kills each IPAM with its process group (its sleeping child too), reaps it, undoes the ADD and frees
    the call's slot, so that a normal call is served by the agent afterwards, and nothing is left."""
    until(lambda: "up to 128 requests at once" in agent.log.read_text(), "the agent serving, at most 128")
    bindir, marks = day_ipam(tmp_path)
    cfg = {"cniVersion": "1.0.0", "name": "day", "type": "macvlan", "master": topo.uplink, "dad": "off",
           "ipam": {"type": "dayipam"}}
    pod = topo.pod()
    env = {"PYCNI_AGENT_FIFO": str(agent.fifo), **PATIENT}
    before, idle = process_state(agent.pid), threads(agent.pid)
    shims: list[subprocess.Popen[bytes]] = []
    try:
        for wave in range(2):
            batch = [topo.start("macvlan", "ADD", cfg, netns=pod, container_id=f"day{wave}-{i}",
                                ifname=f"day{i}", path=bindir, env=env) for i in range(WAVE)]
            shims += batch
            try:
                started(marks, (wave + 1) * WAVE)
            finally:
                for shim in batch:  # the runtime's timeout: the plugin process alone is killed
                    shim.kill()
            for shim in batch:  # a runtime reads its output to end of file: the agent lets go of it
                shim.communicate(timeout=60)
            assert {ppid for _, ppid, _ in days(marks)} == {str(agent.pid)}  # all exec'd by the agent
            until(lambda: not any(running(pid) for line in days(marks) for pid in (line[0], line[2])),
                  lambda: "the killed shims' IPAMs and their children gone; running: "
                          f"{[p for line in days(marks) for p in (line[0], line[2]) if running(p)]}", 60)
            settled(agent.pid, idle)  # the requests ended, their slots free
    finally:
        for _, _, sleeper in days(marks):
            kill_sleeper(sleeper)  # if the agent left it: then its IPAM ends too
        for shim in shims:
            for pipe in (shim.stdout, shim.stderr):
                if pipe is not None:
                    pipe.close()
            shim.wait()
    assert [link["ifname"] for link in topo.links(pod)] == ["lo"]  # each ADD undone
    assert agent.served("macvlan") == []
    assert len([x for x in agent.log.read_text().splitlines() if "the caller went away" in x]) == 2 * WAVE
    host_local = {"type": "host-local", "dataDir": str(tmp_path / "hl"), "subnet": "198.51.100.0/24"}
    normal = {**cfg, "ipam": host_local}
    add = topo.run("macvlan", "ADD", normal, netns=pod, path="/usr/lib/cni", env=env)
    assert add.ok, add
    assert len(agent.served("served macvlan ADD rc=0")) == 1  # by the agent: it is not busy
    assert topo.run("macvlan", "DEL", normal, netns=pod, path="/usr/lib/cni", env=env).ok
    settled(agent.pid, idle)
    assert process_state(agent.pid) == before


def test_an_exec_d_ipam_is_killed_at_the_agents_ipam_timeout(topo: Topology, tmp_path: Path) -> None:
    """The documented limit (--ipam-timeout) for a caller still waiting (a runtime without a timeout of
    its own): the IPAM killed with its child, the ADD undone, code 11 answered to the shim."""
    agent = Agent(tmp_path / "run" / "agent.fifo", tmp_path / "agent.log", "--ipam-timeout=2").start()
    bindir, marks = day_ipam(tmp_path)
    cfg = {"cniVersion": "1.0.0", "name": "day", "type": "macvlan", "master": topo.uplink, "dad": "off",
           "ipam": {"type": "dayipam"}}
    pod = topo.pod()
    try:
        add = topo.run("macvlan", "ADD", cfg, netns=pod, path=bindir,
                       env={"PYCNI_AGENT_FIFO": str(agent.fifo), **PATIENT})
        until(lambda: not any(running(pid) for line in days(marks) for pid in (line[0], line[2])),
              "the IPAM and its child gone")
    finally:
        for _, _, sleeper in days(marks):
            kill_sleeper(sleeper)
        agent.stop()
    assert add.rc == 1 and add.out["code"] == 11, add
    assert add.out["msg"] == "dayipam killed: no answer within 2 s", add
    assert len(agent.served("served macvlan ADD rc=1")) == 1
    assert [link["ifname"] for link in topo.links(pod)] == ["lo"]


def test_stopped_agent_finishes_the_request_in_flight_then_calls_run_in_process(
    topo: Topology, agent: Agent, tmp_path: Path
) -> None:
    cfg = conf(topo, tmp_path)
    pods = [topo.pod("a"), topo.pod("b")]
    slow_bindir, marks = slow_ipam(tmp_path)
    slow = {**cfg, "ipam": {"type": "slowipam"}}
    env = {"PYCNI_AGENT_FIFO": str(agent.fifo)}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(topo.run, "macvlan", "ADD", slow, netns=pods[0], path=slow_bindir, env=env)
        pids = wait_for(marks)
        agent.signal(signal.SIGTERM)
        until(lambda: not agent.fifo.exists(), "the FIFO removed")  # stopping: new calls go in-process
        during = run(topo, agent, "ADD", cfg, pods[1], 1, tmp_path)
        assert during.ok, during
        kill_sleeper(pids[0])  # the in-flight request ends (its IPAM failed)...
        first = pending.result(timeout=60)
    assert first.rc == 1 and first.out["code"] != 11, first  # ...and its answer still reached the shim
    assert agent.proc is not None and agent.proc.wait(60) == 0
    assert len(agent.served("served macvlan ADD")) == 1  # only the in-flight one; `during` ran in-process
    assert topo.addrs(pods[1], "net1") == [during.out["ips"][0]["address"]]
    assert run(topo, agent, "DEL", cfg, pods[1], 1, tmp_path).ok
    assert allocations(tmp_path) == []


def test_a_stopped_agent_leaves_every_call_to_the_in_process_path(
    topo: Topology, agent: Agent, tmp_path: Path
) -> None:
    """Issue 28: an agent frozen (SIGSTOP) while idle still has its FIFO open, and the FIFO still takes
    request lines. ADD and DEL (macvlan with our whereabouts, local store) run in-process,
    and each call's output ends when its plugin process does (a runtime reads it to end of file). The
    shims are PATIENT (120 s for READY): they must see that the agent is stopped, not wait for it."""
    cfg = conf(topo, tmp_path)
    pod = topo.pod()
    pool = ThreadPoolExecutor(1)
    agent.signal(signal.SIGSTOP)
    try:
        until(lambda: procs.stopped(agent.pid), "the agent stopped (SIGSTOP)")
        add = pool.submit(run, topo, agent, "ADD", cfg, pod, 0, tmp_path).result(timeout=60)
        assert add.ok, add
        assert topo.addrs(pod, "net1") == [add.out["ips"][0]["address"]]
        assert allocations(tmp_path) == ["c0"]
        gone = pool.submit(run, topo, agent, "DEL", cfg, pod, 0, tmp_path).result(timeout=60)
        assert gone.ok, gone
    finally:
        agent.signal(signal.SIGCONT)
        pool.shutdown()
    assert agent.served("macvlan") == []
    assert allocations(tmp_path) == [] and topo.link(pod, "net1") is None


def test_restarted_agent_serves_again(topo: Topology, agent: Agent, tmp_path: Path) -> None:
    cfg = conf(topo, tmp_path)
    pod = topo.pod()
    agent.signal(signal.SIGKILL)  # a stale FIFO nobody reads: the open fails, the call runs in-process
    agent.proc.wait()  # type: ignore[union-attr]
    add = run(topo, agent, "ADD", cfg, pod, 0, tmp_path)
    assert add.ok and agent.served("macvlan ADD") == []
    agent.start()
    assert run(topo, agent, "DEL", cfg, pod, 0, tmp_path).ok
    assert len(agent.served("served macvlan DEL rc=0")) == 1
    assert allocations(tmp_path) == [] and topo.link(pod, "net1") is None
    again = run(topo, agent, "ADD", cfg, pod, 0, tmp_path)
    assert again.ok and again.out["ips"] == add.out["ips"]  # the first free address again
    assert len(agent.served("served macvlan ADD rc=0")) == 1
    assert run(topo, agent, "DEL", cfg, pod, 0, tmp_path).ok
    assert allocations(tmp_path) == []


def test_identical_answers_with_and_without_the_agent(topo: Topology, agent: Agent, tmp_path: Path) -> None:
    """Results and error objects, byte for byte (the MAC is fixed so the results can be compared)."""
    cfg = conf(topo, tmp_path, mac="02:00:00:00:00:42")
    pod = topo.pod()
    bad = {**cfg, "mtu": "big"}
    outs = []
    for fifo in (str(agent.fifo), str(tmp_path / "none.fifo")):
        env = {"PYCNI_AGENT_FIFO": fifo, **PATIENT}
        add = topo.run("macvlan", "ADD", cfg, netns=pod, container_id="same", path=cni_path(tmp_path),
                       cni_args=ARGS.format(pod="same"), env=env)
        err = topo.run("macvlan", "ADD", bad, netns=pod, path=cni_path(tmp_path), env=env)
        gone = topo.run("macvlan", "ADD", cfg, netns="/run/netns/nonexistent-pycni", path=cni_path(tmp_path),
                        env=env)
        assert add.ok, add
        outs.append((add, err, gone))
        assert topo.run("macvlan", "DEL", cfg, netns=pod, container_id="same", path=cni_path(tmp_path),
                        env=env).ok
    (a1, e1, g1), (a2, e2, g2) = outs
    assert a1.out == a2.out
    assert (e1.rc, e1.out) == (e2.rc, e2.out) and e1.out["code"] == 7
    assert (g1.rc, g1.out) == (g2.rc, g2.out) and g1.out["code"] == 3
    assert len(agent.served("macvlan ADD")) == 3


def test_fifo_is_root_only_and_the_agent_refuses_non_root_callers() -> None:
    where = Path(tempfile.mkdtemp(prefix="pycni-agent-"))  # under /tmp: every parent is searchable
    where.chmod(0o755)
    agent = Agent(where / "run" / "agent.fifo", where / "agent.log").start()
    try:
        peers(agent)
    finally:
        agent.stop()
        shutil.rmtree(where)


def peers(agent: Agent) -> None:
    assert os.stat(agent.fifo).st_mode & 0o777 == 0o600
    assert os.stat(agent.fifo.parent).st_mode & 0o777 == 0o700
    # the file modes alone keep others out
    assert child_as_nobody(agent.fifo) == f"agent FIFO {agent.fifo}: Permission denied"
    os.chmod(agent.fifo.parent, 0o755)  # loosen them: the agent itself must still refuse
    os.chmod(agent.fifo, 0o666)
    assert child_as_nobody(agent.fifo) == "agent refused: only root may use the agent"
    assert "refused a caller with uid 65534" in agent.log.read_text()
    assert agent.served() == []


def child_as_nobody(fifo: Path) -> str:
    """Offer a request as uid 65534 in a forked child; what happened, as text."""
    r, w = os.pipe()
    with warnings.catch_warnings():  # the child only offers a request: no lock of another thread
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, _try_request(fifo).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        text = fh.read().decode()
    os.waitpid(pid, 0)
    return text


def _try_request(fifo: Path) -> str:
    """Offer a request as the shim does (as patient as PATIENT: the agent's word, not a timeout, is
    what this reports), and say what came of it."""
    os.environ.update(PATIENT)  # a forked child's own environment
    try:
        return f"answered {client.exchange(str(fifo), 'macvlan', 'x', '', b'{}')}"
    except client.Unreachable as e:
        return str(e)


def test_a_pod_namespace_the_agent_cannot_see_by_path_is_served_through_the_callers_descriptor(
        topo: Topology, agent: Agent, tmp_path: Path) -> None:
    """A node whose "/" is private does not propagate the runtime's netns mounts into the agent's
    container (the DaemonSet asks for no mount propagation). Here CNI_NETNS exists only in the caller's
    own mount namespace (a private tmpfs holding a bind mount of the pod namespace): the agent, in the
    test's mount namespace, cannot open that path, yet serves ADD and DEL, through the descriptor the
    shim opened (cni.netns.GIVEN). The plugin's view (the result's sandbox) is the path, unchanged."""
    from tests.nsutil import plugin_command

    cfg = conf(topo, tmp_path)
    pod = topo.pod("hidden")
    hidden = tmp_path / "private-mounts"
    hidden.mkdir()
    path = str(hidden / "pod")
    enter = ('mount -t tmpfs tmpfs "$0" && touch "$0/pod" && mount --bind "$1" "$0/pod" && shift '
             '&& exec "$@"')

    def call(command: str) -> tuple[int, dict[str, Any] | None, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        env.update(CNI_COMMAND=command, CNI_CONTAINERID="hidden", CNI_NETNS=path, CNI_IFNAME="net1",
                   CNI_PATH=cni_path(tmp_path), CNI_ARGS=ARGS.format(pod="hidden"),
                   PYCNI_AGENT_FIFO=str(agent.fifo), PYTHONPATH=str(Path(__file__).parents[2]), **PATIENT)
        cmd = ["ip", "netns", "exec", topo.host, "unshare", "--mount", "--propagation", "private",
               "sh", "-c", enter, str(hidden), pod, *plugin_command("macvlan")]
        proc = subprocess.run(cmd, input=json.dumps(cfg).encode(), env=env, capture_output=True, check=False,
                              cwd=str(Path(__file__).parents[2]))
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
        return proc.returncode, out, proc.stderr.decode(errors="replace")

    rc, out, err = call("ADD")
    assert not os.path.exists(path)  # not in the agent's (this test's) mount namespace
    assert rc == 0, (out, err)
    assert out is not None and out["interfaces"][-1]["sandbox"] == path
    assert topo.addrs(pod, "net1") == [out["ips"][0]["address"]]
    assert len(agent.served("served macvlan ADD rc=0")) == 1  # by the agent, not in-process
    rc, out, err = call("DEL")
    assert rc == 0, (out, err)
    assert len(agent.served("served macvlan DEL rc=0")) == 1
    assert topo.link(pod, "net1") is None and allocations(tmp_path) == []
