"""`make bench-ipam-scale --layouts` (tests/bench/ipam_layouts.py, issue 44 item 2): the layouts, the
workload size per layout, and the summaries and guard verdicts computed from synthetic per-run results,
so that a verdict cannot silently be wrong (a median taken over the wrong runs, a ratio against another
run's upstream, a 504 or a leftover that does not flag its phase)."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from tests.bench import ipam_layouts as lay
from tests.bench.ipam_layouts import DUPLICATE, NOT_DELETED, Layout
from tests.bench.ipam_scale import (
    SHARED_RANGE,
    SLICE_SIZE,
    SLICES_RANGE,
    Impl,
    Measured,
    PhaseReport,
    Workload,
    answers_504,
    report,
)

AGENT, PLAIN, UP = "pycni+agent", "pycni", "upstream"


def phase(impl: str, layout: str, ph: str, run: int, wall: float, cpu: float = 10.0, atts: int = 512,
          **kw: Any) -> PhaseReport:  # fmt: skip
    """One phase of one run as the harness reports it: `atts` attachments in `wall` s, `cpu` API server
    CPU s; every call done and successful unless kw says otherwise."""
    failures = kw.pop("failures", 0)
    attempted = kw.pop("attempted", atts)
    done = attempted - failures
    return PhaseReport(impl, kw.pop("mode", "shared"), ph, atts, done, attempted, wall, done / wall,
                       0.0, 0.0, 0.0, 0.0, 0.0, kw.pop("api", 2.0), kw.pop("api_409", 0.0), 0.0, 0.0, {},
                       cpu, failures, {}, None, run=run, layout=layout, **kw)  # fmt: skip


def runs(layout: str, walls: dict[str, list[float]], cpus: dict[str, list[float]] | None = None,
         **kw: Any) -> list[PhaseReport]:
    """ADD and DEL of every implementation in every run: walls[impl][run] (the same for both phases)."""
    out = []
    for run in range(len(walls[UP])):
        for impl, ws in walls.items():
            for ph in lay.PHASES:
                cpu = (cpus or {}).get(impl, [10.0] * len(ws))[run]
                out.append(phase(impl, layout, ph, run, ws[run], cpu, left=0 if ph == "DEL" else None, **kw))
    return out


def index(reports: list[PhaseReport], impl: str, layout: str, ph: str, run: int = 0) -> int:
    want = (impl, layout, ph, run)
    return next(i for i, r in enumerate(reports) if (r.impl, r.layout, r.phase, r.run) == want)


def judged(reports: list[PhaseReport], layouts: list[str]) -> dict[tuple[str, str, str, str], lay.Verdict]:
    vs = lay.verdicts(lay.rows(reports), layouts)
    return {(v.guard, v.layout, v.impl, v.phase): v for v in vs}


# ---- layouts and their workloads ---------------------------------------------------------------


def test_layouts_parse_in_order() -> None:
    assert lay.parse_layouts("8x4,32x1, 64X1") == [Layout(8, 4), Layout(32, 1), Layout(64, 1)]
    assert [x.label for x in lay.parse_layouts("8x4,32x1")] == ["8x4", "32x1"]
    assert Layout(8, 4).in_flight == Layout(32, 1).in_flight == 32


@pytest.mark.parametrize("text", ["8", "8x", "x4", "0x4", "8x0", "8x4x2", "eightx4", "8x4,,32x1", "-8x4"])
def test_a_bad_layout_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="not NODESxPODS"):
        lay.parse_layouts(text)


def test_a_layout_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="8x4 given twice"):
        lay.parse_layouts("8x4,32x1,8x4")


def test_every_worker_runs_the_same_pods_unless_pods_are_fixed() -> None:
    layouts = lay.parse_layouts("8x4,32x1,64x1")
    assert [lay.pods_for(x, None) for x in layouts] == [64, 64, 128]  # 2 pods per worker
    assert [lay.pods_for(x, None, per_slot=1) for x in layouts] == [32, 32, 64]
    assert [lay.pods_for(x, 64) for x in layouts] == [64, 64, 64]


def test_slices_stay_the_harness_size_until_the_nodes_need_more() -> None:
    assert SLICES_RANGE == "198.18.64.0/18" and SLICE_SIZE == "/23"  # 32 slices of 510 addresses
    assert lay.slice_size(SLICES_RANGE, SLICE_SIZE, 8, 64) == "/23"
    assert lay.slice_size(SLICES_RANGE, SLICE_SIZE, 32, 16) == "/23"
    assert lay.slice_size(SLICES_RANGE, SLICE_SIZE, 33, 16) == "/24"  # 64 slices of 254
    assert lay.slice_size(SLICES_RANGE, SLICE_SIZE, 64, 16) == "/24"
    assert lay.slice_size(SLICES_RANGE, SLICE_SIZE, 64, 254) == "/24"
    assert lay.slice_size(SLICES_RANGE, SLICE_SIZE, 64, 255) == ""  # a /24 holds 254
    assert lay.slice_size(SLICES_RANGE, SLICE_SIZE, 8, 511) == ""


def test_the_ranges_hold_the_layouts_workloads() -> None:
    for layout in lay.parse_layouts("8x4,32x1,64x1"):
        wl = Workload(lay.pods_for(layout, None), 8, layout.nodes, layout.concurrency)
        size = lay.slice_size(SLICES_RANGE, SLICE_SIZE, 64, 16)
        for mode in ("shared", "per-network", "slices"):
            assert Workload(wl.pods, 8, wl.nodes, wl.concurrency, mode, slice_size=size).unfit() == ""
    assert "254 pods" in Workload(255, 8, 64, 1, "per-network").unfit()
    assert SHARED_RANGE in Workload(600, 8, 8, 4, "shared").unfit()  # 4,800 attachments in a /20
    assert "32 slices" in Workload(64, 8, 64, 1, "slices").unfit()  # /23: 32 slices for 64 nodes
    assert Workload(64, 8, 64, 1, "slices", slice_size="/24").unfit() == ""


# ---- rows: medians over runs, each run against its own upstream ---------------------------------


def test_each_run_is_compared_with_its_own_runs_upstream() -> None:
    # run 2's machine was twice as slow for both: against its own upstream it is the same 4x
    reports = runs("8x4", {UP: [100.0, 200.0, 100.0], AGENT: [25.0, 50.0, 20.0]})
    row = next(r for r in lay.rows(reports) if r.impl == AGENT and r.phase == "ADD")
    assert row.speed == pytest.approx([4.0, 4.0, 5.0])
    assert row.median_speed == pytest.approx(4.0)
    assert row.wall == [25.0, 50.0, 20.0] and row.median_wall == 25.0


def test_layouts_and_modes_have_their_own_upstream() -> None:
    reports = (runs("8x4", {UP: [100.0], AGENT: [20.0]}) + runs("32x1", {UP: [60.0], AGENT: [30.0]})
               + runs("8x4", {UP: [50.0], AGENT: [25.0]}, mode="per-network"))  # fmt: skip
    speed = {(r.layout, r.mode): r.median_speed for r in lay.rows(reports) if r.impl == AGENT}
    assert speed == pytest.approx({("8x4", "shared"): 5.0, ("32x1", "shared"): 2.0,
                                   ("8x4", "per-network"): 2.0})


def test_api_cpu_is_per_attachment_against_upstreams() -> None:
    reports = [phase(UP, "32x1", "ADD", 0, 100.0, cpu=80.0, atts=512),
               phase(AGENT, "32x1", "ADD", 0, 20.0, cpu=10.0, atts=512),
               phase(AGENT, "32x1", "ADD", 1, 20.0, cpu=10.0, atts=256),  # its run has no upstream
               phase(UP, "32x1", "ADD", 1, 100.0, cpu=0.0, atts=256)]  # no CPU figure
    row = next(r for r in lay.rows(reports) if r.impl == AGENT)
    assert row.cpu == pytest.approx([0.125])  # 10/512 against 80/512
    assert row.cpu_ms == pytest.approx(statistics.median([1000 * 10 / 512, 1000 * 10 / 256]))


# ---- the guard ------------------------------------------------------------------------------------


def guard_runs(agent_84: list[float], agent_321: list[float], plain: list[float],
               agent_cpu_321: list[float] | None = None) -> list[PhaseReport]:  # fmt: skip
    """Three runs of both guard layouts; upstream 100 s and 40 CPU s in every phase, the others as
    given (seconds), so that their speed against upstream is 100 / seconds."""
    n = len(agent_84)
    up = [100.0] * n
    cpu = {UP: [40.0] * n, AGENT: agent_cpu_321 or [5.0] * n}
    return (runs("8x4", {UP: up, AGENT: agent_84, PLAIN: plain})
            + runs("32x1", {UP: up, AGENT: agent_321, PLAIN: plain}, cpu))  # fmt: skip


def test_the_guard_is_met_on_the_medians() -> None:
    # 8x4: 5.0x, 5.0x, 4.0x (median 5.0); 32x1: 3.3x median; CPU 5/40 = 0.125; standalone 1.0x
    reports = guard_runs([20.0, 20.0, 25.0], [30.0, 40.0, 30.0], [100.0, 90.0, 110.0])
    vs = lay.verdicts(lay.rows(reports), ["8x4", "32x1"])
    assert lay.guard_met(vs), lay.verdict_table(vs)
    v = judged(reports, ["8x4", "32x1"])
    assert v[("agent speed", "8x4", AGENT, "ADD")].value == "5.00x (5.00, 5.00, 4.00)"
    assert v[("agent speed", "8x4", AGENT, "DEL")].ok
    assert v[("agent API CPU", "32x1", AGENT, "ADD")].value == "0.12 (0.12, 0.12, 0.12)"
    assert v[("standalone speed", "32x1", PLAIN, "DEL")].value.startswith("1.00x")
    assert {k[0] for k in v} == {"agent speed", "agent API CPU", "standalone speed", "clean"}
    assert ("agent speed", "8x4", PLAIN, "ADD") not in v  # the agent's guard is not the plain path's
    assert ("standalone speed", "8x4", AGENT, "ADD") not in v


def test_the_median_decides_not_the_mean_nor_the_best_run() -> None:
    # 8x4 agent: 10x, 4.76x, 4.76x: mean 6.5x, best 10x, median 4.76x < 5x
    v = judged(guard_runs([10.0, 21.0, 21.0], [30.0] * 3, [100.0] * 3), ["8x4", "32x1"])
    assert not v[("agent speed", "8x4", AGENT, "ADD")].ok
    # one bad run of three does not decide: 5x, 5x, 1x
    v = judged(guard_runs([20.0, 20.0, 100.0], [30.0] * 3, [100.0] * 3), ["8x4", "32x1"])
    assert v[("agent speed", "8x4", AGENT, "ADD")].ok


@pytest.mark.parametrize(("agent_84", "agent_321", "plain", "cpu", "failing"), [
    ([20.5] * 3, [30.0] * 3, [100.0] * 3, [5.0] * 3, {("agent speed", "8x4")}),  # 4.88x < 5x
    ([20.0] * 3, [34.0] * 3, [100.0] * 3, [5.0] * 3, {("agent speed", "32x1")}),  # 2.94x < 3x
    ([20.0] * 3, [30.0] * 3, [101.0] * 3, [5.0] * 3,  # 0.99x < 1x (in both layouts)
     {("standalone speed", "8x4"), ("standalone speed", "32x1")}),
    ([20.0] * 3, [30.0] * 3, [100.0] * 3, [10.4] * 3, {("agent API CPU", "32x1")}),  # 0.26 > 0.25
])  # fmt: skip
def test_each_threshold_fails_just_past_it(agent_84: list[float], agent_321: list[float], plain: list[float],
                                           cpu: list[float], failing: set[tuple[str, str]]) -> None:
    reports = guard_runs(agent_84, agent_321, plain, cpu)
    vs = lay.verdicts(lay.rows(reports), ["8x4", "32x1"])
    assert not lay.guard_met(vs)
    assert {(v.guard, v.layout) for v in vs if not v.ok} == failing


def test_the_thresholds_themselves_are_met() -> None:
    # exactly 5x at 8x4, 3x at 32x1, 1x standalone, a quarter of upstream's API CPU
    reports = guard_runs([20.0] * 3, [100 / 3] * 3, [100.0] * 3, [10.0] * 3)
    assert lay.guard_met(lay.verdicts(lay.rows(reports), ["8x4", "32x1"]))


def test_standalone_counts_in_every_layout_run() -> None:
    reports = guard_runs([20.0] * 3, [30.0] * 3, [100.0] * 3)
    reports += runs("64x1", {UP: [200.0] * 3, AGENT: [1000.0] * 3, PLAIN: [210.0] * 3})
    vs = lay.verdicts(lay.rows(reports), ["8x4", "32x1", "64x1"])
    # the agent has no guard at 64x1 (its 0.2x is in the table, not a verdict); standalone has 0.95x
    assert {(v.guard, v.layout, v.impl) for v in vs if not v.ok} == {("standalone speed", "64x1", PLAIN)}


def test_a_guard_layout_not_run_is_not_met() -> None:
    reports = runs("2x2", {UP: [10.0], AGENT: [1.0], PLAIN: [5.0]}) + runs(
        "4x1", {UP: [10.0], AGENT: [1.0], PLAIN: [5.0]})
    v = judged(reports, ["2x2", "4x1"])
    assert v[("agent speed", "8x4", AGENT, "ADD")].value == "not run"
    assert not v[("agent API CPU", "32x1", AGENT, "DEL")].ok
    assert v[("standalone speed", "2x2", PLAIN, "ADD")].ok and v[("clean", "4x1", AGENT, "ADD+DEL")].ok


def test_no_upstream_in_the_runs_is_no_verdict() -> None:
    reports = [phase(AGENT, "8x4", ph, 0, 10.0) for ph in lay.PHASES]
    v = judged(reports, ["8x4"])
    assert v[("agent speed", "8x4", AGENT, "ADD")].value == "no upstream figure in the same runs"
    assert not v[("agent speed", "8x4", AGENT, "ADD")].ok


@pytest.mark.parametrize(("ph", "kw", "flag"), [
    ("ADD", {"failures": 1}, "1 failed"),
    ("ADD", {"attempted": 500}, "12 not done"),
    ("ADD", {"duplicates": 1, "problems": [f"{DUPLICATE}198.18.0.7 held twice (a, b)"]}, "1 duplicates"),
    ("DEL", {"left": 2, "problems": ["198.18.0.7 still held in p by x", "reservation 198.18.0.7 left"]},
     "2 left after DEL"),
    ("DEL", {"api_504": 1.0}, "1 answers 504"),
    ("DEL", {"api_504_cut": 3.0}, "3 answers 504"),
    ("ADD", {"problems": ["pod-1 net1 returned 198.18.0.1, its pool entry holds None"]}, "1 check problems"),
    ("DEL", {"attempted": 510, "problems": [f"2{NOT_DELETED}"], "left": 0}, "2 not done"),
])  # fmt: skip
def test_an_unclean_phase_in_any_run_fails_the_guard(ph: str, kw: dict[str, Any], flag: str) -> None:
    reports = guard_runs([20.0] * 3, [30.0] * 3, [100.0] * 3)
    i = index(reports, AGENT, "32x1", ph, 2)
    r = reports[i]
    reports[i] = phase(AGENT, "32x1", ph, 2, r.wall_s, r.api_cpu_s, **{"left": r.left, **kw})
    vs = lay.verdicts(lay.rows(reports), ["8x4", "32x1"])
    assert not lay.guard_met(vs)
    bad = [v for v in vs if not v.ok]
    assert [(v.guard, v.layout, v.impl) for v in bad] == [("clean", "32x1", AGENT)]
    assert bad[0].value == f"{ph}: {flag}"


def test_upstreams_own_failures_are_shown_but_not_judged() -> None:
    reports = guard_runs([20.0] * 3, [30.0] * 3, [100.0] * 3)
    i = index(reports, UP, "8x4", "DEL")
    reports[i] = phase(UP, "8x4", "DEL", reports[i].run, 100.0, 40.0, failures=3, left=5, api_504_cut=2.0)
    vs = lay.verdicts(lay.rows(reports), ["8x4", "32x1"])
    assert lay.guard_met(vs)
    up = next(v for v in vs if v.impl == UP and v.layout == "8x4")
    assert not up.ok and not up.counts and "3 failed" in up.value and "2 answers 504" in up.value
    assert "upstream, the reference" in lay.verdict_table(vs)


# ---- tables ---------------------------------------------------------------------------------------


def test_the_tables_show_the_medians_and_the_flags() -> None:
    reports = guard_runs([20.0, 25.0, 20.0], [30.0] * 3, [100.0] * 3)
    reports[index(reports, PLAIN, "8x4", "DEL", 1)] = phase(PLAIN, "8x4", "DEL", 1, 100.0, left=0,
                                                            api_504=2.0)
    all_rows = lay.rows(reports)
    table = lay.layout_table(all_rows, "8x4")
    line = next(x for x in table.splitlines() if x.startswith(f"| {AGENT} | shared | ADD |"))
    assert "| 3 | 20.0 / 25.0 / 20.0 | 20.0 | 5.00, 4.00, 5.00 | 5.00x |" in line
    line = next(x for x in table.splitlines() if x.startswith(f"| {PLAIN} | shared | DEL |"))
    assert line.split("|")[13].strip() == "2"  # the 504 column
    assert "32x1" not in table
    vs = lay.verdicts(all_rows, ["8x4", "32x1"])
    summary = lay.summary_table(all_rows, vs, [Layout(8, 4), Layout(32, 1)]).splitlines()
    assert summary[0].startswith("| layout | nodes | pods in flight | attachments | mode | upstream ADD s / "
                                 "CPU ms")
    first = summary[2].split(" | ")
    assert first[:5] == ["| 8x4", "8", "32", "512", "shared"]
    assert first[7] == f"20.0 / {1000 * 10 / 512:.1f}"  # pycni+agent ADD: median s / API CPU ms per att
    assert f"{AGENT} speed >= 5x: 5.00x/5.00x met" in summary[2]
    assert f"{PLAIN} clean: NOT MET" in summary[2]
    assert f"{AGENT} CPU <= 0.25 of upstream's: 0.12/0.12 met" in summary[3]


# ---- what the harness counts -------------------------------------------------------------------------


def measured(requests: dict[tuple[str, ...], float], terminations: dict[tuple[str, ...], float]) -> Measured:
    return Measured(requests, 0.0, {}, {}, terminations)


def test_answers_504_are_counted_by_handler_and_by_timeout_filter() -> None:
    before = measured({("PATCH", "ippools", "200"): 10.0, ("PATCH", "ippools", "504"): 1.0},
                      {("PATCH", "ippools", "504"): 4.0})
    after = measured({("PATCH", "ippools", "200"): 30.0, ("PATCH", "ippools", "504"): 2.0,
                      ("PATCH", "ippools", "500"): 5.0, ("GET", "", "504"): 7.0,  # not a resource
                      ("GET", "overlappingrangeipreservations", "504"): 1.0},
                     {("PATCH", "ippools", "504"): 9.0, ("PATCH", "ippools", "429"): 2.0})
    assert answers_504(before, after) == (2.0, 5.0)
    assert answers_504(before, before) == (0.0, 0.0)


class Fake(Impl):
    label = AGENT


def test_a_phase_reports_its_504s_and_duplicates() -> None:
    wl = Workload(4, 2, 2, 2)
    before = measured({}, {})
    after = measured({("PATCH", "ippools", "504"): 1.0}, {("PATCH", "ippools", "504"): 2.0})
    twice = "198.18.0.3 held twice (a, b)"
    problems = [DUPLICATE + twice, f"{DUPLICATE}198.18.0.3 returned to 2 attachments",
                "reservation 198.18.0.9 without an allocation"]
    r = report(Fake(), wl, "ADD", [], 1.0, 8, before, after, problems, None)
    assert (r.api_504, r.api_504_cut, r.duplicates, r.layout) == (1.0, 2.0, 2, "2x2")
    row = lay.rows([r])[0]
    assert row.flags() == ["8 not done", "2 duplicates", "3 answers 504", "1 check problems"]
