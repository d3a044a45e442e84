"""`make bench-ipam-scale ARGS='--layouts 8x4,32x1,64x1'` (issue 44 item 2): the layouts, the summaries
and the guard's verdicts of tests/bench/ipam_scale.py's runs. Pure: it reads PhaseReports and runs
nothing (tests/unit/test_ipam_layouts.py feeds it synthetic ones).

A layout is K nodes x C pods at once per node ("8x4": 32 pods in flight; "64x1": 64). Unless --pods
fixes one count for every layout, a layout gets PODS_PER_SLOT pods for each of its K x C workers: 64
pods at 8x4 and at 32x1 (as the documented 8x4 workload), 128 at 64x1. Every worker then runs the same
number of pods one after another in every layout, so no layout is a single burst whose wall time is its
slowest pod (64 pods at 64x1 would start every pod at once and give each node's agent 8 calls, where the
other layouts give it 16 or more).

Per layout, implementation, range mode and phase (a Row), over the --repeat runs: the wall times, the
speed against upstream (attachments/s, each run against its own run's upstream, and their median), API
requests and API server CPU ms per attachment (medians), 409/422 (medians), answers 504, failures,
attachments not done in the budget, duplicates, objects left after DEL and other check problems (sums
over the runs: any is a flag).

The guard (issue 44), judged on the medians over the runs, upstream in the same runs:
- through the agent (every implementation whose calls go through per-node agents): at least
  AGENT_SPEED[layout] x upstream's speed for ADD and for DEL (5x at 8x4, 3x at 32x1), and API server CPU
  per attachment at most AGENT_CPU[layout] of upstream's (a quarter at 32x1);
- without the agent (pycni standalone): at least STANDALONE_SPEED (1.0x) in every layout run;
- every implementation but upstream: in every phase of every run 0 failed calls, every attachment done
  within the budget, 0 duplicates, 0 objects left after DEL, 0 answers 504, the checks ok. Upstream's
  own are shown beside, as the reference, and do not count.
A guard layout that was not run is "not run": not met."""

from __future__ import annotations

import ipaddress
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.bench.ipam_scale import PhaseReport

UPSTREAM = "upstream"
AGENT_SUFFIXES = ("+agent",)  # pycni+agent, pycni:LABEL+agent
AGENT_SPEED = {"8x4": 5.0, "32x1": 3.0}  # layout -> least median speed against upstream, ADD and DEL
AGENT_CPU = {"32x1": 0.25}  # layout -> most median API server CPU per attachment against upstream's
STANDALONE_SPEED = 1.0  # least median speed against upstream in every layout, ADD and DEL
PODS_PER_SLOT = 2
DUPLICATE = "duplicate: "  # how the harness's check after ADD starts an address held or returned twice
NOT_DELETED = " attachments not deleted within the budget"  # how the harness's DEL check ends that problem
PHASES = ("ADD", "DEL")


def through_agent(impl: str) -> bool:
    return impl.endswith(AGENT_SUFFIXES)


@dataclass(frozen=True)
class Layout:
    nodes: int
    concurrency: int  # pods a node starts at once

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.concurrency}"

    @property
    def in_flight(self) -> int:
        return self.nodes * self.concurrency


def parse_layouts(text: str) -> list[Layout]:
    """'8x4,32x1,64x1' -> the layouts in that order; ValueError naming the item that is not NODESxPODS
    of two positive integers, or is there twice."""
    out: list[Layout] = []
    for item in text.split(","):
        nodes, sep, pods = item.strip().lower().partition("x")
        if not (sep and nodes.isdigit() and pods.isdigit() and int(nodes) > 0 and int(pods) > 0):
            raise ValueError(f"layout {item.strip()!r}: not NODESxPODS (nodes x pods at once per node, "
                             "e.g. 8x4)")
        layout = Layout(int(nodes), int(pods))
        if layout in out:
            raise ValueError(f"layout {layout.label} given twice")
        out.append(layout)
    return out


def pods_for(layout: Layout, pods: int | None, per_slot: int = PODS_PER_SLOT) -> int:
    """The layout's pod count: `pods` when given (the same in every layout), else `per_slot` pods for
    each of its workers (nodes x pods at once)."""
    return pods if pods is not None else per_slot * layout.in_flight


def slice_size(base: str, smallest: str, nodes: int, per_node: int) -> str:
    """The node-slice size (e.g. "/23") for `nodes` nodes with up to `per_node` attachments each in
    `base`: `smallest` (the harness's usual slices) when `base` holds that many slices of it, else the
    first smaller size that gives every node one; "" when none holds `per_node` addresses."""
    net = ipaddress.ip_network(base)
    for size in range(int(smallest.lstrip("/")), net.max_prefixlen - 1):
        if 2 ** (size - net.prefixlen) >= nodes:
            return f"/{size}" if 2 ** (net.max_prefixlen - size) - 2 >= per_node else ""
    return ""


# ---- rows: one per layout, implementation, mode and phase, over the runs --------------------------


@dataclass
class Row:
    layout: str
    impl: str
    mode: str
    phase: str
    runs: list[PhaseReport] = field(default_factory=list)  # in run order
    speed: list[float] = field(default_factory=list)  # each run's attachments/s over its upstream's
    cpu: list[float] = field(default_factory=list)  # each run's API CPU per attachment over upstream's

    @property
    def wall(self) -> list[float]:
        return [r.wall_s for r in self.runs]

    @property
    def median_wall(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_speed(self) -> float | None:
        return statistics.median(self.speed) if self.speed else None

    @property
    def median_cpu(self) -> float | None:
        return statistics.median(self.cpu) if self.cpu else None

    @property
    def cpu_ms(self) -> float:
        """Median API server CPU ms per attachment."""
        return statistics.median(cpu_ms(r) for r in self.runs)

    @property
    def api_per_attachment(self) -> float:
        return statistics.median(r.api_per_attachment for r in self.runs)

    @property
    def attachments(self) -> int:
        return max(r.attachments for r in self.runs)

    def median(self, attr: str) -> float:
        return statistics.median(float(getattr(r, attr)) for r in self.runs)

    @property
    def answers_504(self) -> float:
        return sum(r.api_504 + r.api_504_cut for r in self.runs)

    @property
    def failures(self) -> int:
        return sum(r.failures for r in self.runs)

    @property
    def not_done(self) -> int:
        """Attachments the budget left out (ADD: never started; DEL: never started or not deleted)."""
        return sum(max(0, r.attachments - r.attempted) for r in self.runs)

    @property
    def duplicates(self) -> int:
        return sum(r.duplicates for r in self.runs)

    @property
    def left(self) -> int | None:
        lefts = [r.left for r in self.runs if r.left is not None]
        return sum(lefts) if lefts else None

    @property
    def other_problems(self) -> int:
        """Problems of the checks that are neither duplicates, objects left nor attachments not done."""
        return sum(len(r.problems) - r.duplicates - (r.left or 0) - _not_done_problems(r)
                   for r in self.runs)  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        """The row's figures for the JSON result."""
        return {"layout": self.layout, "impl": self.impl, "mode": self.mode, "phase": self.phase,
                "runs": len(self.runs), "attachments": self.attachments, "wall_s": self.wall,
                "median_wall_s": self.median_wall, "speed_vs_upstream": self.speed,
                "median_speed_vs_upstream": self.median_speed, "api_cpu_vs_upstream": self.cpu,
                "median_api_cpu_vs_upstream": self.median_cpu, "api_cpu_ms_per_attachment": self.cpu_ms,
                "api_per_attachment": self.api_per_attachment, "api_409": self.median("api_409"),
                "api_422": self.median("api_422"), "answers_504": self.answers_504,
                "failures": self.failures, "not_done": self.not_done, "duplicates": self.duplicates,
                "left": self.left, "other_problems": self.other_problems, "flags": self.flags()}

    def flags(self) -> list[str]:
        """What makes the row unclean, per kind ([] when clean)."""
        out = []
        for n, what in ((self.failures, "failed"), (self.not_done, "not done"),
                        (self.duplicates, "duplicates"), (self.left or 0, "left after DEL"),
                        (self.answers_504, "answers 504"), (self.other_problems, "check problems")):
            if n:
                out.append(f"{n:g} {what}")
        return out


def cpu_ms(r: PhaseReport) -> float:
    return 1000 * r.api_cpu_s / max(1, r.attempted)


def _not_done_problems(r: PhaseReport) -> int:
    return sum(p.endswith(NOT_DELETED) for p in r.problems)


def rows(reports: Iterable[PhaseReport]) -> list[Row]:
    """The reports grouped by (layout, implementation, mode, phase), in the order they first came;
    each run's ratios against the upstream of the same run, layout, mode and phase."""
    reports = list(reports)
    base = {(r.run, r.layout, r.mode, r.phase): r for r in reports if r.impl == UPSTREAM}
    out: dict[tuple[str, str, str, str], Row] = {}
    for r in sorted(reports, key=lambda r: r.run):  # stable: the first run's order within a run
        row = out.setdefault((r.layout, r.impl, r.mode, r.phase), Row(r.layout, r.impl, r.mode, r.phase))
        row.runs.append(r)
        up = base.get((r.run, r.layout, r.mode, r.phase))
        if up is None or r.impl == UPSTREAM:
            continue
        if up.per_s:
            row.speed.append(r.per_s / up.per_s)
        if up.api_cpu_s:
            row.cpu.append(cpu_ms(r) / cpu_ms(up))
    return list(out.values())


# ---- verdicts ---------------------------------------------------------------------------------


@dataclass
class Verdict:
    guard: str  # "agent speed", "agent API CPU", "standalone speed", "clean"
    layout: str
    mode: str
    impl: str
    phase: str  # "ADD", "DEL", or "ADD+DEL"
    value: str  # the median and each run's figure, or what made the phase unclean
    needed: str
    ok: bool
    counts: bool = True  # False: shown for reference (upstream's own cleanliness), not part of the guard


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in values)


def verdicts(all_rows: list[Row], layouts: list[str]) -> list[Verdict]:
    """The guard's verdicts from the rows of the `layouts` run (labels, in order): per range mode."""
    by = {(r.layout, r.impl, r.mode, r.phase): r for r in all_rows}
    modes = list(dict.fromkeys(r.mode for r in all_rows))
    impls = list(dict.fromkeys(r.impl for r in all_rows))
    out: list[Verdict] = []
    for impl in impls:
        if impl == UPSTREAM:
            continue
        agent = through_agent(impl)
        for mode in modes:
            checks: list[tuple[str, str, float, bool]] = []  # (guard, layout, threshold, higher is better)
            if agent:
                checks += [("agent speed", lay, x, True) for lay, x in AGENT_SPEED.items()]
                checks += [("agent API CPU", lay, x, False) for lay, x in AGENT_CPU.items()]
            else:
                checks += [("standalone speed", lay, STANDALONE_SPEED, True) for lay in layouts]
            for guard, lay, threshold, higher in checks:
                for phase in PHASES:
                    out.append(_judge(by.get((lay, impl, mode, phase)), guard, lay, mode, impl, phase,
                                      threshold, higher))  # fmt: skip
    for impl in impls:
        for mode in modes:
            for lay in layouts:
                phases = [by[key] for phase in PHASES if (key := (lay, impl, mode, phase)) in by]
                if not phases:
                    continue
                bad = [f"{r.phase}: {', '.join(r.flags())}" for r in phases if r.flags()]
                value = "; ".join(bad) or f"{sum(len(r.runs) for r in phases)} phases clean"
                out.append(Verdict("clean", lay, mode, impl, "+".join(r.phase for r in phases), value,
                                   "0 failed, not done, duplicates, left, 504, check problems", not bad,
                                   counts=impl != UPSTREAM))
    return out


def _judge(row: Row | None, guard: str, layout: str, mode: str, impl: str, phase: str,
           threshold: float, higher: bool) -> Verdict:  # fmt: skip
    needed = f">= {threshold:g}x upstream" if higher else f"<= {threshold:g} of upstream's"
    figures = None if row is None else (row.speed if guard.endswith("speed") else row.cpu)
    if row is None:
        return Verdict(guard, layout, mode, impl, phase, "not run", needed, False)
    if not figures:
        return Verdict(guard, layout, mode, impl, phase, "no upstream figure in the same runs", needed,
                       False)
    med = statistics.median(figures)
    unit = "x" if higher else ""
    value = f"{med:.2f}{unit} ({_ratios(figures)})"
    return Verdict(guard, layout, mode, impl, phase, value, needed, med >= threshold if higher else
                   med <= threshold)  # fmt: skip


def guard_met(vs: list[Verdict]) -> bool:
    return all(v.ok for v in vs if v.counts)


# ---- tables -------------------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def layout_table(all_rows: list[Row], layout: str) -> str:
    """One layout: a line per implementation, mode and phase."""
    head = ("| impl | mode | phase | runs | wall s (each run) | median wall s | vs upstream (each run) "
            "| median vs upstream | API req/att | API CPU ms/att | 409 | 422 | 504 | failed | left "
            "| duplicates | check |")
    lines = [head, "|" + "---|" * 17]
    for r in all_rows:
        if r.layout != layout:
            continue
        each = " / ".join(f"{w:.1f}" for w in r.wall)
        speed = ", ".join(f"{x:.2f}" for x in r.speed) or "-"
        failed = f"{r.failures}" + (f" (+{r.not_done} not done)" if r.not_done else "")
        left = "-" if r.left is None else str(r.left)
        check = "ok" if not r.other_problems else f"{r.other_problems} PROBLEMS"
        lines.append(
            f"| {r.impl} | {r.mode} | {r.phase} | {len(r.runs)} | {each} | {r.median_wall:.1f} | {speed} "
            f"| {_x(r.median_speed)} | {r.api_per_attachment:.1f} | {r.cpu_ms:.1f} | {r.median('api_409'):g} "
            f"| {r.median('api_422'):g} | {r.answers_504:g} | {failed} | {left} | {r.duplicates} | {check} |")
    return "\n".join(lines)


def summary_table(all_rows: list[Row], vs: list[Verdict], layouts: list[Layout]) -> str:
    """Against the number of nodes: a line per layout and mode; per implementation its median wall s and
    API server CPU ms per attachment, ADD and DEL; the guard's verdicts of the line."""
    impls = list(dict.fromkeys(r.impl for r in all_rows))
    modes = list(dict.fromkeys(r.mode for r in all_rows))
    by = {(r.layout, r.impl, r.mode, r.phase): r for r in all_rows}
    head = ["layout", "nodes", "pods in flight", "attachments", "mode"]
    head += [f"{impl} {phase} s / CPU ms" for impl in impls for phase in PHASES]
    lines = ["| " + " | ".join([*head, "guard"]) + " |", "|" + "---|" * (len(head) + 1)]
    for lay in layouts:
        for mode in modes:
            cells: list[str] = []
            atts = 0
            for impl in impls:
                for phase in PHASES:
                    r = by.get((lay.label, impl, mode, phase))
                    atts = max(atts, r.attachments if r and phase == "ADD" else 0)
                    cells.append("-" if r is None else f"{r.median_wall:.1f} / {r.cpu_ms:.1f}")
            if not atts:
                continue
            guard = "; ".join(_short(vs, lay.label, mode)) or "-"
            lines.append("| " + " | ".join([lay.label, str(lay.nodes), str(lay.in_flight), str(atts), mode,
                                            *cells, guard]) + " |")  # fmt: skip
    return "\n".join(lines)


def _short(vs: list[Verdict], layout: str, mode: str) -> list[str]:
    """The line's verdicts, one per implementation and guard: 'pycni+agent speed >= 5x: 2.77x/2.27x NOT
    MET' (ADD/DEL medians)."""
    groups: dict[tuple[str, str], list[Verdict]] = {}
    for v in vs:
        if v.layout == layout and v.mode == mode and v.counts:
            groups.setdefault((v.impl, v.guard), []).append(v)
    out = []
    for (impl, guard), group in groups.items():
        verdict = "met" if all(v.ok for v in group) else "NOT MET"
        if guard == "clean":
            out.append(f"{impl} clean: {verdict}")
            continue
        figures = "/".join(v.value.split(" (")[0] for v in group)
        out.append(f"{impl} {guard.split()[-1]} {group[0].needed.removesuffix(' upstream')}: {figures} "
                   f"{verdict}")
    return out


def verdict_table(vs: list[Verdict]) -> str:
    lines = ["| guard | layout | mode | impl | phase | median (each run) | needed | verdict |",
             "|" + "---|" * 8]
    for v in vs:
        verdict = "met" if v.ok else "NOT MET"
        if not v.counts:
            verdict = f"({verdict}: upstream, the reference)"
        lines.append(f"| {v.guard} | {v.layout} | {v.mode} | {v.impl} | {v.phase} | {v.value} | {v.needed} "
                     f"| {verdict} |")
    return "\n".join(lines)
