"""Preemption kube-scheduler never starts for a gang: the extender starts it.

kube-scheduler asks an extender's preempt verb only about the nodes its own
dry run found victims on, one pod at a time. Some gangs get none, or a wrong
answer nobody asks again:

- A gang short of DRA devices. kube-scheduler's DynamicResources plugin
  answers a pod whose claims it cannot allocate on a node with
  UnschedulableAndUnresolvable ("cannot allocate all claims", checked on
  v1.37.2): kube-scheduler then runs no preemption and calls neither the
  extender's filter nor its preempt verb for the pod.
- A gang whose members each fit alone, without evicting anyone, while the
  whole gang does not (the soak's stall, issue 49): the filter turns every
  member away ("needs N more member(s) placed at once"), and the dry run
  finds that each member would fit somewhere with no victim, so it finds no
  candidate ("preemption: 0/N nodes are available"). A high-priority gang
  would wait for lower-priority work to end by itself.
- A gang of Kubernetes' own PodGroups (a flat one or a CompositePodGroup
  tree). kube-scheduler (gate GenericWorkload) sends its pods through its
  pod-group cycle, whose preemption (DefaultPreemption's PodGroupPostFilter,
  framework/preemption/podgrouppreemption.go in v1.37.2) asks no extender: it
  removes every lower-priority pod from its snapshot and re-runs the cycle,
  whose extender filter, reading the cluster as it is, still refuses. And
  the cycle's verdict names no preemption: with GangScheduling's
  PlacementFeasible (the shipped profiles enable its PreEnqueue, which brings
  it) "0/N placements are available ... minCount cannot be satisfied"; in a
  profile with GangScheduling off at every point, for a gang with a topology
  key whose domains the filter left without a node, every placement
  "succeeds" with no pod and the PodGroupPodsCount placement scorer fails
  ("no pods from pod group are assigned to any of the candidate
  placements", reason SchedulerError, retried with backoff). So for these
  pods the verdict is one of those, or the filter's own refusal for want of
  room (whole gang or topology domain).

- A gang the preempt verb refused on a view that lagged kube-scheduler's:
  pods already gone, still in the extender's caches, held the room (or a
  member was not in them yet; or pods already bound were not, and the verb
  found the room free). kube-scheduler parks the members until an event
  frees room, and it has seen those events already; ours arrive later. A
  gang the verb found no plan for is asked again when a pod takes or leaves
  room on a node, or one of its members arrives, in the extender's view,
  for a minute after the verb's answer (app/runtime/preemption/refusals.py).

- A gang member whose preempt call got no answer (the extender restarting):
  kube-scheduler parks it as if nothing could be evicted ('preemption: Post
  ".../preempt": ... connection refused') and asks again only on an event its
  filters' hints accept.

- A preemption kube-scheduler started and dropped: it deletes a preempt
  answer's victims asynchronously, and when a write of that fails (the API
  server restarting) it deletes none and does not retry; the member, parked as
  unschedulable, may not be asked again for minutes while the gang's plan
  holds its room. Victims handed to kube-scheduler and not being deleted
  STALLED_SECONDS later (app/runtime/preemption/plan.py) are evicted here
  (`follow`).

So when a gang member whose pod may preempt is reported unschedulable for
any of these reasons, or a refused gang's view changes, this asks the one owner of preemption
(app/runtime/preemption/plans.py) for the gang's plan as the preempt verb
does, with every schedulable node a candidate, and deletes the victims the
plan names for each waiting member, as kube-scheduler deletes the victims of
a preempt answer. The plan's rules hold unchanged: only pods of lower
priority, the fewest evictions (devices count like any resource: a victim's
requests hold its claims' devices), budgets of running gangs, no plan for a
gang the line keeps waiting; under --gang-victim-policy=whole-gang a
victim's gang goes whole. Once the victims are gone the plan's members are
woken, and kube-scheduler's next try places them.
"""

from __future__ import annotations

import asyncio
import logging

from app.base.tasks import TaskSet
from app.core.admission import Admission, wholeness
from app.core.clock import monotonic
from app.core.groups import SOURCE_NATIVE, PodGroupSpecError
from app.core.observer import GangObserver, MemberRef
from app.core.packing import Demand
from app.core.preemption.parked import preempt_unanswered
from app.core.preemption.victims import Preemptor, VictimCandidate, VictimPolicy
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState
from app.runtime.preemption.evictor import PodEvicter, evict_each
from app.runtime.preemption.nominations import Nominations
from app.runtime.preemption.plan import STALLED_SECONDS
from app.runtime.preemption.plans import PreemptionPlans

log = logging.getLogger(__name__)

# kube-scheduler's words for a pod whose claims no node can take (its PodScheduled message).
DRA_UNSCHEDULABLE = "cannot allocate all claims"
# The filter's words for a gang that does not fit whole (app/core/packing.py), and
# kube-scheduler's when its preemption dry run found no candidate node.
GANG_SHORT = "placed at once"
NO_CANDIDATE = "preemption: 0/"
# kube-scheduler v1.37.2's pod-group cycle when every candidate placement (topology domain)
# got no pod: its PodGroupPodsCount placement scorer fails (podgroup_pods_count.go:83, "no
# pods from pod group are assigned to any of the candidate placements"). A fragment: the
# messages reference (hack/gen_reference.py) lists our own sentences, not those we read.
NO_PLACEMENT = "of the candidate placements"
# Its words when no placement is feasible (schedule_one_podgroup.go, "0/N placements are
# available"): GangScheduling's PlacementFeasible, enabled through its PreEnqueue, finds
# fewer than minCount pods placed in each domain, the filter having refused the rest.
NO_FEASIBLE_PLACEMENT = "placements are available"
# The topology filter's words for a gang that fits in no domain now (app/core/topology/domains.py).
NO_DOMAIN_ROOM = "retried as capacity frees"
# A gang's members are reported one after the other: one try for all of them.
SETTLE_SECONDS = 1.0
# The least time between two tries for one gang.
RETRY_SECONDS = 5.0


def unasked(pod: PodRecord) -> bool:
    """Did kube-scheduler leave the pod without the preemption its gang needs?"""
    message = pod.unschedulable_message
    if DRA_UNSCHEDULABLE in message:
        return bool(pod.claims)
    # Priority 0 or less evicts only pods of negative priority: not worth a plan at
    # every retry of every waiting gang of a long line.
    if pod.priority <= 0:
        return False
    if preempt_unanswered(message):
        return True  # the preempt verb was down (restarting): its answer never came
    if pod.group is not None and pod.group.source == SOURCE_NATIVE:
        # kube-scheduler's pod-group cycle never asks the preempt verb (see above): its
        # scorer's error, or the filter's refusal for room, is the last word it writes.
        return any(
            words in message
            for words in (NO_PLACEMENT, NO_FEASIBLE_PLACEMENT, GANG_SHORT, NO_DOMAIN_ROOM)
        )
    return GANG_SHORT in message and NO_CANDIDATE in message


def moves_room(old: PodRecord | None, new: PodRecord | None) -> bool:
    """Did this change take a pod's room on a node, or give it back (ended, deleted)?"""
    return _room_of(old) != _room_of(new)


def _room_of(pod: PodRecord | None) -> str:
    """The node whose room the pod holds ("": none)."""
    if pod is None or pod.terminal:
        return ""
    return pod.placed_node or ""


class UnaskedPreemption:
    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        plans: PreemptionPlans,
        evicter: PodEvicter,
        observer: GangObserver,
        policy: VictimPolicy,
    ) -> None:
        self._state = state
        self._admission = admission
        self._plans = plans
        self._evicter = evicter
        self._observer = observer
        self._policy = policy
        self._pending: set[str] = set()
        # group key -> when it may be tried again: kube-scheduler rewrites the message
        # at each retry of each member, a plan is tried once a while for the gang.
        self._next_try: dict[str, float] = {}
        self._tasks = TaskSet()
        # Gangs whose victims handed to kube-scheduler are being followed up (`follow`).
        self._following: set[str] = set()
        # The plans' nominations (set by the server): a gang's victims are evicted once its
        # members' nominations are written (Nominations.sent says why).
        self.nominations: Nominations | None = None

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A gang member kube-scheduler will not preempt for: plan for its gang.

        And a pod taking or leaving room on a node, or a member arriving: the gangs
        (the member's) the preempt verb refused or found no plan for lately are asked
        again (app/runtime/preemption/refusals.py says why).
        """
        if moves_room(old, new):
            key = new.key if new is not None else old.key if old is not None else ""
            moved = f"{key}'s room moved from {_room_of(old) or '-'} to {_room_of(new) or '-'}"
            self._ask_again(self._plans.refusals.take(), moved)
        elif old is None and new is not None and new.group is not None:
            self._ask_again(self._plans.refusals.take(new.group.key), f"member {new.key} came")
        if (
            new is None
            or new.group is None
            or new.placed_node
            or not new.may_preempt
            or not unasked(new)
            or new.group.key in self._pending
        ):
            return
        self._soon(new.group.key)

    def _ask_again(self, group_keys: list[str], why: str) -> None:
        for group_key in group_keys:
            log.info(
                "preemption (unasked): asking again for a gang refused lately: %s",
                why,
                extra={"podgroup": group_key},
            )
            self._soon(group_key)

    def _soon(self, group_key: str) -> None:
        """Try the gang's plan once its members have been reported (SETTLE_SECONDS)."""
        if group_key in self._pending:
            return
        # Tried lately: once more when the gang may be tried again, not never. kube-scheduler
        # writes a message only when it changes, and a gang's first try may come before its
        # last member exists (a native gang's pods all carry the same scorer error then).
        delay = max(SETTLE_SECONDS, self._next_try.get(group_key, 0.0) - monotonic())
        self._pending.add(group_key)
        self._tasks.spawn(self._later(group_key, delay))

    async def _later(self, group_key: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self._pending.discard(group_key)
        await self._try(group_key)

    def follow(self, group_key: str) -> None:
        """Victims were handed to kube-scheduler for the gang: evict those it has not started
        deleting STALLED_SECONDS later (one follow-up per gang at a time)."""
        if group_key in self._following:
            return
        self._following.add(group_key)
        self._tasks.spawn(self._follow_up(group_key))

    async def _follow_up(self, group_key: str) -> None:
        try:
            wait: float | None = STALLED_SECONDS
            while wait is not None:
                await asyncio.sleep(wait)
                due, wait = self._plans.stalled_victims(group_key)
                victims = self._whole(due)
                if victims:
                    log.info(
                        "preemption (unasked): kube-scheduler did not delete the victim(s) it "
                        "was handed within %gs (its preemption failed): evicting them",
                        STALLED_SECONDS,
                        extra={"podgroup": group_key},
                    )
                    await self._evict(group_key, victims)
        finally:
            self._following.discard(group_key)

    async def for_held(self, group_key: str) -> bool:
        """A gang held in line (app/runtime/holds.py) whose members may preempt: kube-scheduler
        never tries a gated pod, so its preemption starts here. True when its members should
        go to kube-scheduler: a plan lives for it (its victims were named and are going).

        Tried at most once each RETRY_SECONDS per gang, as for a gang kube-scheduler left.
        """
        if group_key in self._pending or self._next_try.get(group_key, 0.0) > monotonic():
            return self._plans.lives(group_key)
        await self._try(group_key)
        return self._plans.lives(group_key)

    async def _try(self, group_key: str) -> None:
        if not self._plans.listed():
            return  # just started: which running pods are gang members is not known yet
        now = monotonic()
        self._next_try = {k: t for k, t in self._next_try.items() if t > now}
        self._next_try[group_key] = now + RETRY_SECONDS
        try:
            victims = self.victims(group_key)
        except (GroupNotFound, PodGroupSpecError) as err:
            log.info("no preemption (unasked): %s", err, extra={"podgroup": group_key})
            return
        if victims and self.nominations is not None:  # evicted once its members' room is kept
            await self.nominations.sent(p.uid for p in self._state.members(group_key))
            if not self._plans.lives(group_key):
                return  # pods took its room meanwhile (plan_book.py): evicting would free it idly
        if victims:
            await self._evict(group_key, victims)

    def victims(self, group_key: str) -> list[PodRecord]:
        """The pods to delete so the gang's waiting members get room ([] when none may go).

        None while the gang has a live plan: its victims were named and are going
        (by kube-scheduler's hand or ours), and its members wait for the room; but
        for those no slot carries (victims holding devices of a shared pool where
        no member goes), which only this deletes.
        """
        if self._plans.lives(group_key):
            # Its slots' victims were named; those freeing a shared device pool elsewhere
            # are named by nobody else (a plan made for a preempt call).
            return self._whole(self._plans.hand_pool_victims(group_key))
        members = self._state.members(group_key)
        waiting = [p for p in members if not p.placed_node and p.group is not None]
        if not waiting or waiting[0].group is None:
            return []
        ref = waiting[0].group
        spec = self._state.group_spec(ref)
        tasks = [p.group.task for p in members if p.group is not None]
        blocker = self._admission.preemption_blocker(
            spec, wholeness(spec, len(members), lambda: tasks), self._state.total_allocatable()
        )
        if blocker is not None:
            log.info("no preemption (unasked): %s", blocker, extra={"podgroup": group_key})
            return []
        nodes = [
            VictimCandidate(name, [], 0)
            for name, record in self._state.nodes.items()
            if not record.unschedulable
        ]
        uids: list[str] = []
        for pod in waiting:
            preemptor = Preemptor(pod.key, pod.uid, pod.priority, spec.key)
            demand = Demand(pod.key, pod.requests, pod.placement)
            answer = self._plans.answer(spec, ref, preemptor, demand, nodes, ours=True)
            if answer.unplanned:
                # Within the first refusal's window only: no standing retry of a gang
                # that cannot preempt while pods keep leaving.
                self._plans.refusals.renew(spec.key)
            log.info("preemption (unasked): %s", answer.message, extra={"pod": pod.key})
            uids += [uid for c in answer.candidates for uid in c.victim_uids]
        return self._whole([*uids, *self._plans.hand_pool_victims(group_key)])

    def _whole(self, uids: list[str]) -> list[PodRecord]:
        """The victims, with the rest of their gangs under the whole-gang policy."""
        found = [p for p in map(self._state.pod_by_uid, dict.fromkeys(uids)) if p is not None]
        if self._policy is VictimPolicy.WHOLE_GANG:
            for gang in {p.group.key for p in found if p.group is not None}:
                found += [p for p in self._state.members(gang) if p.placed_node]
        return list({p.uid: p for p in found}.values())

    async def _evict(self, group_key: str, victims: list[PodRecord]) -> None:
        for pod in victims:
            ref = MemberRef(pod.namespace, pod.name, pod.uid, pod.placed_node)
            self._observer.victim_preempted(
                ref, pod.group.key if pod.group is not None else None, group_key
            )
        why = " (a preemption kube-scheduler did not start)"
        gone = await evict_each(self._evicter.evict_pod, group_key, victims, why)
        log.info(
            "preemption (unasked): evicted %d pod(s) for gang %s: %s",
            len(gone),
            group_key,
            ", ".join(p.key for p in gone),
            extra={"podgroup": group_key},
        )

    async def drain(self) -> None:
        await self._tasks.drain()
