"""What the soak created, what the API server shows of it, and the invariants checked on it.

`World` remembers every gang and plain pod the stream made (a plain pod is a
gang of one for the checks). `Monitor` lists the soak's namespace every
0.3 s on its own thread: no gang may be bound below its minimum (a binding
wave takes milliseconds; a partial state lasting WAVE_SECONDS is a
violation), no gang required to keep to one rack is bound across two, and
it notes when each gang first held its minimum (time to place). `fitting`
says which pending gangs fit the room the API server shows
(tests/preemption_oracle.py, exhaustive), the liveness check's question; for
a gang required to keep to one rack, the cheapest rack (the one its placed
members are in, once it has some).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.core.groups import NATIVE_API, VOLCANO_API, group_key
from tests.cluster.kube import Kube
from tests.cluster.test_faults import diff_caches, fresh_caches
from tests.preemption_oracle import Running, fewest_evictions, fewest_evictions_in_one_domain
from tests.soak.stream import HIGH_PRIORITY, RACK_LABEL, Source

# A binding wave completes in milliseconds; a partial gang outliving this is a violation.
WAVE_SECONDS = 2.0
# The pod simulator finishes a deleted bound pod at once (a kubelet would, its containers
# stopped); one terminating longer holds room kube-scheduler cannot use: a harness fault.
TERMINATING_SECONDS = 30.0
# Past this many lower-priority pods on the cluster the exhaustive oracle is not asked.
ORACLE_MAX_CANDIDATES = 40
# The extender's --gang-aging-seconds (default): an aged gang is not overtaken by
# gangs of its priority or lower while it does not fit (README "Gangs under
# contention"); the cluster drains for it, so a gang behind it may wait though it fits.
AGING_SECONDS = 60.0


@dataclass
class Gang:
    name: str
    members: int
    min_member: int
    cpu: int
    priority: int
    source: Source | None  # None: a plain pod
    created_at: float
    step: str
    placed_at: float | None = None
    deleted: bool = False
    # Every member in one rack (required; RACK_LABEL: run.py _join and _create_group).
    rack: bool = False

    @property
    def pods(self) -> list[str]:
        return (
            [self.name]
            if self.source is None
            else [f"{self.name}-{i}" for i in range(self.members)]
        )

    @property
    def preempts(self) -> bool:
        return self.priority >= HIGH_PRIORITY


@dataclass
class Snapshot:
    """The soak's pods and nodes as the API server shows them now."""

    # pod -> node, for pods bound and not being deleted
    placed: dict[str, str]
    # every pod of the namespace (bound or not)
    pods: dict[str, Any]
    # schedulable node -> millicpu allocatable
    nodes: dict[str, int]
    # every node with a rack (cordoned ones too) -> its rack
    racks: dict[str, str] = field(default_factory=dict)

    def racks_of(self, pods: list[str]) -> set[str]:
        """The racks the bound ones of `pods` are in ('' for a node without a rack)."""
        return {self.racks.get(self.placed[p], "") for p in pods if p in self.placed}

    def terminating(self) -> dict[str, str]:
        """Bound pods being deleted -> node: kube-scheduler counts their room as taken until
        they are gone (the pod simulator's final delete, as a kubelet's)."""
        return {
            name: p.spec.node_name
            for name, p in self.pods.items()
            if p.spec.node_name and p.metadata.deletion_timestamp
        }


@dataclass
class World:
    kube: Kube
    namespace: str
    gangs: dict[str, Gang] = field(default_factory=dict)
    # pods the soak itself deleted (not evictions)
    deleted_pods: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)

    def gang_of(self, pod: str) -> Gang | None:
        name = pod if pod in self.gangs else pod.rsplit("-", 1)[0]
        return self.gangs.get(name)

    def live(self) -> list[Gang]:
        return [g for g in self.gangs.values() if not g.deleted]

    def snapshot(self) -> Snapshot:
        pods = {p.metadata.name: p for p in self.kube.pods(self.namespace)}
        placed = {
            name: p.spec.node_name
            for name, p in pods.items()
            if p.spec.node_name and not p.metadata.deletion_timestamp
        }
        listed = self.kube.core.list_node().items
        nodes = {
            n.metadata.name: _millicpu(n.status.allocatable["cpu"])
            for n in listed
            if not n.spec.unschedulable and (n.status.allocatable or {}).get("cpu")
        }
        racks = {
            n.metadata.name: n.metadata.labels[RACK_LABEL]
            for n in listed
            if RACK_LABEL in (n.metadata.labels or {})
        }
        return Snapshot(placed, pods, nodes, racks)

    def placed_count(self, gang: Gang, snap: Snapshot) -> int:
        return sum(1 for pod in gang.pods if pod in snap.placed)

    def pending(self, snap: Snapshot) -> list[Gang]:
        """Gangs below their minimum that still can reach it (enough of their pods exist).

        A plain pod or gang member evicted by a preemptor is gone for good (no
        controller recreates it here): such a gang no longer waits for anything.
        """
        return [
            g
            for g in self.live()
            if self.placed_count(g, snap) < g.min_member
            and sum(1 for p in g.pods if p in snap.pods) >= g.min_member
        ]

    def running(self, snap: Snapshot) -> tuple[list[Running], dict[str, int]]:
        """The oracle's view: each placed pod; the running gangs' mins.

        Pods on cordoned nodes too: they still run and count towards their gang's
        minimum (the oracle neither evicts them nor counts their room, as the nodes
        are not in its allocatable). Left out, a gang with a member on a cordoned
        node looked one short, and evicting its spare member looked forbidden
        (soak seed 4 at 1b1d2c7: "evicted ['gs4-113-2'] for a gang that cannot fit").
        """
        running: list[Running] = []
        mins: dict[str, int] = {}
        for pod, node in sorted(snap.placed.items()):
            gang = self.gang_of(pod)
            if gang is None:
                continue
            in_gang = gang.name if gang.source is not None else None
            running.append(Running(pod, node, {"cpu": gang.cpu}, gang.priority, in_gang))
            if in_gang is not None:
                mins[in_gang] = gang.min_member
        return running, mins

    def need(self, gang: Gang, snap: Snapshot, free_only: bool = False) -> int | str | None:
        """Fewest evictions letting its missing members fit (None: never; str: not asked).

        A gang required to keep to one rack: the cheapest rack, each searched
        with its own nodes and pods only; the rack of its placed members once
        it has some (None when they are in two: the Monitor reports that).
        free_only: in the free room, whatever its priority.
        """
        running, mins = self.running(snap)
        missing = gang.min_member - self.placed_count(gang, snap)
        if missing <= 0:
            return 0
        # Low-priority classes never preempt (preemptionPolicy Never): free room only.
        priority = gang.priority if gang.preempts and not free_only else 0
        lower = sum(1 for r in running if r.priority < priority and r.node in snap.nodes)
        if lower > ORACLE_MAX_CANDIDATES:
            return f"{lower} candidates: too many for the exhaustive oracle"
        alloc = {node: {"cpu": cpu} for node, cpu in snap.nodes.items()}
        for pod, node in snap.terminating().items():
            leaving = self.gang_of(pod)
            if node in alloc and leaving is not None:
                alloc[node]["cpu"] -= leaving.cpu
        # kube-scheduler keeps a nominated pod's room for it against pods of its
        # priority or lower (the extender's planner does too).
        for pod, (node, cpu, nominee) in self.nominated(snap).items():
            if node in alloc and nominee >= gang.priority and pod not in gang.pods:
                alloc[node]["cpu"] -= cpu
        demands = [{"cpu": gang.cpu}] * missing
        if not gang.rack:
            return fewest_evictions(alloc, running, demands, priority, mins)
        pinned = snap.racks_of(gang.pods)
        if len(pinned) > 1:
            return None
        return fewest_evictions_in_one_domain(
            alloc, running, demands, priority, mins, snap.racks, next(iter(pinned), None)
        )

    def nominated(self, snap: Snapshot) -> dict[str, tuple[str, int, int]]:
        """Unplaced pods kube-scheduler nominated: pod -> (node, millicpu, priority)."""
        found: dict[str, tuple[str, int, int]] = {}
        for name, pod in snap.pods.items():
            node = pod.status.nominated_node_name
            gang = self.gang_of(name)
            if node and not pod.spec.node_name and gang is not None:
                found[name] = (node, gang.cpu, gang.priority)
        return found

    def fitting(self, snap: Snapshot) -> list[tuple[Gang, int]]:
        """Pending gangs that fit now (free room, plus evictions for a preemptor), and the cost.

        A gang that waits behind an aged gang of its priority or higher that
        fits the empty cluster is not counted: the extender holds the room
        for that one by design (aging), until the cluster drains for it. An
        aged gang required to keep to one rack holds others back only while
        some rack holds it in the free room: otherwise the extender leaves it
        out of the line (docs/topology.md).
        """
        pending = self.pending(snap)
        now = time.monotonic()
        capacity = sum(snap.nodes.values())
        aged = [
            g
            for g in pending
            if now - g.created_at > AGING_SECONDS
            and g.source is not None
            and g.min_member * g.cpu <= capacity
            and g.min_member * g.cpu <= g.members * max(snap.nodes.values(), default=0)
            and (not g.rack or isinstance(self.need(g, snap, free_only=True), int))
        ]
        found: list[tuple[Gang, int]] = []
        for gang in pending:
            # Plain pods are not in the extender's line: nothing holds them back.
            held = gang.source is not None and any(
                _ahead(other, gang, now) for other in aged if other is not gang
            )
            if held:
                continue
            need = self.need(gang, snap)
            if isinstance(need, int):
                found.append((gang, need))
        return found

    def held_in_line(self, gang: Gang, snap: Snapshot) -> bool:
        """Is the gang behind an aged gang of its priority or higher (see fitting)?"""
        need = self.need(gang, snap)
        return isinstance(need, int) and all(g is not gang for g, _need in self.fitting(snap))

    def waits_by_design(self, gang: Gang, snap: Snapshot) -> str | None:
        """Why a preempting gang not placed in time may rightly wait (None: it may not).

        Behind an aged gang of its priority, the line keeps it waiting. And the
        oracle's verdict at its step is a snapshot: the room it fitted in may be
        taken since by gangs ahead of it whose room was being freed in the same
        moment (another gang's plan evicting, watch events late). Liveness asks
        that a gang that fits is placed: should it fit again, the next checkpoint
        asks that of it.
        """
        if self.held_in_line(gang, snap):
            return "held in line: behind an aged gang of its priority or higher"
        if self.need(gang, snap) is None:
            since = sorted(
                g.name
                for g in self.gangs.values()
                if g.placed_at is not None and g.placed_at >= gang.created_at
            )
            return (
                "no longer fits: the room it fitted in at its step was taken since "
                f"(placed since: {', '.join(since) or 'none'})"
            )
        return None


def _ahead(aged: Gang, other: Gang, now: float) -> bool:
    """Is the aged gang ahead of `other` in the extender's line (priority, aging, age)?"""
    if aged.priority != other.priority:
        return aged.priority > other.priority
    other_aged = now - other.created_at > AGING_SECONDS
    return not other_aged or aged.created_at < other.created_at


def _millicpu(quantity: str) -> int:
    if quantity.endswith("m"):
        return int(quantity[:-1])
    return int(float(quantity) * 1000)


class Monitor:
    """Lists the namespace every 0.3 s: no gang bound below its minimum, none required to keep
    to one rack bound across two; when each was placed."""

    def __init__(self, world: World, step: Callable[[], str]) -> None:
        self.world = world
        self.step = step
        self.samples = 0
        self._stop = threading.Event()
        self._partial_since: dict[str, float] = {}
        self._terminating_since: dict[str, float] = {}
        self._split: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="soak-monitor", daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            # The API server may be down in a fault: look again next time.
            with contextlib.suppress(Exception):
                self.look(self.world.snapshot())
            self._stop.wait(0.3)

    def look(self, snap: Snapshot) -> None:
        now = time.monotonic()
        self.samples += 1
        for gang in self.world.live():
            placed = self.world.placed_count(gang, snap)
            if placed >= gang.min_member and gang.placed_at is None:
                gang.placed_at = now
            if 0 < placed < gang.min_member and not gang.deleted:
                since = self._partial_since.setdefault(gang.name, now)
                if now - since > WAVE_SECONDS:
                    self.world.violation(
                        f"{self.step()}: gang {gang.name} ({gang.step}) bound below its minimum "
                        f"for {now - since:.1f}s: {placed} of {gang.min_member}"
                    )
                    self._partial_since[gang.name] = now  # report again only if it lasts
            else:
                self._partial_since.pop(gang.name, None)
            if gang.rack and gang.name not in self._split:
                racks = snap.racks_of(gang.pods)
                if len(racks) > 1:
                    self._split.add(gang.name)  # reported once: it stays split until deleted
                    self.world.violation(
                        f"{self.step()}: gang {gang.name} ({gang.step}) required to keep to one "
                        f"rack is bound across racks {sorted(racks)}: "
                        + ", ".join(
                            f"{p} on {snap.placed[p]}" for p in gang.pods if p in snap.placed
                        )
                    )
        self._stuck_terminating(snap, now)

    def _stuck_terminating(self, snap: Snapshot, now: float) -> None:
        terminating = snap.terminating()
        for name in [n for n in self._terminating_since if n not in terminating]:
            del self._terminating_since[name]
        for name, node in terminating.items():
            since = self._terminating_since.setdefault(name, now)
            if now - since > TERMINATING_SECONDS:
                self.world.violation(
                    f"{self.step()}: pod {name} on {node} terminating for {now - since:.0f}s: "
                    "the pod simulator did not finish it (its room stays taken)"
                )
                self._terminating_since[name] = now  # report again only if it lasts


def caches_diff(extender_url: str, kube: Kube) -> str:
    """'' when the extender's /debug/caches equals a fresh list of every source's PodGroups.

    tests/cluster/test_faults.py's `fresh_caches` lists x-k8s PodGroups; the
    soak makes Volcano and native ones too (keyed `source:namespace/name`).
    """
    with urllib.request.urlopen(f"{extender_url}/debug/caches", timeout=10) as response:
        cached = json.loads(response.read())
    fresh = fresh_caches(kube)
    for api in (VOLCANO_API, NATIVE_API):
        items = kube.custom.list_cluster_custom_object(api.group, api.version, api.plural)["items"]
        for g in items:
            meta = g["metadata"]
            fresh["podgroups"][group_key(api.source, meta["namespace"], meta["name"])] = meta["uid"]
    return diff_caches(cached, fresh)
