"""The agent's Prometheus endpoint, scraped after real calls: macvlan with our IPAM (local store) ADD,
CHECK and DEL into a real namespace through the agent, and an ADD it refuses with code 7. From source
the IPAM is exec'd and its shim is served by the same agent; in the frozen pass it runs inside the
agent's macvlan call: either way the IPAM's calls are timed there (and the frozen agent must carry
prometheus_client)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agentutil import Agent
from tests.integration.test_agent import PATIENT, cni_path, conf
from tests.nsutil import Call, Topology

ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=metrics;K8S_POD_NAME=p0;K8S_POD_UID=uid-p0"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path / "run" / "agent.fifo", tmp_path / "agent.log").start()
    yield a
    a.stop()


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def get(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_scraped_after_calls_through_the_agent(topo: Topology, agent: Agent, tmp_path: Path) -> None:
    cfg = conf(topo, tmp_path)
    pod = topo.pod("m0")

    def run(command: str, c: dict[str, object]) -> Call:
        return topo.run("macvlan", command, c, netns=pod, container_id="c0", path=cni_path(tmp_path),
                        cni_args=ARGS, env={"PYCNI_AGENT_FIFO": str(agent.fifo), **PATIENT})

    add = run("ADD", cfg)
    assert add.ok, add
    calls = [run("CHECK", {**cfg, "prevResult": add.out}), run("DEL", cfg),
             run("ADD", {**cfg, "mode": "bogus"})]
    assert [c.rc for c in calls] == [0, 0, 1], calls
    assert len(agent.served("served macvlan")) == 4  # all four through the agent

    got = scrape(agent.metrics_url())
    attach = "pycni_attach_duration_seconds_count"
    assert get(got, attach, plugin="macvlan", command="ADD") == 2
    assert get(got, attach, plugin="macvlan", command="CHECK") == 1
    assert get(got, attach, plugin="macvlan", command="DEL") == 1
    assert get(got, "pycni_attach_errors_total", plugin="macvlan", command="ADD", code="7") == 1
    assert sum(v for (n, _), v in got.items() if n == "pycni_attach_errors_total") == 1
    for command in ("ADD", "CHECK", "DEL"):  # the IPAM's own calls, on the local store
        assert get(got, "pycni_ipam_duration_seconds_count", store="local", command=command) == 1, command
    assert not [k for k in got if k[0] == "pycni_ipam_errors_total"]
    assert get(got, "pycni_agent_inflight_requests") == 0
    assert not [k for k in got if k[0] == "pycni_ipam_unwritten_calls"]  # every call answered after its write
    assert [k for k in got if k[0] == "pycni_build_info"], "build info"
    assert get(got, "process_open_fds") > 0
