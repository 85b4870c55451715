"""`make bench-deepline`: small gangs beside a deep line of big aged gangs, end to end (issue 46).

The issue's story, with the real kube-scheduler on the bench control plane
(bench/e2e.py's BenchCluster, Runner, BindWatch and scheduler configurations):
--nodes fake nodes of 8 CPUs; --big-gangs gangs of 4 x 6 CPUs are submitted,
one 6-CPU member fits per node, so nodes / 4 of them run and the rest wait
(turned away, and aged: gang-extender runs with a short --gang-aging-seconds),
and every node has 2 CPUs no big member can ever use. Then --small-gangs gangs
of 2 x 100m are submitted: they fit in those remainders and must run at once
(backfill), not wait behind the aged big gangs.

For each scheduler (--cases, bench/e2e.py's keys: c gang-extender calling
every verb, q gang-extender in the gang-only mode as shipped, k the same with
--hold-waiting-gangs (members created with the line's scheduling gate, as the
webhook then leaves them), d Kubernetes' in-tree GangScheduling plugin with
native scheduling.k8s.io/v1beta1 PodGroups), one kube-scheduler runs the
whole scenario:

  1. the small gangs with no line (--rounds times, each in a fresh namespace);
  2. the big gangs are created with kube-scheduler stopped, then it starts
     again (it tries each gang whole once, as bench/e2e.py's cases), and the
     bench waits until the running ones are bound and every other one was
     turned away (in gang-extender's line, /debug/gangs, which is kept as
     evidence; in-tree, a member reported FailedScheduling), then for the
     aging period;
  3. the small gangs again, behind the line (--rounds times); no big gang may
     start meanwhile (there is no room for one);
  4. the drain: --drain-rounds times, --drain-gangs running big gangs end
     (their pods deleted) and the bench waits for as many waiting ones to
     start; they must be the next in line, the line being the order the
     PodGroups were created in (creationTimestamp, then name: gang-extender's
     order for aged gangs of one priority, app/core/contention.py).

Small gangs' figures: pods/s from the first bind to the last (BindWatch), and
the seconds from the first pod's creation until all are bound. The targets
(issue 46): behind / no line >= 0.8, and gang-extender's behind the line >=
the in-tree plugin's behind the line.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from app.core.groups import GROUP_APIS
from app.core.marking import LINE_GATE
from bench import e2e
from bench.results import commit, machine_description, write_json
from hack.clusterkit import REPO, http_text, parse_metrics, stop_process, sum_by_label, wait_for

BIG_SIZE = 4
BIG_CPU = "6"
SMALL_SIZE = 2
SMALL_CPU = "100m"
NODE_SHAPE = {"cpu": "8", "memory": "32Gi", "pods": 110}
"""The issue's nodes: one 6-CPU member each, and 2 CPUs that no big member can use."""

MODES = {
    "c": "gang-extender, every verb",
    "q": "gang-extender, gang-only (as shipped)",
    "k": "gang-extender, gang-only, waiting gangs held (--hold-waiting-gangs)",
    "d": "in-tree GangScheduling (native PodGroups)",
}
"""Which of bench/e2e.py's CASES (their scheduler configuration and group source) run here."""

BEHIND_TARGET = 0.8
"""Small gangs' pods/s behind the line over with none, at least (issue 46)."""
IN_TREE_TARGET = 1.0
"""gang-extender's pods/s behind the line over the in-tree plugin's, at least."""

MD_BEGIN = "<!-- deepline:begin (written by bench/deepline.py) -->"
MD_END = "<!-- deepline:end -->"


# ---- pure parts (unit-tested in tests/unit/test_bench_deepline.py) -----------------------


@dataclass
class SmallRun:
    """One batch of small gangs: how fast kube-scheduler placed them."""

    label: str
    pods: int
    bound: int
    pods_per_second: float
    span_seconds: float
    # From the first pod's creation to the last bind; None when not all were bound.
    all_bound_seconds: float | None
    # Big gangs that started while the small ones were placed (there is no room for one).
    big_started: int = 0


@dataclass(frozen=True)
class OutOfOrder:
    """A big gang that started in a drain round while gangs ahead of it in line still waited."""

    round: int
    gang: str
    position: int  # its place among the gangs still waiting at the round's start (0: first)
    skipped: tuple[str, ...]  # the gangs ahead of it that did not start in that round


@dataclass
class ModeResult:
    key: str
    description: str
    nodes: int
    big_gangs: int
    without: list[SmallRun] = field(default_factory=list)
    behind: list[SmallRun] = field(default_factory=list)
    running: int = 0  # big gangs bound whole once the line settled
    partial: int = 0  # big gangs partly bound then (holding room, never starting)
    waiting: int = 0
    in_line: int | None = None  # gangs in gang-extender's line (/debug/gangs)
    aged: int | None = None  # of which it reported aged
    line_seconds: float = 0.0  # from the big pods' creation until the line settled
    drain_rounds: list[list[str]] = field(default_factory=list)
    drain_seconds: list[float] = field(default_factory=list)
    out_of_order: list[OutOfOrder] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def median_rate(runs: Sequence[SmallRun]) -> float:
    """The median pods/s of the runs (0 for none)."""
    return statistics.median(r.pods_per_second for r in runs) if runs else 0.0


def median_all_bound(runs: Sequence[SmallRun]) -> float | None:
    """The median seconds until all were bound; None if a run never got there."""
    values = [r.all_bound_seconds for r in runs]
    if not values or any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def line_order(created: Mapping[str, str]) -> list[str]:
    """Gang names in line order: PodGroup creationTimestamp (RFC 3339, one-second steps),
    then name, as gang-extender orders aged gangs of one priority."""
    return sorted(created, key=lambda name: (created[name], name))


def gang_starts(
    bound_at: Mapping[str, float], members: Mapping[str, Sequence[str]]
) -> dict[str, float]:
    """gang -> when its last member was bound, for the gangs bound whole."""
    return {
        gang: max(bound_at[p] for p in pods)
        for gang, pods in members.items()
        if pods and all(p in bound_at for p in pods)
    }


def check_order(line: Sequence[str], rounds: Sequence[Collection[str]]) -> list[OutOfOrder]:
    """The gangs that started out of line order, round by round.

    `line`: the waiting gangs in line order; `rounds`: the gangs that started
    in each drain round. A round in which n gangs started should have started
    the first n still waiting; any other is out of order (the first n that
    did not start are the ones it skipped). Within a round the start order
    does not count: those gangs bind at once, their members interleaved.
    """
    waiting = list(line)
    found: list[OutOfOrder] = []
    for number, started in enumerate(rounds, 1):
        expected = waiting[: len(started)]
        skipped = tuple(g for g in expected if g not in started)
        for gang in sorted(started, key=lambda g: waiting.index(g) if g in waiting else -1):
            if gang in expected:
                continue
            position = waiting.index(gang) if gang in waiting else -1
            found.append(OutOfOrder(number, gang, position, skipped))
        waiting = [g for g in waiting if g not in started]
    return found


def _rate(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "not all"


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "-"
    return "yes" if value >= target else "**no**"


def target_rows(modes: Sequence[ModeResult]) -> list[str]:
    """| figure | value | target | met? | rows: each mode's behind/without, ours/in-tree, order."""
    rows = []
    by = {m.key: m for m in modes}
    for m in modes:
        value = ratio(median_rate(m.behind), median_rate(m.without))
        rows.append(
            f"| ({m.key}) small gangs' pods/s behind the line / with none | {_rate(value)} "
            f"| >= {BEHIND_TARGET} | {_verdict(value, BEHIND_TARGET)} |"
        )
    in_tree = by.get("d")
    for m in modes:
        if m.key == "d" or in_tree is None:
            continue
        value = ratio(median_rate(m.behind), median_rate(in_tree.behind))
        rows.append(
            f"| ({m.key})/(d) small gangs' pods/s behind the line, gang-extender / in-tree "
            f"| {_rate(value)} | >= {IN_TREE_TARGET} | {_verdict(value, IN_TREE_TARGET)} |"
        )
    for m in modes:
        if not m.drain_rounds:
            continue
        started = sum(len(r) for r in m.drain_rounds)
        met = "yes" if not m.out_of_order else "**no**"
        rows.append(
            f"| ({m.key}) big gangs started out of line order in the drain | "
            f"{len(m.out_of_order)} of {started} | 0 | {met if m.key != 'd' else '-'} |"
        )
    return rows


def render_markdown(report: Mapping[str, Any]) -> str:
    """The BENCHMARKS.md section of one run."""
    modes: list[ModeResult] = report["modes"]
    first = modes[0] if modes else None
    lines = [
        MD_BEGIN,
        f"## Small gangs beside a deep line ({report['date']}, {report['label']})",
        "",
        f"`python -m bench.deepline` ({report['command']}), {report['duration']:.0f} s, "
        f"commit {report['commit']}. {report['machine']} (load average before: "
        f"{report['load']}); Kubernetes {report['kube_version']} (pinned build). "
        + (
            f"{first.nodes:,} nodes of {NODE_SHAPE['cpu']} CPUs; {first.big_gangs:,} big gangs "
            f"of {BIG_SIZE} x {BIG_CPU} CPUs (aged: gang-extender ran with "
            f"--gang-aging-seconds {report['aging_seconds']:g}); {report['small_gangs']:,} small "
            f"gangs of {SMALL_SIZE} x {SMALL_CPU}, {report['rounds']} round(s) each way. "
            if first is not None
            else ""
        )
        + "pods/s: from the first bind to the last; all bound: from the first small pod's "
        "creation to the last bind (medians over the rounds).",
        "",
        "| scheduler | small pods/s, no line | small pods/s, behind the line | all bound, no line "
        "/ behind | big gangs running / partly bound / waiting | line settled "
        "| drain: gangs started per round (seconds) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        rounds = ", ".join(
            f"{len(r)} ({s:.0f} s)" for r, s in zip(m.drain_rounds, m.drain_seconds, strict=False)
        )
        aged = f" ({m.in_line:,} in line, {m.aged:,} aged)" if m.aged is not None else ""
        lines.append(
            f"| ({m.key}) {m.description} | {median_rate(m.without):.1f} "
            f"({', '.join(f'{r.pods_per_second:.1f}' for r in m.without)}) "
            f"| {median_rate(m.behind):.1f} "
            f"({', '.join(f'{r.pods_per_second:.1f}' for r in m.behind)}) "
            f"| {_seconds(median_all_bound(m.without))} / {_seconds(median_all_bound(m.behind))} "
            f"| {m.running:,} / {m.partial:,} / {m.waiting:,}{aged} | {m.line_seconds:.0f} s "
            f"| {rounds or '-'} |"
        )
    lines += ["", "| figure | value | target | met |", "|---|---|---|---|", *target_rows(modes)]
    for m in modes:
        for o in m.out_of_order:
            lines.append(
                f"- ({m.key}) drain round {o.round}: {o.gang} started from place {o.position} "
                f"in line, ahead of it still waiting: {', '.join(o.skipped) or '-'}"
            )
        lines += [f"- ({m.key}) {note}" for note in m.notes]
    lines.append(MD_END)
    return "\n".join(lines) + "\n"


# ---- on a cluster ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    big_gangs: int
    small_gangs: int
    rounds: int = 1
    drain_rounds: int = 3
    drain_gangs: int = 2
    aging_seconds: float = 5.0
    small_timeout: float = 600.0
    line_timeout: float = 1200.0
    drain_timeout: float = 180.0


HELD = "k"
"""The mode whose members arrive with the line's gate, as the webhook leaves them with
--hold-waiting-gangs: case (q)'s configuration otherwise."""


def case_of(key: str) -> e2e.Case:
    """bench/e2e.py's case a mode runs; the held mode is (q) under its own key."""
    if key == HELD:
        return dataclasses.replace(e2e.CASES["q"], key=HELD, description=MODES[HELD])
    return e2e.CASES[key]


def as_webhook_leaves(case: e2e.Case, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The members of the held mode with the line's gate (app/core/marking.py hold_patch)."""
    if case.key == HELD:
        for body in bodies:
            body["spec"]["schedulingGates"] = [{"name": LINE_GATE}]
    return bodies


def _group_kwargs(case: e2e.Case, gang: str) -> dict[str, Any]:
    return {
        "x_group": gang if case.gangs == "x-k8s" else None,
        "native_group": gang if case.gangs == "native" else None,
        "marked": case.gang_only,
    }


def scheduler_queues(runner: e2e.Runner) -> dict[str, float]:
    """kube-scheduler's pending pods per queue (active, backoff, unschedulable, gated)."""
    return sum_by_label(
        parse_metrics(runner.scheduler_metrics()), "scheduler_pending_pods", "queue"
    )


def debug_gangs(runner: e2e.Runner) -> dict[str, Any]:
    """gang-extender's /debug/gangs (its line, who holds room for whom)."""
    assert runner.cluster.extender_url is not None
    base = runner.cluster.extender_url.rsplit("/scheduler", 1)[0]
    document: dict[str, Any] = json.loads(http_text(f"{base}/debug/gangs"))
    return document


def _line_of(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The line in a /debug/gangs document, wherever the arbiter's part sits in it."""
    if isinstance(document.get("line"), list):
        return list(document["line"])
    for value in document.values():
        if isinstance(value, Mapping):
            found = _line_of(value)
            if found:
                return found
    return []


class Scenario:
    """One scheduler's whole run: small gangs without a line, the line, behind it, the drain."""

    def __init__(
        self,
        runner: e2e.Runner,
        case: e2e.Case,
        sizes: Sizes,
        nodes: int,
        *,
        node_selector: Mapping[str, str] | None = None,
        log: Callable[[str], None] = print,
        prefix: str = "deep",
    ) -> None:
        self.runner, self.case, self.sizes, self.nodes = runner, case, sizes, nodes
        self.selector = node_selector
        self.log = log
        self.prefix = f"{prefix}-{case.key}"
        self.result = ModeResult(
            case.key, MODES.get(case.key, case.description), nodes, sizes.big_gangs
        )
        self.big: BigGangs | None = None  # the line, once built

    def run(self) -> ModeResult:
        runner, case = self.runner, self.case
        if case.extender and runner.cluster.extender_url is None:
            raise RuntimeError(f"case ({case.key}) needs gang-extender running")
        scheduler = self._start_scheduler("free")
        try:
            for n in range(1, self.sizes.rounds + 1):
                self.result.without.append(self.small_gangs(f"{self.prefix}-free{n}", "no line"))
            # The big gangs are all there when kube-scheduler starts, as in bench/e2e.py:
            # it tries each one whole once. Created under a running kube-scheduler, a
            # member tried before its gang is complete is turned away for that, and
            # kube-scheduler may not try it again for minutes (nothing it waits on happens).
            stop_process(scheduler, grace=15)
            self.big = BigGangs(self)
            self.big.create()
            scheduler = self._start_scheduler("line")
            self.big.settle()
            for n in range(1, self.sizes.rounds + 1):
                self.result.behind.append(
                    self.small_gangs(f"{self.prefix}-line{n}", "behind the line")
                )
            self.big.drain()
            if scheduler.poll() is not None:
                raise RuntimeError(f"kube-scheduler exited with {scheduler.returncode}")
        finally:
            stop_process(scheduler, grace=15)
            # After the scheduler: deleting the line with it running starts gangs meanwhile.
            if self.big is not None:
                self.big.stop()
        return self.result

    def _start_scheduler(self, phase: str) -> subprocess.Popen[bytes]:
        """This case's kube-scheduler (bench/e2e.py's configuration), once it serves metrics."""
        case = self.case
        scheduler = self.runner.start_scheduler(
            f"{self.prefix}-{phase}",
            self.runner.cluster.extender_url if case.extender else None,
            case.gangs == "native",
            case.gang_only,
            case.mark_preemptors,
            case.batching,
        )
        wait_for(lambda: self._queues() is not None, 60, "kube-scheduler's metrics", 0.5)
        return scheduler

    def _queues(self) -> dict[str, float] | None:
        try:
            return scheduler_queues(self.runner)
        except OSError:
            return None

    def _big_started(self) -> int:
        """How many big gangs have started so far (0 before the line is built)."""
        return len(self.big.starts()) if self.big is not None else 0

    def small_gangs(self, namespace: str, label: str) -> SmallRun:
        """Create the small gangs in `namespace` with the scheduler running; time their binds."""
        runner, count = self.runner, self.sizes.small_gangs * SMALL_SIZE
        runner.create_namespace(namespace)
        rv = runner.core.list_namespaced_pod(namespace, limit=1).metadata.resource_version
        watch = e2e.BindWatch(runner.core, namespace, rv, count)
        gangs = [f"s{i:03d}" for i in range(self.sizes.small_gangs)]
        assert self.case.gangs is not None
        runner.create_podgroups(namespace, self.case.gangs, gangs, SMALL_SIZE)
        bodies = [
            e2e.pod_body(
                f"{gang}-{m}",
                cpu=SMALL_CPU,
                node_selector=self.selector,
                **_group_kwargs(self.case, gang),
            )
            for gang in gangs
            for m in range(SMALL_SIZE)
        ]
        as_webhook_leaves(self.case, bodies)
        big_before = self._big_started()
        started = time.monotonic()
        try:
            runner.create_pods(namespace, bodies)
            try:
                wait_for(
                    lambda: len(watch.bound_at) >= count,
                    self.sizes.small_timeout,
                    f"{count} small pods bound",
                    0.1,
                )
            except TimeoutError:
                self.log(f"  only {len(watch.bound_at)} of {count} small pods bound: giving up")
                self._evidence(namespace, label)
        finally:
            watch.stop()
        rate, span = e2e.throughput(watch.bound_at.values())
        complete = len(watch.bound_at) >= count
        run = SmallRun(
            label=label,
            pods=count,
            bound=len(watch.bound_at),
            pods_per_second=rate,
            span_seconds=span,
            all_bound_seconds=max(watch.bound_at.values()) - started if complete else None,
        )
        run.big_started = self._big_started() - big_before
        self.log(
            f"  ({self.case.key}) {label}: {run.bound}/{count} small pods bound, "
            f"{rate:.1f} pods/s over {span:.1f} s, "
            f"all bound after {_seconds(run.all_bound_seconds)}"
            + (f"; {run.big_started} big gang(s) started meanwhile" if run.big_started else "")
        )
        runner.delete_namespace(namespace)
        return run

    def _evidence(self, namespace: str, label: str) -> None:
        """Why small gangs did not bind: a waiting pod's last scheduling event, the line's head."""
        events = self.runner.core.list_namespaced_event(namespace, limit=200).items
        failed = [e.message for e in events if e.reason == "FailedScheduling" and e.message]
        if failed:
            self.result.notes.append(f"{label}: a small pod's FailedScheduling: {failed[-1][:400]}")
        if self.case.extender:
            line = _line_of(debug_gangs(self.runner))
            self.result.notes.append(
                f"{label}: /debug/gangs line head: {json.dumps(line[:2])[:600]}"
            )


class BigGangs:
    """The line: --big-gangs gangs of BIG_SIZE x BIG_CPU, the running ones and the waiting ones."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.namespace = f"{scenario.prefix}-big"
        self.gangs = [f"big{i:04d}" for i in range(scenario.sizes.big_gangs)]
        self.members = {g: [f"{g}-{m}" for m in range(BIG_SIZE)] for g in self.gangs}
        self.watch: e2e.BindWatch | None = None
        self.deleted: set[str] = set()
        self.line: list[str] = []  # the waiting gangs in line order, once settled

    def starts(self) -> dict[str, float]:
        assert self.watch is not None
        return gang_starts(self.watch.bound_at, self.members)

    def create(self) -> None:
        """The big gangs' PodGroups and pods, seen by gang-extender (if it runs) on return."""
        s, runner = self.s, self.s.runner
        case = s.case
        assert case.gangs is not None
        runner.create_namespace(self.namespace)
        rv = runner.core.list_namespaced_pod(self.namespace, limit=1).metadata.resource_version
        self.watch = e2e.BindWatch(runner.core, self.namespace, rv, len(self.gangs) * BIG_SIZE)
        began = time.monotonic()
        cached = runner.extender_cached_pods() if case.extender else 0.0
        runner.create_podgroups(self.namespace, case.gangs, self.gangs, BIG_SIZE)
        bodies = [
            e2e.pod_body(pod, cpu=BIG_CPU, node_selector=s.selector, **_group_kwargs(case, gang))
            for gang in self.gangs
            for pod in self.members[gang]
        ]
        runner.create_pods(self.namespace, as_webhook_leaves(case, bodies))
        if case.extender:
            wait_for(
                lambda: runner.extender_cached_pods() >= cached + len(bodies),
                s.sizes.line_timeout,
                "gang-extender's watch to deliver the big pods",
                0.5,
            )
        s.log(
            f"  ({case.key}) {len(self.gangs)} big gangs created "
            f"in {time.monotonic() - began:.0f} s"
        )

    def settle(self) -> None:
        """Until the running big gangs are bound and the rest turned away, and aged."""
        s, runner, result = self.s, self.s.runner, self.s.result
        case = s.case
        assert self.watch is not None
        began = time.monotonic()
        self._settle(began)
        result.line_seconds = time.monotonic() - began
        starts = self.starts()
        bound = set(self.watch.bound_at)
        result.running = len(starts)
        result.partial = sum(
            1 for g in self.gangs if g not in starts and bound & set(self.members[g])
        )
        self.line = [g for g in line_order(self._created()) if g not in starts]
        result.waiting = len(self.line)
        time.sleep(s.sizes.aging_seconds + 1)  # every gang turned away has aged
        if case.extender:
            # Kept as evidence: who waits, aged or not, and where room is held for whom.
            document = debug_gangs(runner)
            dump = runner.cluster.work_dir / f"{s.prefix}-debug-gangs.json"
            dump.write_text(json.dumps(document, indent=1))
            line = _line_of(document)
            result.in_line = len(line)
            result.aged = sum(1 for entry in line if entry.get("aged"))
        s.log(
            f"  ({case.key}) line settled after {result.line_seconds:.0f} s: {result.running} big "
            f"gangs running, {result.partial} partly bound, {result.waiting} waiting"
            + (
                f" ({result.in_line} in gang-extender's line, {result.aged} aged)"
                if result.aged is not None
                else ""
            )
        )

    def _settle(self, began: float) -> None:
        """Until the running gangs are bound (no bind for a few seconds) and every other
        one was turned away: joined gang-extender's line (/debug/gangs), or, in-tree, has
        a member kube-scheduler reported FailedScheduling for."""
        assert self.watch is not None
        watch, s = self.watch, self.s
        quiet_since: float | None = None
        last_bound = -1
        turned_away: Collection[str] = ()
        deadline = began + s.sizes.line_timeout
        while time.monotonic() < deadline:
            if len(watch.bound_at) == last_bound:
                quiet_since = quiet_since or time.monotonic()
                waiting = set(self.gangs) - set(self.starts())
                if time.monotonic() - quiet_since >= 3:
                    turned_away = self._turned_away()
                    if waiting <= set(turned_away):
                        return
            else:
                quiet_since = None
            last_bound = len(watch.bound_at)
            time.sleep(1 if len(self.gangs) < 200 else 5)
        s.result.notes.append(
            f"the line did not settle within {s.sizes.line_timeout:.0f} s: "
            f"{len(set(self.gangs) - set(self.starts()))} big gangs waiting, "
            f"{len(turned_away)} of them turned away; measured anyway"
        )

    def _turned_away(self) -> set[str]:
        """The big gangs the scheduler has turned away so far."""
        if self.s.case.extender:
            prefix = f"{self.namespace}/"
            return {
                str(entry.get("group", "")).removeprefix(prefix)
                for entry in _line_of(debug_gangs(self.s.runner))
            }
        events = self.s.runner.core.list_namespaced_event(
            self.namespace, field_selector="reason=FailedScheduling"
        ).items
        return {e.involved_object.name.rsplit("-", 1)[0] for e in events if e.involved_object}

    def _created(self) -> dict[str, str]:
        """gang -> its PodGroup's creationTimestamp."""
        api = GROUP_APIS[self.s.case.gangs or ""]
        listed = self.s.runner.custom.list_namespaced_custom_object(
            api.group, api.version, self.namespace, api.plural
        )
        return {
            item["metadata"]["name"]: item["metadata"]["creationTimestamp"]
            for item in listed["items"]
            if item["metadata"]["name"] in self.members
        }

    def drain(self) -> None:
        """--drain-rounds times: --drain-gangs running gangs end; as many waiting ones start."""
        s, result = self.s, self.s.result
        assert self.watch is not None
        for number in range(1, s.sizes.drain_rounds + 1):
            starts = self.starts()
            before = set(starts)
            # The gangs running longest end first.
            running = sorted(before - self.deleted, key=lambda g: (starts[g], g))
            ending = running[: s.sizes.drain_gangs]
            if not ending:
                s.result.notes.append(f"drain round {number}: no big gang running")
                break
            began = time.monotonic()
            self._end(ending)
            want = len(ending)

            def enough(before: set[str] = before, want: int = want) -> bool:
                return len(set(self.starts()) - before) >= want

            try:
                wait_for(
                    enough,
                    s.sizes.drain_timeout,
                    f"{want} waiting big gang(s) to start",
                    0.2,
                )
            except TimeoutError:
                result.notes.append(
                    f"drain round {number}: {len(set(self.starts()) - before)} of {want} "
                    f"big gang(s) started within {s.sizes.drain_timeout:.0f} s"
                )
            elapsed = time.monotonic() - began
            time.sleep(1)  # a gang starting beyond the room freed would show now
            started = sorted(set(self.starts()) - before, key=self.line.index)
            result.drain_rounds.append(started)
            result.drain_seconds.append(elapsed)
            s.log(
                f"  ({s.case.key}) drain round {number}: ended {ending}, "
                f"started {started} in {elapsed:.1f} s"
            )
        result.out_of_order = check_order(self.line, result.drain_rounds)

    def _end(self, gangs: Sequence[str]) -> None:
        """The gangs' pods are deleted at once (grace 0: no kubelet would finish them)."""
        core = self.s.runner.core
        pods = [p for g in gangs for p in self.members[g]]
        with ThreadPoolExecutor(8) as pool:
            for future in [
                pool.submit(core.delete_namespaced_pod, p, self.namespace, grace_period_seconds=0)
                for p in pods
            ]:
                future.result()
        self.deleted.update(gangs)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.s.runner.delete_namespace(self.namespace)


# ---- the whole benchmark ------------------------------------------------------------------


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200, help="fake nodes of 8 CPUs (default 200)")
    parser.add_argument(
        "--big-gangs", type=int, default=1000, help="gangs of 4 x 6 CPUs (default 1000)"
    )
    parser.add_argument(
        "--small-gangs", type=int, default=100, help="gangs of 2 x 100m (default 100)"
    )
    parser.add_argument(
        "--cases",
        default="cqkd",
        help="which schedulers, bench/e2e.py's keys c, q, d, and k: q with waiting gangs held "
        "(default cqkd)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="small-gang batches each way (default 1)"
    )
    parser.add_argument("--drain-rounds", type=int, default=3, help="drain rounds (default 3)")
    parser.add_argument(
        "--drain-gangs",
        type=int,
        default=2,
        help="running big gangs ended per drain round (default 2)",
    )
    parser.add_argument(
        "--aging-seconds",
        type=float,
        default=5,
        help="gang-extender's --gang-aging-seconds (default 5)",
    )
    parser.add_argument(
        "--line-timeout",
        type=float,
        default=1200,
        help="how long the big gangs may take to settle (running bound, the rest turned away) "
        "before the bench measures anyway, with a note (default 1200 s)",
    )
    parser.add_argument("--qps", type=int, default=2000, help="kube-scheduler client QPS and burst")
    parser.add_argument("--label", default="development machine", help="what machine this is")
    parser.add_argument(
        "--write", action="store_true", help="update BENCHMARKS.md's deepline section"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="leave the bench cluster running")
    parser.add_argument(
        "--extender-arg", action="append", default=[], help="extra flag for gang-extender serve"
    )
    args = parser.parse_args(argv)
    unknown = set(args.cases) - set(MODES)
    if unknown or not args.cases:
        parser.error(f"--cases: {''.join(sorted(unknown)) or 'none'} not among {''.join(MODES)}")
    for name in ("nodes", "big_gangs", "small_gangs", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.nodes < BIG_SIZE:
        parser.error(f"--nodes must be at least {BIG_SIZE} (a big gang's members)")
    sizes = Sizes(
        big_gangs=args.big_gangs,
        small_gangs=args.small_gangs,
        rounds=args.rounds,
        drain_rounds=args.drain_rounds,
        drain_gangs=args.drain_gangs,
        aging_seconds=args.aging_seconds,
        line_timeout=args.line_timeout,
    )
    began = time.monotonic()
    load = load_average()
    measured = commit()
    log: Callable[[str], None] = lambda m: print(m, flush=True)  # noqa: E731
    bench = e2e.start_bench_cluster(0, qps=args.qps, log=log)
    bench.runner.settle_seconds = 10
    e2e.add_nodes(bench.lc, 1, args.nodes, NODE_SHAPE)
    log(f"{args.nodes} nodes of {NODE_SHAPE['cpu']} CPUs")
    cluster = bench.cluster
    modes: list[ModeResult] = []
    try:
        for key in args.cases:
            case = case_of(key)
            extender: e2e.Extender | None = None
            if case.extender:
                # The held mode's extender holds; its webhook is served for the flag's sake
                # (the bench creates the members as the webhook leaves them).
                webhook = str(bench.extender_port + 1)  # where hack/local-cluster expects it
                held = ["--hold-waiting-gangs", "true", "--webhook-port", webhook]
                # A fresh extender per scheduler: no line left from the one before.
                extender = e2e.Extender(
                    cluster.kubeconfig,
                    bench.extender_port,
                    bench.layout.logs / f"deepline-extender-{key}.log",
                    [
                        "--gang-aging-seconds",
                        f"{args.aging_seconds:g}",
                        *(held if key == HELD else ()),
                        *args.extender_arg,
                    ],
                    REPO,
                )
                cluster.extender_pid = extender.process.pid
            try:
                log(f"case ({key}) {MODES[key]}")
                modes.append(Scenario(bench.runner, case, sizes, args.nodes, log=log).run())
            finally:
                if extender is not None:
                    extender.stop()
                    cluster.extender_pid = None
    finally:
        if not args.keep:
            bench.down()
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "label": args.label,
        "command": " ".join(argv if argv is not None else sys.argv[1:]) or "defaults",
        "duration": time.monotonic() - began,
        "commit": measured,
        "machine": machine_description(),
        "load": load,
        "kube_version": bench.lc.toolchain.read_versions()["KUBE_VERSION"],
        "python": platform.python_version(),
        "aging_seconds": args.aging_seconds,
        "small_gangs": args.small_gangs,
        "rounds": args.rounds,
        "modes": modes,
    }
    section = render_markdown(report)
    print()
    print(section)
    if args.write:
        text = e2e.BENCHMARKS_MD.read_text()
        e2e.BENCHMARKS_MD.write_text(e2e.replace_marked_section(text, section, MD_BEGIN, MD_END))
        print(f"updated {e2e.BENCHMARKS_MD}")
    if args.json:
        write_json(args.json, {**report, "modes": [asdict(m) for m in modes]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
