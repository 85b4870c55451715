"""A gang's preemption plan: the slots its members go to, the victims, and where it stands.

A plan is made once for the whole gang and answers every member's preempt
call until it ends; its phase tells /debug and the logs how far it got.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.groups import GroupRef
from app.core.preemption.victims import VictimCandidate
from app.core.resources import Resources, add, fits, subtract
from app.core.state import ClusterState
from app.core.topology.domains import Domain
from app.core.topology.subgroups import Path

# A victim handed to our own evictor this recently is not handed to kube-scheduler: to_hand.
REHAND_SECONDS = 15.0
# A victim handed to kube-scheduler this long ago and not being deleted is ours to evict:
# its preemption failed (stalled).
STALLED_SECONDS = 10.0


class PlanKind(StrEnum):
    PREEMPTION = "preemption"  # made by the preempt verb: slots on nodes, victims per slot
    RECLAIM = (
        "reclaim"  # queue reclaim (app/runtime/queues/reclaimer.py): whole gangs evicted, no slots
    )


class PlanPhase(StrEnum):
    PLANNED = "planned"  # made; no victim handed to kube-scheduler yet
    EVICTING = "evicting"  # victims handed, some still on their nodes
    PLACING = "placing"  # every victim gone: members are being placed
    DONE = "done"  # the gang holds minMember (bound or reserved)
    EXPIRED = "expired"
    CANCELLED = "cancelled"


ENDED = frozenset({PlanPhase.DONE, PlanPhase.EXPIRED, PlanPhase.CANCELLED})


@dataclass(slots=True)
class Slot:
    """Room for one member on one node; the first slot on a node carries its victims."""

    node: str
    requests: Resources
    victims: tuple[str, ...]
    # uid of the member this slot was given to ("" while nobody asked for it).
    member: str = ""
    # A gang made of groups: the sub-groups of the member it was planned for (only a
    # member of the same sub-groups takes it, so each lands in its sub-group's domain).
    path: Path = ()
    # Key of the member the planner placed here (its placement rules fit the node):
    # the first choice to nominate for it (app/runtime/preemption/nominations.py).
    planned: str = ""
    # What the member draws of each shared device pool (by name), as the plan drew it over
    # the room its victims leave: held from gangs planning at the same or a lower priority
    # while the slot is open (app/runtime/preemption/room.py).
    pools: dict[str, Resources] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    ref: GroupRef
    priority: int
    made_at: float
    deadline: float
    slots: list[Slot]
    # victim uid -> (pod key, node): every victim of the plan.
    victims: dict[str, tuple[str, str]]
    evictions: int
    phase: PlanPhase = PlanPhase.PLANNED
    reason: str = ""
    handed: set[str] = field(default_factory=set)
    # Victims handed to the extender's own evictor (unasked.py): uid -> when (see to_hand).
    ours: dict[str, float] = field(default_factory=dict)
    # Victims handed to kube-scheduler: uid -> when first (see stalled).
    theirs: dict[str, float] = field(default_factory=dict)
    # The topology domain every slot is in (None: the gang has no topology constraint).
    domain: Domain | None = None
    kind: PlanKind = PlanKind.PREEMPTION
    # A gang made of groups: member key -> its sub-groups' path, and each
    # constrained sub-group's planned domain.
    paths: dict[str, Path] = field(default_factory=dict)
    groups: dict[Path, Domain] = field(default_factory=dict)

    @property
    def group(self) -> str:
        return self.ref.key

    @property
    def live(self) -> bool:
        return self.phase not in ENDED

    def slot_for(self, member: str, key: str, requests: Resources) -> Slot | None:
        """The member's slot (uid `member`, pod `key`): the one given to it before, else the
        first open slot of its shape (victims first), given to it now; None: none left."""
        mine = next((s for s in self.slots if s.member == member), None)
        if mine is not None:
            return mine
        path = self.paths.get(key, ())
        open_slots = [
            s for s in self.slots if not s.member and s.requests == requests and s.path == path
        ]
        if not open_slots:
            return None
        slot = min(open_slots, key=lambda s: (not s.victims, s.node))
        slot.member = member
        return slot

    def hand(self, uids: Iterable[str], now: float, ours: bool) -> None:
        """These victims are handed out (to kube-scheduler, or with `ours` to our evictor)."""
        self.handed.update(uids)
        if ours:
            self.ours.update(dict.fromkeys(uids, now))
        else:
            for uid in uids:
                self.theirs.setdefault(uid, now)
        if self.phase is PlanPhase.PLANNED:
            self.phase = PlanPhase.EVICTING

    def describe(self) -> str:
        if self.kind is PlanKind.RECLAIM:
            names = sorted(key for key, _node in self.victims.values())
            return f"{self.evictions} eviction(s) by queue reclaim: {', '.join(names)}"
        by_node: dict[str, list[str]] = {}
        members: dict[str, int] = {}
        for slot in self.slots:
            members[slot.node] = members.get(slot.node, 0) + 1
        for key, node in self.victims.values():
            by_node.setdefault(node, []).append(key.rsplit("/", 1)[-1])
        parts = [
            f"{node} ({members[node]} member(s)"
            + (
                f", evicting {', '.join(sorted(by_node[node]))})"
                if node in by_node
                else ", free room)"
            )
            for node in sorted(members)
        ]
        # Victims where no member goes: they hold devices of a shared pool the members draw on.
        parts += [
            f"{node} (evicting {', '.join(sorted(by_node[node]))} for a shared device pool)"
            for node in sorted(by_node)
            if node not in members
        ]
        text = f"{self.evictions} eviction(s) for {len(self.slots)} member(s): " + "; ".join(parts)
        if self.groups:
            ordered = sorted(self.groups.items(), key=lambda item: (len(item[0]), item[0]))
            text += "; sub-groups: " + ", ".join(
                f"{path[-1]} in {domain.describe()}" for path, domain in ordered
            )
        return text

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "group": self.group,
            "kind": self.kind.value,
            "phase": self.phase.value,
            "priority": self.priority,
            "evictions": self.evictions,
            "ageSeconds": round(now - self.made_at, 2),
            "deadlineSeconds": round(self.deadline - now, 2),
            "slots": [
                {
                    "node": s.node,
                    "victims": [self.victims[v][0] for v in s.victims],
                    "member": s.member,
                    "subGroup": "/".join(s.path),
                }
                for s in self.slots
            ],
            "reason": self.reason,
            "domain": self.domain.to_json() if self.domain is not None else None,
            "subGroups": {
                "/".join(path): domain.to_json() for path, domain in sorted(self.groups.items())
            },
        }


@dataclass(frozen=True, slots=True)
class Answer:
    """What the preempt verb sends back for a gang member, and why (for the log)."""

    candidates: list[VictimCandidate]
    message: str
    # No plan was made for the gang on the extender's view: refused, or its room needs no
    # eviction. Either is asked again as that view changes (app/runtime/preemption/
    # refusals.py); an answer from a live plan is not.
    unplanned: bool = False


def still_there(state: ClusterState, uid: str) -> bool:
    """Is this victim still on its node (so evicting it is still to come)?"""
    pod = state.pod_by_uid(uid)
    return pod is not None and bool(pod.placed_node) and not pod.terminal


def to_hand(state: ClusterState, plan: Plan, victims: Iterable[str], now: float) -> list[str]:
    """The victims to hand a member's preempt call: those still on their node, but for any
    the extender's own evictor was handed in the last REHAND_SECONDS (unasked.py, a
    preemption kube-scheduler did not start). kube-scheduler v1.37's asynchronous
    preemption ignores a victim's deletion that reaches it before its own delete call for
    that victim is made, then finds the pod gone and does not retry the preemptor: a victim
    our evictor is deleting must not be handed to it too. One still there after that long
    is handed (that deletion failed). A victim handed to kube-scheduler before is handed
    again: kube-scheduler itself does not preempt twice while a victim it chose leaves."""
    return [
        uid
        for uid in victims
        if still_there(state, uid) and now - plan.ours.get(uid, -REHAND_SECONDS) >= REHAND_SECONDS
    ]


def stalled(state: ClusterState, plan: Plan, now: float) -> tuple[list[str], float | None]:
    """The victims first handed to kube-scheduler STALLED_SECONDS ago or more that are
    still on their node and not being deleted, and in how many seconds the next one
    handed to it would be (None: none is left to watch).

    kube-scheduler v1.37 deletes a preempt answer's victims asynchronously, marking each
    (DisruptionTarget) first. When a write of that fails it deletes nothing and retries
    the preemptor at once: the API server restarting, it may not come back for minutes
    (the soak's seed 5); a policy refusing its mark, it retries for ever, handed the same
    victims each time. Meanwhile the plan holds the room for its gang. Such victims are
    evicted by the extender (unasked.py), as the plan's: a deletion of ours racing one
    of its attempts costs nothing then, as it retries on its own error and the plans
    wake the gang's members once the victims are gone."""
    due: list[str] = []
    nearest: float | None = None
    for uid, at in plan.theirs.items():
        pod = state.pod_by_uid(uid)
        if pod is None or not pod.placed_node or pod.terminal or pod.deleting:
            continue
        if now - plan.ours.get(uid, -REHAND_SECONDS) < REHAND_SECONDS:
            continue  # our evictor is on it (or was, and failed: handed again later)
        left = at + STALLED_SECONDS - now
        if left <= 0:
            due.append(uid)
        else:
            nearest = left if nearest is None else min(nearest, left)
    return due, nearest


def slot_filled(state: ClusterState, slot: Slot) -> bool:
    """Has the member given this slot landed (its room is no longer a promise)?"""
    if not slot.member:
        return False
    member = state.pod_by_uid(slot.member)
    return member is not None and bool(member.placed_node)


def room_taken(state: ClusterState, plan: Plan) -> str | None:
    """A node where the plan's slots no longer fit beside the pods staying there (None: they
    all still fit). Staying: every pod but the plan's victims, pods on their way out and
    the gang's own members (their slots count instead; a member may take any slot of its
    node). Pods placed there since took the room: kube-scheduler placed them before it
    saw the members' nominations (the API server slow, the members held in line), or the
    extender's view lagged when it planned. Waiting for the plan's deadline would keep
    the gang off room it could get now by evicting them: the plan ends and the next try
    plans again."""
    need: dict[str, Resources] = {}
    for slot in plan.slots:
        member = state.pod_by_uid(slot.member) if slot.member else None
        if member is None or member.placed_node in ("", slot.node):
            add(need.setdefault(slot.node, {}), slot.requests)
    leaving = state.leaving
    for node, wanted in need.items():
        record = state.nodes.get(node)
        if record is None:
            continue  # a node gone ends the plan by itself
        free = dict(record.allocatable)
        subtract(free, state.requested_on(node))
        for pod in state.pods_on(node):
            own = pod.group is not None and pod.group.key == plan.group
            if own or pod.key in leaving or pod.uid in plan.victims:
                add(free, pod.requests)
        if not fits(wanted, free):
            return node
    return None
