"""Gang-aware preemption: the one owner of what is evicted, for whom, and until when.

kube-scheduler's DefaultPreemption picks, per node, the lowest-priority pods
whose removal lets the preemptor fit, then asks extenders to confirm. It
knows nothing of gangs. For a **plain preemptor** we only refuse candidates
that would break a running gang (app/runtime/preemption/plain.py);
kube-scheduler orders the survivors. For a **gang member** the first preempt
call makes one plan for the whole gang (app/runtime/preemption/plan_maker.py: the nodes
its missing members go to and the fewest victims on them), and every member's
call is answered from that plan: a member gets its planned node with that
node's victims, or nothing when its room is free or being freed already. No
new victims while the plan lives; it is made again only once it ended (done,
expired, or cancelled because a fact it rested on changed: app/runtime/preemption/plan_book.py).

Every other component asks `PreemptionPlans` instead of keeping preemption
state: the gate whether a waiting pod is a victim (`is_victim`), the
evictor whom a victim made room for (`beneficiary`), /debug the live
plans. It wakes the members waiting for room when their victims are gone,
including victims kube-scheduler only held (never bound), whose deletion
it does not treat as a reason to retry the preemptor. No I/O of its own:
the waker and the observers do the writing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.base.metrics import Metrics
from app.core.clock import Clock, monotonic
from app.core.groups import GroupRef, GroupSpec
from app.core.observer import GangObserver, NullObserver
from app.core.packing import Demand
from app.core.preemption.victims import Preemptor, VictimCandidate, VictimPolicy
from app.core.records import PodRecord
from app.core.resources import Resources
from app.core.state import ClusterState
from app.core.topology.domains import DEFAULT_LEVELS
from app.runtime.preemption.line_check import LineCheck
from app.runtime.preemption.nominations import Nominations, PodNominator
from app.runtime.preemption.plain import PlainPreemption
from app.runtime.preemption.plan import Answer, Plan, PlanKind, still_there, to_hand
from app.runtime.preemption.plan_book import PLAN_SECONDS, PlanBook
from app.runtime.preemption.plan_maker import PlanMaker
from app.runtime.preemption.refusals import Refusals
from app.runtime.preemption.room import PreemptionRoom
from app.runtime.preemption.victim_memory import VictimMemory
from app.runtime.preemption.wakeup import PreemptorWakeup
from app.runtime.wakeup import SiblingWaker

__all__ = ["PlanSettings", "PreemptionPlans"]


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """How plans are timed and which topology levels they may be confined to."""

    clock: Clock = monotonic
    plan_seconds: float = PLAN_SECONDS
    levels: tuple[str, ...] = DEFAULT_LEVELS


class PreemptionPlans:
    def __init__(
        self,
        state: ClusterState,
        policy: VictimPolicy,
        metrics: Metrics,
        *,
        waker: SiblingWaker | None = None,
        observer: GangObserver | None = None,
        settings: PlanSettings = PlanSettings(),
    ) -> None:
        told: GangObserver = observer or NullObserver()
        self._state = state
        self._clock = settings.clock
        self._book = PlanBook(state, metrics, told, settings.clock, settings.plan_seconds)
        self._victims = VictimMemory(settings.clock)
        self._room = PreemptionRoom(state, self._book)
        self._plain = PlainPreemption(state, policy, self._victims, self._book, self._room)
        self._maker = PlanMaker(state, policy, self._book, self._room, told, settings.levels)
        self._wakeup = PreemptorWakeup(state, waker)
        self._nominations: Nominations | None = None
        self.refusals = Refusals(settings.clock)  # refused lately, asked again (unasked.py)
        # Told the gang whose victims went to kube-scheduler (unasked.py follows them up).
        self.handed_to_scheduler: Callable[[str], None] = lambda _group_key: None
        # Pods listed once (set by the service)? Before, who is in a gang is not known: the
        self.listed: Callable[[], bool] = lambda: True  # verb, unasked.py, reclaim wait

    @property
    def plans(self) -> dict[str, Plan]:
        """The live plans by gang (checked against the cluster on every question)."""
        return self._book.plans

    # ---- questions from the verb, the gate, the evictor ---------------------------------

    def is_victim(self, uid: str) -> bool:
        return self._victims.is_victim(uid)

    def beneficiary(self, uid: str) -> str | None:
        return self._victims.beneficiary(uid)

    def plain(
        self, preemptor: Preemptor, requests: Resources, candidates: list[VictimCandidate]
    ) -> list[VictimCandidate]:
        """A pod in no gang: the candidates it may take (app/runtime/preemption/plain.py)."""
        self._book.check_all(self._clock())
        return self._plain.candidates(preemptor, requests, candidates)

    def kept_from(self, requests: Resources, priority: int, nodes: Iterable[str]) -> dict[str, str]:
        """A pod in no gang: those of `nodes` whose room live plans keep (PreemptionRoom.kept)."""
        if not self._book.plans:
            return {}
        self._book.check_all(self._clock())
        return self._room.kept_from(requests, priority, nodes)

    def answer(
        self,
        spec: GroupSpec,
        ref: GroupRef,
        preemptor: Preemptor,
        own: Demand,
        candidates: Sequence[VictimCandidate],
        ours: bool = False,
    ) -> Answer:
        """A gang member's preempt call: answered from its gang's plan, made now if none lives;
        `ours`: the extender's own evictor deletes the victims named (unasked.py)."""
        now = self._clock()
        # An expired plan's reservations must not hold room for anyone.
        self._book.check_all(now)
        current = self._book.get(spec.key)
        if current is None:
            made = self._maker.make(spec, ref, preemptor, own, {c.node for c in candidates}, now)
            if isinstance(made, Answer):
                return made
            current = made
        answer = self._serve(current, preemptor, own, candidates, ours)
        self._nominate()
        return answer

    def hand_pool_victims(self, group_key: str) -> list[str]:
        """The victims of the gang's live plan that no member's slot carries, not handed yet.

        Victims freeing devices of a pool published for many nodes
        (app/core/preemption/pool_victims.py) may run where no member is planned:
        no preempt answer names them (kube-scheduler takes a node's victims from
        that node), so the extender's own preemption (unasked.py) deletes them.
        """
        current = self._book.get(group_key)
        if current is None or not current.live or current.kind is not PlanKind.PREEMPTION:
            return []
        on_slots = {uid for slot in current.slots for uid in slot.victims}
        present = [
            uid
            for uid in current.victims
            if uid not in on_slots and uid not in current.handed and still_there(self._state, uid)
        ]
        if not present:
            return []
        current.hand(present, self._clock(), ours=True)
        self._victims.note(present, current.group)
        self._nominate()
        return present

    def stalled_victims(self, group_key: str) -> tuple[list[str], float | None]:
        """Victims kube-scheduler was handed and did not delete, ours now (PlanBook.stalled)."""
        return self._book.stalled(group_key)

    def consult(self, line: LineCheck) -> None:
        """Ask the line (the arbiter) before evicting: no plan for a gang it keeps waiting.
        Set once at start-up (app/server.py): the arbiter is built after the plans."""
        self._maker.line = line

    def nominate_through(self, api: PodNominator) -> Nominations:
        """Nominate every planned member for its node (set once at start-up, app/server.py).

        Without it (unit tests of the plans alone) only kube-scheduler nominates.
        """
        nominations = Nominations(self._state, api, lambda: self._book, clock=self._clock)
        nominations.on_expiry(self.on_nodes_changed)
        self._nominations = nominations
        self._book.end_listeners.append(nominations.sync)
        self._plain.waiters.api = api
        return nominations

    async def stop(self) -> None:
        """No more expiry checks; let the nomination writes under way finish."""
        if self._nominations is not None:
            self._nominations.cancel()
            await self._nominations.drain()
        await self._plain.waiters.drain()

    def lives(self, group_key: str) -> bool:
        """Has this gang a plan that still holds (checked against the cluster now)?"""
        return self._book.lives(group_key)

    def reclaim(self, ref: GroupRef, priority: int, victims: Sequence[PodRecord]) -> None:
        """Queue reclaim evicts `victims` (a whole gang) so that gang `ref` gets room.

        Recorded as the gang's plan: its own preempt calls then wait for this room instead
        of evicting more, /debug shows it, and its members are woken once the victims are
        gone. A preemption plan it had gives way."""
        self._book.reclaim(ref, priority, victims)
        self._victims.note([p.uid for p in victims], ref.key)

    def refuse(self, group_key: str, message: str) -> None:
        """The verb found the gang cannot preempt at all (too few members, denied, ...)."""
        self.refusals.remember(group_key)
        self._maker.refuse(group_key, message)

    def snapshot(self) -> list[dict[str, Any]]:
        now = self._clock()
        self._book.check_all(now)
        return [p.to_json(now) for p in self._book]

    # ---- answering a member from the plan -------------------------------------------------

    def _serve(
        self,
        current: Plan,
        preemptor: Preemptor,
        own: Demand,
        candidates: Sequence[VictimCandidate],
        ours: bool,
    ) -> Answer:
        if current.kind is PlanKind.RECLAIM:
            return Answer(
                [],
                f"gang {current.group} gets its room by queue reclaim ({current.describe()}); "
                "the member waits for it",
            )
        slot = current.slot_for(preemptor.uid, preemptor.key, own.requests)
        if slot is None:
            return Answer(
                [],
                f"gang {current.group}'s preemption plan has no room for this member "
                f"({current.describe()}); it waits for the gang's planned members",
            )
        now = self._clock()
        present = to_hand(self._state, current, slot.victims, now)
        if not present:
            why = "being freed" if slot.victims else "free"
            return Answer([], f"planned room on {slot.node} is {why}; the member waits for it")
        current.hand(present, now, ours)
        self._victims.note(present, current.group)
        if not ours:
            self.handed_to_scheduler(current.group)
        pdb = next((c.num_pdb_violations for c in candidates if c.node == slot.node), 0)
        return Answer(
            [VictimCandidate(slot.node, present, pdb)],
            f"planned node {slot.node}, evicting {len(present)} pod(s)",
        )

    # ---- what the watches tell -------------------------------------------------------------

    def on_nodes_changed(self) -> None:
        self._book.check_all(self._clock())

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """Move plans along as victims leave and members land; wake whoever waits for room."""
        self._follow(old, new)
        if new is not None and new.placed_node and (old is None or not old.placed_node):
            self._book.landed(new, self._clock())
        pod = new or old
        nominations = self._nominations
        if nominations is None or pod is None:
            return
        planned = pod.group is not None and pod.group.key in self._book.plans
        if nominations.concerns(pod) or planned or (new is not None and nominations.adopt(new)):
            nominations.sync()

    def on_pod_placed(self, pod: PodRecord) -> None:
        """A member the extender placed itself (the gate's reservation, its own binding):
        no watch event tells of it, so the gang's plan is checked here, and ends as the
        gang is whole rather than at the next question (app/core/changes.py)."""
        current = self._book.get(pod.group.key) if pod.group is not None else None
        if current is not None and pod.placed_node:
            self._book.check(current, self._clock())

    def _nominate(self) -> None:
        if self._nominations is not None:
            self._nominations.sync()

    def _follow(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if old is None:
            return
        gone = new is None or new.terminal or (not new.placed_node and bool(old.placed_node))
        if new is None and old.preempted and not old.node_name:
            # A victim that was only held (never bound) is gone: see PREEMPTOR_RETRY_SECONDS.
            self._wakeup.held_victim_gone()
        current = self._book.get(old.group.key) if old.group is not None else None
        if current is not None:
            # A member bound by another hand than ours, or leaving: the gang may be whole,
            # or have no pod left to keep room for.
            landed = new is not None and bool(new.placed_node) and new.node_name != old.node_name
            if landed or gone or (new is not None and new.deleting):
                self._book.check(current, self._clock())
            if new is not None:
                return
        if not gone or not self._book.plans:
            return
        for current in self._book:
            if old.uid in current.victims:
                self._book.check(current, self._clock())
                if not any(still_there(self._state, uid) for uid in current.victims):
                    # Every victim gone: the members answered "wait" sit in
                    # kube-scheduler's unschedulable queue.
                    self._wakeup.room_freed(current.group)
            for slot in current.slots:
                if slot.member == old.uid and new is None:
                    slot.member = ""
