"""The line: gangs turned away for capacity, waiting to be admitted as a whole.

A gang joins the line when the arbiter turns it away, and keeps the time it
first did (aging, app/core/contention.py) even when a claim it got later is
released. The line's gangs are the `Gang` inputs of the pure decision; each
is built from the members the cluster state holds, plus the pod being
filtered when the watch has not delivered it yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.admission import Admission, wholeness
from app.core.backfill import Remainders
from app.core.clock import wall
from app.core.contention import (
    Contest,
    Gang,
    Holder,
    Walked,
    order_line,
)
from app.core.fit_now import Nominated, fit_now
from app.core.groups import GroupRef, GroupSpec
from app.core.line_look import held_for
from app.core.packing import Bin, Demand
from app.core.placement import placement_of
from app.core.records import PodRecord, delivered
from app.core.resources import QuantityError
from app.core.state import ClusterState
from app.core.topology.domains import TopologyConstraint
from app.core.topology.subgroups import Slicing
from app.runtime.claims import Claim, ClaimLedger
from app.runtime.gang_topology import GangTopology
from app.runtime.line_gangs import LineGangs, Waiting
from app.runtime.line_pass import LineAt
from app.runtime.line_walk import LineWalk
from app.runtime.queues.book import Assessment, QueueBook
from app.runtime.queues.tally import podgroup_created
from app.runtime.revision import Revision

# Node names listed per aged gang under the line's `heldFor` in /debug/gangs.
_HELD_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Candidate:
    """The pod the filter verb is deciding about (it may not be in our watch yet)."""

    key: str
    uid: str
    priority: int
    raw_spec: Mapping[str, Any]
    # Kueue's topology annotations on the pod (it may not be in our watch yet).
    topology: TopologyConstraint | None = None
    # Kueue's podset slices on the pod, its rank and its Volcano task (its sub-group).
    slicing: Slicing | None = None
    rank: int | None = None
    task: str = ""
    labels: Mapping[str, str] | None = None


class Line:
    """Who waits, and the Gang each of them is now.

    A gang is either in line or holding a claim (app/runtime/claims.py), never
    both: the line is what aging, wake-ups and backfill work from.
    """

    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        topology: GangTopology,
        queues: QueueBook | None,
        revision: Revision,
        ledger: ClaimLedger,
    ) -> None:
        self._state = state
        # The gangs holding a claim are out of line.
        self._ledger = ledger
        self._admission = admission
        self._topology = topology
        self._queues = queues
        self._revision = revision
        # Who waits and the gangs in line, kept between calls.
        self._line = LineGangs(state, admission, topology, ledger, self._build, lambda: self.queues)
        # The last line assess() paired with its gangs' queues: (line, default queue, pairs).
        self._pairs: tuple[Sequence[Gang], str | None, list[tuple[Gang, str]]] | None = None
        # What an aged gang ahead can never use per node, kept between calls.
        self._remainders = Remainders(self._staying_on, state.nodes_changed_since)
        # The walk of the line a fresh gang is admitted behind, kept between calls
        # (warmed ahead in slices by app/runtime/line_warmup.py).
        self.walk = LineWalk()

    @property
    def waiting(self) -> dict[str, Waiting]:
        """Who waits: group key -> its entry."""
        return self._line.waiting

    @waiting.setter
    def waiting(self, entries: dict[str, Waiting]) -> None:
        self._line.waiting = entries

    def _staying_on(self, node: str) -> list[Mapping[str, int]]:
        """The requests of the pods on `node` not on their way out (backfill's remainders)."""
        leaving = self._state.leaving
        return [p.requests for p in self._state.pods_on(node) if p.key not in leaving]

    @property
    def queues(self) -> QueueBook | None:
        """The queue book, once a Queue object exists; None: queues play no part."""
        return self._queues if self._queues is not None and self._queues.active else None

    def join(self, key: str, ref: GroupRef, now: float) -> None:
        """The gang was turned away: it waits from now, unless it waits already."""
        if key not in self.waiting:
            self.waiting[key] = Waiting(ref, now)
            self._revision.bump()

    def rejoin(self, key: str, claim: Claim, *, failed: bool) -> None:
        """Its claim ended without binding: back in line, keeping its place for aging; counted
        when its attempt `failed` (line_gangs.KEEPS_PLACE_FAILURES), not when it gave way."""
        self.waiting[key] = Waiting(claim.ref, claim.waiting_since, claim.failed + failed)

    def leave(self, key: str) -> tuple[float, int] | None:
        """The gang was admitted: since when it had waited and how many of its attempts had
        failed in a row (None: it never waited)."""
        entry = self.waiting.pop(key, None)
        return (entry.since, entry.failed) if entry is not None else None

    def gang(
        self,
        spec: GroupSpec,
        pod: Candidate | None,
        members: Sequence[PodRecord] | None = None,
    ) -> Gang:
        """The gang as the decision sees it: its members not placed yet, its priority and age.

        `members`: the state's members of the group, when the caller has them
        already (the line reads a thousand gangs per fresh admission).
        """
        if members is None:
            members = self._state.members(spec.key)
        demands = [Demand(p.key, p.requests, p.placement) for p in members if not p.placed_node]
        placed = wholeness(spec, len(members) - len(demands))
        priority = max((p.priority for p in members), default=0)
        if pod is not None:
            priority = max(priority, pod.priority)
            if not delivered(members, pod.uid):
                namespace = pod.key.partition("/")[0]
                with contextlib.suppress(QuantityError):
                    requests = self._state.devices.unseen_requests(namespace, pod.key, pod.raw_spec)
                    demands.append(Demand(pod.key, requests, placement_of(pod.raw_spec)))
        created = podgroup_created(self._state, spec.key, 0.0) or min(
            (p.created for p in members if p.created), default=wall()
        )
        waiting = self.waiting.get(spec.key)
        book = self.queues
        share = book.share(p for p in members if p.placed_node) if book is not None else 0.0
        return Gang(
            key=spec.key,
            priority=priority,
            created=created,
            demands=tuple(demands),
            need=min(len(demands), placed.missing),
            waiting_since=waiting.since if waiting is not None else None,
            share=share,
            packer=self._topology.packer(spec, pod, members),
        )

    def gangs(self, exclude: str, free: list[Bin] | None = None) -> list[Gang]:
        """The gangs in line that take part in decisions (any order); see LineGangs.gangs."""
        return self._line.gangs(exclude, free)

    def learn(self, most: int) -> bool:
        """Build or redo at most `most` gangs in line that changed, as gangs() would (a slice
        of the warm-up, app/runtime/line_warmup.py); True: every one is current."""
        return self._line.learn(most)

    def _build(self, spec: GroupSpec, members: Sequence[PodRecord]) -> Gang:
        return self.gang(spec, None, members)

    def contest(self, exclude: str) -> Contest:
        """What a decision about gang `exclude` weighs (\"\": waking the line)."""
        state = self._state
        free = state.room()
        return Contest(
            free,
            self._ledger.holders(),
            self.gangs(exclude, free),
            state.allocatable_bins(),
            state.room_positions(),
            self._remainders,
        )

    def walked(
        self, contest: Contest, now: float, aging_seconds: float, candidate: Gang
    ) -> Walked | None:
        """The room the gangs of `contest.line` ahead of `candidate` leave it, from the walk
        kept between calls (app/runtime/line_walk.py)."""
        return self.walk.walked_for(LineAt.of(contest, now, aging_seconds), candidate)

    def assess(
        self, gang: Gang | None, queue: str, line: Sequence[Gang], holders: Sequence[Holder]
    ) -> Assessment:
        """QueueBook.assess() with the queue of each gang in `line` (the candidate's if unknown)."""
        book = self.queues
        assert book is not None
        pairs = self._kept_pairs(line, queue)
        if pairs is None:
            pairs = self._keep_pairs(
                line, queue, [(g, self._line.queue_of(g.key, "")) for g in line]
            )
        return book.assess(gang, queue, pairs, holders)

    def allowed_steps(
        self, line: Sequence[Gang], holders: Sequence[Holder], most: int
    ) -> Iterator[list[Gang] | None]:
        """assess(None, "", line, holders).line a slice at a time (QueueBook.admitted_steps):
        yields None after every `most` gangs paired with their queue or judged, then the gangs
        let in; kept as assess() keeps them, for the admissions after it (the warm-up's)."""
        book = self.queues
        assert book is not None
        pairs = self._kept_pairs(line, "")
        if pairs is None:
            pairs = []
            queue_of = self._line.queue_of
            for start in range(0, len(line), most):
                pairs += [(g, queue_of(g.key, "")) for g in line[start : start + most]]
                yield None
            pairs = self._keep_pairs(line, "", pairs)
        yield from book.admitted_steps(pairs, holders, most)

    def _kept_pairs(self, line: Sequence[Gang], queue: str) -> list[tuple[Gang, str]] | None:
        """The pairs kept for this very line (the book's memo knows the list), if they serve a
        candidate of `queue`; None: pair the line again."""
        kept = self._pairs
        if kept is not None and kept[0] is line and kept[1] in (None, queue):
            return kept[2]
        return None

    def _keep_pairs(
        self, line: Sequence[Gang], queue: str, pairs: list[tuple[Gang, str]]
    ) -> list[tuple[Gang, str]]:
        """`pairs` (each gang of `line` and its known queue) kept for the calls after this one."""
        # The candidate's queue stands in only for a gang of no known queue (none, when
        # the line comes from gangs()): else the pairs serve every candidate alike.
        if any(not name for _, name in pairs):
            pairs = [(g, name or queue) for g, name in pairs]
            self._pairs = (line, queue, pairs)
        else:
            self._pairs = (line, None, pairs)
        return pairs

    def wake_steps(
        self, now: float, aging_seconds: float, limit: int, slice_size: int
    ) -> Iterator[list[str] | None]:
        """The first `limit` gangs in line that would be admitted now, in line order, found
        `slice_size` gangs of the line at a time (app/core/line_look.py wake_steps): the
        line and the room as they are now, walked while the event loop serves others; from
        the walk kept between calls (app/runtime/line_walk.py)."""
        over = LineAt.of(self._wake_contest(), now, aging_seconds)
        return self.walk.wake_steps(over, limit, slice_size)

    def fit_now(self, keys: Sequence[str]) -> list[str]:
        """Of `keys` (gangs in line the look chose, in line order), those that fit together in
        the room kube-scheduler sees free now (app/core/fit_now.py): a held gang is released
        only then, since its gate cannot be put back."""
        contest = self.contest(exclude="")
        by_key = {g.key: g for g in contest.line}
        gangs = [g for key in keys if (g := by_key.get(key)) is not None]
        nominated = [
            Nominated(p.group.key if p.group is not None else "", p.priority, node, p.requests)
            for p in self._state.nominated.values()
            if (node := p.nominated_node)
        ]
        return fit_now(gangs, self._state.room(leaving=False), contest.holders, nominated)

    def _wake_contest(self) -> Contest:
        contest = self.contest(exclude="")
        if self.queues is not None:
            contest.line = self.assess(None, "", contest.line, contest.holders).line
        return contest

    def snapshot(self, now: float, aging_seconds: float) -> list[dict[str, Any]]:
        """For /debug/gangs: who waits, in line order; per aged gang, where it holds room back.

        `heldFor`: the nodes where an aged gang that does not fit keeps the
        gangs behind it from what its members can use (they may take the rest),
        or why it holds none.
        """
        contest = self.contest(exclude="")
        held = held_for(contest, now, aging_seconds)
        line: list[dict[str, Any]] = []
        for g in order_line(contest.line, now, aging_seconds):
            entry: dict[str, Any] = {
                "group": g.key,
                "priority": g.priority,
                "waitingSeconds": round(now - (g.waiting_since or now), 2),
                "aged": g.aged(now, aging_seconds),
            }
            if g.denied:  # its last attempt failed: not admitted until the denial expires
                entry["denied"] = True
            if g.key in held:
                nodes, why = held[g.key]
                entry["heldFor"] = {"nodes": nodes[:_HELD_SHOWN], "nodeCount": len(nodes)}
                if why:
                    entry["heldFor"]["why"] = why
            line.append(entry)
        return line
