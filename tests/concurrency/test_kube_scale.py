"""The pod-scale workload of `make bench-ipam-scale` (tests/bench/ipam_scale.py), small, on the real
kube-apiserver: 16 pods x 4 networks on 4 simulated nodes, 2 pods at once per node, every network on
one shared range (one IPPool), each attachment its own plugin process; then the DELs. pycni standalone
(from source, or the frozen entry when PYCNI_PLUGIN_DIR is set) and through one agent per node. The
same workload on node slices (`node_slice_size`, mode `slices`), standalone, the plugin assigning each
node its slice on the node's first ADD (no controller: four nodes race for the first slices).

Fails when any call fails, any address is held or returned twice, pool entries and reservations
disagree (or differ from what the calls returned) after ADD, anything remains after DEL, or a default
path (/var/lib/cni/pycni, /etc/cni/net.d/whereabouts.d, ...) appeared."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests import kubeup
from tests.bench.ipam_scale import DEFAULT_PATHS, Pycni, Workload, run_workload, slice_assignments
from tests.nsutil import is_root
from tests.skips import ROOT

WORKLOAD = Workload(pods=16, networks=4, nodes=4, concurrency=2, mode="shared", budget=300.0,
                    call_timeout=120.0)
SLICES = replace(WORKLOAD, mode="slices", slice_controller=False)


@pytest.mark.parametrize("agents", [False, True], ids=["standalone", "agents"])
def test_pods_on_shared_range(kube: kubeup.KubeServer, tenant: kubeup.Tenant, tmp_path: Path,
                              agents: bool) -> None:
    if agents and not is_root():
        pytest.skip(f"{ROOT}the agent serves root only")
    plugin_dir = os.environ.get("PYCNI_PLUGIN_DIR")
    present = {p for p in DEFAULT_PATHS if os.path.lexists(p)}
    impl = Pycni(Path(plugin_dir) if plugin_dir else None, WORKLOAD.nodes if agents else 0, tmp_path)
    try:
        add, delete = run_workload(impl, WORKLOAD, tenant, tmp_path / "run", prefix="c")
    finally:
        impl.close()
    for phase in (add, delete):
        assert phase.failures == 0, f"{phase.phase}: {phase.failure_messages}"
        assert phase.attempted == phase.attachments == WORKLOAD.attachments, phase
        assert phase.done == WORKLOAD.attachments
        assert phase.problems == [], f"{phase.phase}: {phase.problems[:20]}"
        if agents:  # a busy agent may leave a call to the shim; but the agents did serve this phase
            assert phase.agent_served, f"{phase.phase}: the agents served no call"
    if agents:  # an agent's DEL deletes the reservation its ADD made without reading it first (a call
        # the shim ran in-process instead has no such memory: some slack for those)
        reads = delete.api_split.get("GET overlappingrangeipreservations", 0.0)
        assert reads <= 0.5 * WORKLOAD.attachments, delete.api_split
    assert not {p for p in DEFAULT_PATHS if os.path.lexists(p)} - present


def test_pods_on_node_slices(kube: kubeup.KubeServer, tenant: kubeup.Tenant, tmp_path: Path) -> None:
    plugin_dir = os.environ.get("PYCNI_PLUGIN_DIR")
    present = {p for p in DEFAULT_PATHS if os.path.lexists(p)}
    impl = Pycni(Path(plugin_dir) if plugin_dir else None, 0, tmp_path)
    add, delete = run_workload(impl, SLICES, tenant, tmp_path / "run", prefix="d")
    for phase in (add, delete):
        assert phase.failures == 0, f"{phase.phase}: {phase.failure_messages}"
        assert phase.attempted == phase.attachments == phase.done == SLICES.attachments, phase
        assert phase.problems == [], f"{phase.phase}: {phase.problems[:20]}"
    assert sorted(slice_assignments(tenant)) == [f"node-{k}" for k in range(SLICES.nodes)]
    assert not {p for p in DEFAULT_PATHS if os.path.lexists(p)} - present
