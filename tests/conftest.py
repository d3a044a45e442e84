"""Shared fixtures: root gating, per-test topologies, a session-end leak check."""

from __future__ import annotations

import glob
import os
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cni.agent.client import FIFO_ENV
from tests import agentutil, kubeup, logtee, nsutil, skips
from tests.kubeapi import record

# Property tests everywhere: the same cases on every run (a failure reproduces), and no per-example
# wall-clock deadline (a loaded 2-core CI machine made one example of a 0.03 ms test take 300 ms and
# fail). tests/hardening loads its own profiles on top, for the whole session once it is collected: its
# "ci" profile's 150 examples are this one's too, so a property test runs the same cases alone as in the
# suite (test_decide failed only in the suite, at its 150 examples).
settings.register_profile("pycni", deadline=None, derandomize=True, database=None, max_examples=150,
                          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
settings.load_profile("pycni")

ROOT_REASON = f"{skips.ROOT}creates network namespaces and links"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=ROOT_REASON)
    for item in items:
        parts = item.path.parts
        if "integration" in parts:
            item.add_marker(pytest.mark.root)
        if "e2e" in parts:
            item.add_marker(pytest.mark.root)
            item.add_marker(pytest.mark.e2e)
        if "cluster" in parts:
            item.add_marker(pytest.mark.root)
            item.add_marker(pytest.mark.cluster)
        if not nsutil.is_root() and "root" in item.keywords:
            item.add_marker(skip)
    if os.environ.get("PYCNI_PLUGIN_DIR"):
        frozen_selection(config, items)
    # test_rbac.py checks the requests the other Kubernetes tests sent during this session: it runs last
    last = [i for i in items if i.name == RBAC_CODE_CHECK and i.path.name == "test_rbac.py"]
    items[:] = [i for i in items if i not in last] + last


# The frozen passes (PYCNI_PLUGIN_DIR) run what a build can break: every plugin and tool call through the
# frozen entries. They leave out what only re-runs the same Python (the source pass runs all of it):
# - IN_PROCESS: tests that never start a plugin (they call cni.* in the test process, from source);
# - the cniVersion matrices of NEWEST_VERSION_ONLY: each scenario there runs at the newest version its
#   test takes (the version only changes which Python branch formats the result or refuses the command);
#   each version's own path through the frozen entries stays in EVERY_VERSION (macvlan's round trip per
#   version) and in the host-device and sriov per-version tests, which are not listed here.
IN_PROCESS = ("tests/integration/test_ifconfig_announce.py", "tests/integration/test_vf_netlink.py",
              "tests/integration/test_rail_apply.py", "tests/integration/test_sigterm_teardown.py")
# - the cluster suite: it always installs the image of the frozen bundle, so it runs once, in the source
#   pass (make test's frozen passes do not even collect it; this is for a frozen `pytest tests`)
SOURCE_PASS_ONLY = ("tests/cluster/",)
NEWEST_VERSION_ONLY = (
    "tests/integration/macvlan/",
    "tests/e2e/test_reference_parity.py",
    "tests/e2e/test_beyond_reference.py",
    "tests/e2e/test_failure_parity.py",
    "tests/e2e/test_announce.py",
)
EVERY_VERSION = ("tests/integration/macvlan/test_roundtrip.py",)
# - tests that run no frozen entry whatever PYCNI_PLUGIN_DIR says: Debian's Go chain alone, or pycni
#   from source through wrappers (tests/ipamutil.py write_wrappers) under libcni
NO_FROZEN_ENTRY = (
    "tests/e2e/test_rail_reference.py::test_reference_chain_and_rail_agree[go-macvlan+tuning+sbr-",
    "tests/e2e/test_whereabouts.py::test_under_macvlan_through_libcni[",
)
# The agent pass (PYCNI_TEST_AGENT=1) runs what goes through the session's agent. It leaves to the frozen
# pass, which runs them exactly as it would, the tests none of whose plugin calls can reach that agent:
NO_SESSION_AGENT = (
    # the bundle itself: VERSION calls in a bare environment, PYCNI_AGENT=off, an agent of its own
    "tests/e2e/test_frozen_bundle.py",
    # the image: its own agent container (built and run once)
    "tests/e2e/test_image.py",
    # each test runs its own agent on its own FIFO (the frozen pycni-agent in both frozen passes)
    "tests/integration/test_agent.py",
    "tests/integration/test_agent_metrics.py",
    # tests/devlab.py calls with PYCNI_AGENT=off: the lab's sysfs root is a process setting the
    # session's agent does not have (tests/e2e/test_multus.py runs host-device through an agent)
    "tests/integration/test_hostdevice.py",
    "tests/integration/test_sriov.py",
    "tests/integration/test_device_channels.py",
    "tests/integration/test_rail_devices.py",
)
# In make test (tests/passes.py) the agent pass follows the frozen pass (PYCNI_TEST_AGENT_PASS_FOLLOWS): the
# frozen pass then leaves to it the tests it runs (the same frozen entries, their plugin code run by the
# frozen agent), and keeps the ones it leaves (NO_SESSION_AGENT: the frozen entries without an agent, the
# device lab's in-process calls, the bundle's own tests) and FROZEN_IN_PROCESS: the frozen plugins' own
# in-process path (the shim finding no agent, the frozen IPAM exec'd by the frozen plugin), every
# cniVersion.
AGENT_PASS_FOLLOWS = "PYCNI_TEST_AGENT_PASS_FOLLOWS"
FROZEN_IN_PROCESS = EVERY_VERSION
_LEFT_TO_THE_SOURCE_PASS: list[int] = []
_LEFT_TO_THE_FROZEN_PASS: list[int] = []
_LEFT_TO_THE_AGENT_PASS: list[int] = []


def frozen_selection(config: pytest.Config, items: list[pytest.Item]) -> None:
    from cni import spec

    def rank(version: str) -> int:
        return spec.SUPPORTED.index(version) if version in spec.SUPPORTED else -1

    def matrix(item: pytest.Item) -> tuple[tuple[str, str], str] | None:
        """(the test and its other parameters, its cniVersion) for a matrix item, else None."""
        path = item.nodeid.split("::")[0]
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "version" not in params or not path.startswith(NEWEST_VERSION_ONLY) or path in EVERY_VERSION:
            return None
        others = ",".join(f"{k}={v}" for k, v in sorted(params.items()) if k != "version")
        return (item.nodeid.split("[")[0], others), str(params["version"])

    newest: dict[tuple[str, str], str] = {}
    for item in items:
        m = matrix(item)
        if m is not None and (m[0] not in newest or rank(m[1]) > rank(newest[m[0]])):
            newest[m[0]] = m[1]

    def kept(item: pytest.Item) -> bool:
        if item.nodeid.split("::")[0] in IN_PROCESS or item.nodeid.startswith((*SOURCE_PASS_ONLY,
                                                                                 *NO_FROZEN_ENTRY)):
            return False
        m = matrix(item)
        return m is None or newest[m[0]] == m[1]

    left = [i for i in items if not kept(i)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [i for i in items if kept(i)]
        _LEFT_TO_THE_SOURCE_PASS.append(len(left))
    if agentutil.agent_up():
        no_agent = [i for i in items if i.nodeid.split("::")[0] in NO_SESSION_AGENT]
        if no_agent:
            config.hook.pytest_deselected(items=no_agent)
            items[:] = [i for i in items if i.nodeid.split("::")[0] not in NO_SESSION_AGENT]
            _LEFT_TO_THE_FROZEN_PASS.append(len(no_agent))
    elif os.environ.get(AGENT_PASS_FOLLOWS):
        def frozen_only(item: pytest.Item) -> bool:
            path = item.nodeid.split("::")[0]
            return path in NO_SESSION_AGENT or path.startswith(FROZEN_IN_PROCESS)

        to_agent = [i for i in items if not frozen_only(i)]
        if to_agent:
            config.hook.pytest_deselected(items=to_agent)
            items[:] = [i for i in items if frozen_only(i)]
            _LEFT_TO_THE_AGENT_PASS.append(len(to_agent))


RBAC_CODE_CHECK = "test_the_code_sends_exactly_what_rbac_declares_and_the_manifests_grant"


def pytest_configure(config: pytest.Config) -> None:
    """Every request the code sends through the Kubernetes client is recorded per test for test_rbac.py
    (tests/kubeapi/record.py; its own child run, PYCNI_KUBEAPI_RECORD, records into a file instead).
    SIGTERM (a CI timeout, `kill`, `timeout`) interrupts the run as Ctrl-C does: pytest then tears down
    the fixtures set up (namespaces, links, servers) instead of dying with them in place. A skip whose
    reason tests/skips.py does not allow here fails the session."""
    if not config.pluginmanager.is_registered(skips):
        config.pluginmanager.register(skips, "tests.skips")
    if not os.environ.get(record.RECORD_ENV):
        record.SESSION.install()
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    with record.SESSION.during(item.nodeid):
        return (yield)


@pytest.fixture
def topo() -> Iterator[nsutil.Topology]:
    t = nsutil.Topology()
    try:
        yield t
    finally:
        t.close()


SECRET_MARK = "PYCNI-SECRET-"  # every secret a test uses (token, etcd password) contains this


@pytest.fixture(scope="session", autouse=True)
def _no_secrets_in_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every line pycni logs during the session, in this process and in every process it starts from
    source (they inherit PYCNI_TEST_LOG and PYTHONPATH: tests/logtee.py), at every level, is grepped
    for secrets."""
    collected = tmp_path_factory.mktemp("logs") / "all.log"
    os.environ[logtee.ENV] = str(collected)
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = logtee.PYTHONPATH + (os.pathsep + inherited if inherited else "")
    logtee.install(str(collected))
    yield
    lines = collected.read_bytes().decode(errors="replace").splitlines() if collected.exists() else []
    leaked = [line for line in lines if SECRET_MARK in line]
    print(f"\nsecret grep: {len(lines)} log lines, {len(leaked)} with {SECRET_MARK}")
    assert not leaked, f"secrets in the logs: {leaked[:5]}"


@pytest.fixture(scope="session", autouse=True)
def _no_leftovers() -> Iterator[None]:
    yield
    if nsutil.is_root() and os.environ.get("PYCNI_KEEP_NETNS") != "1":
        left = nsutil.leftovers()
        nsutil.cleanup_run()
        assert not left, f"tests left behind namespaces/links: {left}"


def default_paths(root: str = "/") -> set[str]:
    """The product's default state paths on a node that exist now: the local store (with its -wal, -shm
    and journal), the cluster stores' pool locks and etcd token cache beside it (and anything else
    directly in /var/lib/cni/pycni), the device plugins' state dir (attachments, owners, locks), the
    agent's default FIFO dir, the flat file dirs. Tests inject their own paths; none of these may
    appear during a session. `root`: another tree (tests)."""
    from cni.agent.client import DEFAULT_FIFO
    from cni.device.statedir import DEFAULT_DIR
    from ipam.config import DEFAULT_LOCAL_DB, FLAT_FILES

    top = os.path.dirname(DEFAULT_LOCAL_DB)
    fixed = [top, *(DEFAULT_LOCAL_DB + s for s in ("", "-wal", "-shm", "-journal")), f"{top}/pool-locks",
             DEFAULT_DIR, *(f"{DEFAULT_DIR}/{sub}" for sub in ("attachments", "owners", "locks")),
             os.path.dirname(DEFAULT_FIFO), *(os.path.dirname(f) for f in FLAT_FILES)]
    under = os.path.join(root, top.lstrip("/"))
    found = {p for p in fixed if os.path.lexists(os.path.join(root, p.lstrip("/")))}
    # and whatever else is directly in it (etcd-token-*, a conf-example's own local_db there, ...)
    return found | {os.path.join(top, os.path.basename(p)) for p in glob.glob(f"{glob.escape(under)}/*")}


@pytest.fixture(scope="session", autouse=True)
def _no_default_paths() -> Iterator[None]:
    """Fails the session when a default path appeared that was absent at its start (nothing is removed:
    on a real node it could be the node's own state)."""
    before = default_paths()
    yield
    appeared = sorted(default_paths() - before)
    assert not appeared, f"tests wrote to the product's default paths (remove them by hand): {appeared}"


_SERVED: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def _agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """PYCNI_TEST_AGENT=1 (root): one agent for the session, and every plugin call goes through it; it
    must have served requests by the end. Otherwise the shims look for a FIFO that does not exist
    (never a node's real agent), so every call runs in-process after a failed open."""
    where = tmp_path_factory.mktemp("agent")
    os.environ[FIFO_ENV] = str(where / "agent.fifo")
    if not (agentutil.agent_up() and nsutil.is_root()):
        yield
        return
    agent = agentutil.Supervised(where / "agent.fifo", where / "agent.log").start()
    yield
    agent.stop()
    _SERVED.extend(agent.served())
    assert _SERVED, f"PYCNI_TEST_AGENT=1 but the agent served no request (log: {agent.log})"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LEFT_TO_THE_SOURCE_PASS:
        terminalreporter.write_line(
            f"frozen pass: {_LEFT_TO_THE_SOURCE_PASS[0]} tests left to the source pass (deselected: they run"
            " no frozen entry, or repeat a scenario at an older cniVersion; tests/conftest.py)"
        )
    if _LEFT_TO_THE_FROZEN_PASS:
        terminalreporter.write_line(
            f"agent pass: {_LEFT_TO_THE_FROZEN_PASS[0]} tests left to the frozen pass (deselected: none of"
            " their plugin calls can reach the session's agent; tests/conftest.py NO_SESSION_AGENT)"
        )
    if _LEFT_TO_THE_AGENT_PASS:
        terminalreporter.write_line(
            f"frozen pass: {_LEFT_TO_THE_AGENT_PASS[0]} tests left to the agent pass after it (deselected:"
            f" it runs them through the frozen entries; {AGENT_PASS_FOLLOWS}, tests/conftest.py)"
        )
    if _SERVED:
        terminalreporter.write_line(f"pycni agent: served {len(_SERVED)} requests")


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubeup.KubeServer]:
    """One real kube-apiserver (../shared/upstream/kube-up) for the whole session; skipped, saying why,
    only when ../shared/upstream (or etcd/kubectl) is absent."""
    reason = kubeup.absent()
    if reason:
        pytest.skip(reason)
    server = kubeup.KubeServer.start(tmp_path_factory.mktemp("kube-up"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tenant(kube: kubeup.KubeServer, tmp_path: Path) -> kubeup.Tenant:
    """A fresh namespace on the real server with rbac.yaml applied as shipped and tokenFile kubeconfigs
    for the node and the reconciler ServiceAccounts."""
    return kubeup.Tenant(kube, tmp_path / "kube")
