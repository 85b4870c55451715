"""The permit gate's waiting room: gang members held per gang until it is whole.

A member's bind call waits on an asyncio future, no thread per waiter. Each
gang's room keeps who waits, who is being bound, and what the bindings in
flight did; a member leaves it answered (bound, or released with an error).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from app.base.metrics import Metrics
from app.core.admission import PermitVerdict, permit
from app.core.clock import Clock
from app.core.groups import GroupSpec
from app.core.observer import MemberRef
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.core.topology.domains import TopologyError
from app.core.topology.subgroups import GangTree
from app.runtime.gang_tree import gang_tree
from app.runtime.gate_settings import GatePolicy, VictimCheck
from app.runtime.preemption.held_victims import HeldVictims


class GateError(Exception):
    """The bind call fails with this message; kube-scheduler requeues the pod."""


class SettleOutcome(enum.StrEnum):
    """What became of a gang's wave, as told to settle listeners."""

    BOUND = "bound"
    RELEASED = "released"


SettleListener = Callable[[str, SettleOutcome], None]
"""Called with (group key, outcome) once a group's waiters are bound or released."""


class AdmissionResult(enum.StrEnum):
    """How one admission of a gang ended: the label of the admissions metric."""

    ADMITTED = "admitted"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled-back"
    TIMEOUT = "timeout"


@dataclass(eq=False, slots=True)
class Waiter:
    pod_key: str
    namespace: str
    name: str
    uid: str
    # Volcano task of the pod ("" for none), for minTaskMember.
    task: str
    node: str
    arrived: float
    future: asyncio.Future[None]
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class GangWait:
    """One gang's room: its members waiting, being bound, and what the bindings did."""

    spec: GroupSpec
    waiting: dict[str, Waiter] = field(default_factory=dict)
    # Members released by the gate whose pods/binding is in flight: pod key -> task.
    binding: dict[str, str] = field(default_factory=dict)
    # While bindings are in flight (one or more waves, each counting the
    # others as present), what they bound and what failed: the outcome of
    # the admission is known only when the last of them returns.
    episode_bound: list[MemberRef] = field(default_factory=list)
    episode_failed: list[tuple[Waiter, BaseException]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.waiting and not self.binding


class WaitingRoom:
    def __init__(
        self,
        state: ClusterState,
        metrics: Metrics,
        clock: Clock,
        victims: VictimCheck | None,
        policy: GatePolicy,
    ) -> None:
        self.state = state
        self._metrics = metrics
        self._clock = clock
        self.groups: dict[str, GangWait] = {}
        self.victims = HeldVictims(victims, policy, self.release)

    def now(self) -> float:
        return self._clock()

    def group_for(self, spec: GroupSpec) -> GangWait:
        """The gang's room (made on its first member), under the gang's latest rules."""
        group = self.groups.get(spec.key)
        if group is None:
            group = self.groups[spec.key] = GangWait(spec)
        group.spec = spec
        return group

    def enter(self, group: GangWait, pod: PodRecord, node: str) -> Waiter:
        """Seat `pod` in its gang's room, reserved on `node` in the cluster state."""
        waiter = Waiter(
            pod_key=pod.key,
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            task=pod.group.task if pod.group is not None else "",
            node=node,
            arrived=self.now(),
            future=asyncio.get_running_loop().create_future(),
        )
        group.waiting[pod.key] = waiter
        self.state.reserve(pod.key, node)
        self._metrics.gate_waiting.inc()
        return waiter

    def drop(
        self,
        group: GangWait,
        waiter: Waiter,
        message: str,
        *,
        hold: bool = True,
        gone: bool = False,
    ) -> None:
        """Take a waiter out of its group and answer it.

        A preemption victim (with `hold`) is answered later: a moment after its
        pod is `gone`, else when the victim hold runs out (app/runtime/preemption/held_victims.py).
        """
        group.waiting.pop(waiter.pod_key, None)
        if hold and self.victims.is_victim(waiter):
            self.victims.hold(waiter, message, gone=gone)
        else:
            self.release(waiter, message)
        self.forget_if_empty(group)

    def forget_if_empty(self, group: GangWait) -> None:
        if group.empty:
            self.groups.pop(group.spec.key, None)

    def bound_members(self, group_key: str) -> dict[str, str]:
        """Members the API has bound: pod key -> task."""
        return {
            p.key: p.group.task if p.group is not None else ""
            for p in self.state.bound_members(group_key)
        }

    def permit(self, group: GangWait, *, gaps: bool = False) -> PermitVerdict:
        """The gang rule over the members bound, binding and waiting here.

        Each member's arrival asks it: what it costs must not grow with the gang
        (2,000 arrivals would cost 2,000 times the gang). So the sub-groups'
        own minimums (the gang's tree, read from every member) are weighed only
        once minMember are present, or when `gaps` asks for them (a message).
        """
        spec = group.spec
        waiting = {key: w.task for key, w in group.waiting.items()}
        bound = self.bound_members(spec.key)
        verdict = permit(spec, bound, group.binding, waiting)
        if verdict.missing and not gaps:
            return verdict  # not whole whatever the sub-groups hold
        return permit(spec, bound, group.binding, waiting, self._tree(spec))

    def _tree(self, spec: GroupSpec) -> GangTree | None:
        """The gang's slices or sub-groups, each with its own minimum the gate checks.

        A tree the filter could not read (TopologyError) holds the gang there; the gate
        then checks minMember alone, as for a flat gang.
        """
        try:
            return gang_tree(self.state, spec)
        except TopologyError:
            return None

    def release(self, waiter: Waiter, message: str) -> None:
        """Answer the waiter with an error: kube-scheduler forgets the pod, its node is free."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        self.state.unreserve(waiter.pod_key)
        self.finish_wait(waiter)
        set_exception(waiter.future, GateError(message))

    def finish_wait(self, waiter: Waiter) -> None:
        if waiter.future.done():
            return
        self._metrics.gate_waiting.dec()
        self._metrics.gate_wait.observe(max(0.0, self.now() - waiter.arrived))


def member_ref(waiter: Waiter, now: float | None = None) -> MemberRef:
    waited = 0.0 if now is None else max(0.0, now - waiter.arrived)
    return MemberRef(waiter.namespace, waiter.name, waiter.uid, waiter.node, waited)


def set_exception(future: asyncio.Future[None], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
        # Mark retrieved: a waiter whose HTTP call went away must not log
        # "exception was never retrieved".
        future.exception()
