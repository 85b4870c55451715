"""The permit gate: gang members wait inside the bind verb until the gang is whole.

kube-scheduler calls bind once per pod, in its own goroutine, after it has
assumed the pod on a node. A gang member's bind call waits here (an asyncio
future, no thread per waiter) until the members already bound plus those
reserved here reach minMember; then every waiting member is bound and every
call answered. If any member's wait runs out first, the whole wave is
released with an error (kube-scheduler forgets the assumed pods and requeues
them) and the group is denied for a while: no admission binds fewer than
minMember members.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from app.core.admission import Admission, DenyReason, PermitVerdict, permit
from app.core.clock import Clock, monotonic
from app.core.groups import GroupSpec
from app.core.observer import GangObserver, MemberRef, NullObserver
from app.core.state import ClusterState, PodRecord
from app.kube.errors import ApiError
from app.ops.metrics import Metrics
from app.runtime.tasks import TaskSet
from app.runtime.wakeup import SiblingWaker

log = logging.getLogger(__name__)


class PartialBindPolicy(enum.StrEnum):
    """What the gate does when some bindings of an admitted wave fail (--on-partial-bind).

    DELETE_BOUND deletes the members this admission bound, so their
    controllers recreate them and the gang is retried whole; LEAVE keeps them
    bound and lets the failed members join them when kube-scheduler retries.
    Either way it applies only when the gang is left below minMember bound.
    """

    DELETE_BOUND = "delete-bound"
    LEAVE = "leave"


class SettleOutcome(enum.StrEnum):
    """What became of a gang's wave, as told to settle listeners."""

    BOUND = "bound"
    RELEASED = "released"


class AdmissionResult(enum.StrEnum):
    """How one admission of a gang ended: the label of the admissions metric."""

    ADMITTED = "admitted"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled-back"
    TIMEOUT = "timeout"


SettleListener = Callable[[str, SettleOutcome], None]
"""Called with (group key, outcome) once a group's waiters are bound or released."""

_MAX_REASONS = 5

# A gate-held member that kube-scheduler chose as a preemption victim is
# answered only once its pod is deleted (or after VICTIM_HOLD_SECONDS, if the
# scheduler picked another candidate), and then VICTIM_ANSWER_DELAY_SECONDS
# later. kube-scheduler retries the preemptor only when the victim's deletion
# frees an *assumed* pod: a victim answered (and so forgotten) before its
# deletion arrives leaves the preemptor parked for minutes (seen in the
# scheduler-plugins integration case "mid pg1 and 3 high regular pods").
VICTIM_HOLD_SECONDS = 5.0
VICTIM_ANSWER_DELAY_SECONDS = 0.5


class GateError(Exception):
    """The bind call fails with this message; kube-scheduler requeues the pod."""


class Binder(Protocol):
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create the pods/binding; raise ApiError on failure."""


class VictimCheck(Protocol):
    def is_victim(self, uid: str) -> bool:
        """Was this pod handed to kube-scheduler as a preemption victim lately?"""
        ...


class PodDeleter(Protocol):
    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod (uid-guarded); raise ApiError on failure."""


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
class _Group:
    spec: GroupSpec
    waiting: dict[str, Waiter] = field(default_factory=dict)
    # Members released by the gate whose pods/binding is in flight: pod key -> task.
    binding: dict[str, str] = field(default_factory=dict)
    # While bindings are in flight (one or more waves, each counting the
    # others as present), what they bound and what failed: the outcome of
    # the admission is known only when the last of them returns.
    episode_bound: list[MemberRef] = field(default_factory=list)
    episode_failed: list[tuple[Waiter, BaseException]] = field(default_factory=list)


class PermitGate:
    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        binder: Binder,
        metrics: Metrics,
        *,
        waker: SiblingWaker | None = None,
        observer: GangObserver | None = None,
        clock: Clock = monotonic,
        partial_bind: PartialBindPolicy = PartialBindPolicy.DELETE_BOUND,
        deleter: PodDeleter | None = None,
        victim_hold_seconds: float = VICTIM_HOLD_SECONDS,
        victim_answer_delay_seconds: float = VICTIM_ANSWER_DELAY_SECONDS,
        victims: VictimCheck | None = None,
    ) -> None:
        # Which pods the preempt verb handed to kube-scheduler as victims (runtime/preemption.py).
        self._victims = victims
        self._victim_hold_seconds = victim_hold_seconds
        self._victim_answer_delay_seconds = victim_answer_delay_seconds
        self._partial_bind = partial_bind
        self._deleter = deleter
        self._waker = waker
        self._observer: GangObserver = observer or NullObserver()
        self._state = state
        self._admission = admission
        self._binder = binder
        self._metrics = metrics
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        self._waves = TaskSet()
        self._settle_listeners: list[SettleListener] = []
        # pod key -> a released victim's waiter and its message, not answered yet.
        self._held_victims: dict[str, tuple[Waiter, str]] = {}

    def add_settle_listener(self, listener: SettleListener) -> None:
        self._settle_listeners.append(listener)

    def _settled(self, group_key: str, outcome: SettleOutcome) -> None:
        for listener in self._settle_listeners:
            listener(group_key, outcome)

    # ---- the bind verb's entry point ---------------------------------------------

    async def admit(self, pod: PodRecord, node: str, spec: GroupSpec, wait_seconds: float) -> None:
        """Hold `pod` (reserved on `node`) until its gang is whole, then bind it.

        Returns once the pod is bound; raises GateError when it was released
        (timeout, deletion, failed binding) with a message for the user.
        """
        loop = asyncio.get_running_loop()
        group = self._groups.get(spec.key)
        if group is None:
            group = self._groups[spec.key] = _Group(spec)
        group.spec = spec
        held = self._held_victims.pop(pod.key, None)
        if held is not None:
            self._release(held[0], held[1])
        previous = group.waiting.pop(pod.key, None)
        if previous is not None:
            self._release(previous, "superseded by a newer bind request for the same pod")
        if pod.key in group.binding:
            raise GateError(f"pod {pod.key} is already being bound by the gate")

        waiter = Waiter(
            pod_key=pod.key,
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            task=pod.group.task if pod.group is not None else "",
            node=node,
            arrived=self._now(),
            future=loop.create_future(),
        )
        group.waiting[pod.key] = waiter
        self._state.reserve(pod.key, node)
        self._metrics.gate_waiting.inc()
        waiter.timer = loop.call_later(wait_seconds, self._expire, spec.key, waiter, wait_seconds)
        log.debug(
            "gang member reserved",
            extra={"pod": pod.key, "podgroup": spec.key, "node": node, "verb": "bind"},
        )
        opened = self._maybe_open(spec.key)
        if not opened:
            present = self._permit(group).present
            self._observer.member_waiting(_ref(waiter), spec.key, present, spec.min_member)
        if not opened and self._waker is not None:
            # Siblings rejected earlier (e.g. while the group was denied) sit in
            # kube-scheduler's unschedulable queue: bring them to the gate.
            self._waker.wake(spec.key, exclude_uid=pod.uid)
        # shield: a dropped HTTP connection must not cancel the gate's own bookkeeping.
        await asyncio.shield(waiter.future)

    # ---- queries --------------------------------------------------------------

    def waiting(self, group_key: str) -> list[Waiter]:
        group = self._groups.get(group_key)
        return list(group.waiting.values()) if group else []

    def waiting_groups(self) -> dict[str, list[Waiter]]:
        return {k: list(g.waiting.values()) for k, g in self._groups.items() if g.waiting}

    async def drain(self) -> None:
        """Wait for bindings in flight (used at shutdown and by tests)."""
        await self._waves.drain()

    def release_group(self, group_key: str, message: str) -> list[MemberRef]:
        """Answer every waiting member of the group with an error now (not at the timeout).

        kube-scheduler forgets the assumed pods and requeues them; what they
        held becomes free for other gangs at once.
        """
        group = self._groups.get(group_key)
        if group is None:
            return []
        now = self._now()
        wave = list(group.waiting.values())
        for waiter in wave:
            self._drop(group, waiter, message)
        released = [_ref(w, now) for w in wave]
        if wave:
            self._metrics.admissions.labels(AdmissionResult.REJECTED).inc()
            self._settled(group_key, SettleOutcome.RELEASED)
        return released

    def release_all(self, reason: str) -> None:
        """Answer every waiter with an error (shutdown): nothing stays reserved."""
        for group in list(self._groups.values()):
            for waiter in list(group.waiting.values()):
                self._drop(group, waiter, reason, hold=False)
        for waiter, _ in self._held_victims.values():
            self._release(waiter, reason)
        self._held_victims.clear()

    # ---- internals --------------------------------------------------------------

    def _now(self) -> float:
        return self._clock()

    def _bound_members(self, group_key: str) -> dict[str, str]:
        """Members the API has bound: pod key -> task."""
        return {
            p.key: p.group.task if p.group is not None else ""
            for p in self._state.members(group_key)
            if p.node_name
        }

    def _permit(self, group: _Group) -> PermitVerdict:
        """The gang rule over the members bound, binding and waiting here."""
        waiting = {key: w.task for key, w in group.waiting.items()}
        return permit(group.spec, self._bound_members(group.spec.key), group.binding, waiting)

    def _maybe_open(self, group_key: str) -> bool:
        """Bind the waiting wave if the gang is whole; True if it was."""
        group = self._groups.get(group_key)
        if group is None or not group.waiting or not self._permit(group).whole:
            return False
        wave = list(group.waiting.values())
        group.waiting.clear()
        for waiter in wave:
            if waiter.timer is not None:
                waiter.timer.cancel()
            group.binding[waiter.pod_key] = waiter.task
        log.info(
            "gang admitted: binding %d waiting members",
            len(wave),
            extra={"podgroup": group_key, "verb": "bind"},
        )
        self._waves.spawn(self._bind_wave(group_key, group, wave))
        return True

    async def _bind_wave(self, group_key: str, group: _Group, wave: list[Waiter]) -> None:
        results = await asyncio.gather(
            *(self._binder.bind(w.namespace, w.name, w.uid, w.node) for w in wave),
            return_exceptions=True,
        )
        bound: list[MemberRef] = []
        for waiter, result in zip(wave, results, strict=True):
            group.binding.pop(waiter.pod_key, None)
            self._finish_wait(waiter)
            if isinstance(result, BaseException):
                group.episode_failed.append((waiter, result))
                self._metrics.bind_errors.labels(
                    result.reason if isinstance(result, ApiError) else "internal"
                ).inc()
                self._state.unreserve(waiter.pod_key)
                log.warning(
                    "binding failed after the gang was admitted: %s",
                    result,
                    extra={"pod": waiter.pod_key, "podgroup": group_key, "node": waiter.node},
                )
            else:
                self._state.assume_bound(waiter.pod_key, waiter.node)
                bound.append(_ref(waiter, self._now()))
                # The binding exists: kube-scheduler must not retry it, even if
                # the pod is deleted again by a roll-back below.
                if not waiter.future.done():
                    waiter.future.set_result(None)
        group.episode_bound.extend(bound)
        if bound:
            self._observer.gang_admitted(group_key, bound)
            self._settled(group_key, SettleOutcome.BOUND)
        if not group.binding:
            await self._settle(group_key, group)
        if not group.waiting and not group.binding:
            self._groups.pop(group_key, None)
        else:
            # Members that arrived while this wave was binding may be complete now.
            self._maybe_open(group_key)

    async def _settle(self, group_key: str, group: _Group) -> None:
        """The last binding in flight returned: answer the failed members, apply the policy."""
        failures, bound = group.episode_failed, group.episode_bound
        group.episode_failed, group.episode_bound = [], []
        if not failures:
            self._metrics.admissions.labels(AdmissionResult.ADMITTED).inc()
            return
        # A gang left below minMember bound: the case --on-partial-bind decides.
        # The bound members alone: what stays if the gate lets go.
        kept = permit(group.spec, self._bound_members(group_key), {}, {})
        partial = bool(bound) and kept.missing > 0
        rollback = (
            partial
            and self._partial_bind is PartialBindPolicy.DELETE_BOUND
            and self._deleter is not None
        )
        outcome = self._partial_outcome(group.spec, kept, bound, rollback)
        for waiter, error in failures:
            message = (
                f"gang {group_key} was admitted but binding pod {waiter.pod_key} to "
                f"{waiter.node} failed: {error}; {outcome}"
            )
            self._observer.bind_failed(_ref(waiter), group_key, message)
            _set_exception(waiter.future, GateError(message))
        self._metrics.admissions.labels(
            AdmissionResult.ROLLED_BACK if rollback else AdmissionResult.REJECTED
        ).inc()
        if partial:
            refused = "; ".join(f"{w.pod_key} to {w.node}: {e}" for w, e in failures[:3])
            self._observer.gang_partly_bound(
                group_key, bound, f"binding {refused}; {outcome}", rollback
            )
        if rollback:
            await self._roll_back(group_key, group, bound, outcome)

    def _partial_outcome(
        self,
        spec: GroupSpec,
        kept: PermitVerdict,
        bound: list[MemberRef],
        rollback: bool,
    ) -> str:
        """What happens to the gang after failed bindings (`kept`: the bound members), as told."""
        present = kept.present
        if not kept.missing:
            return (
                f"the gang keeps {present} bound members (minMember {spec.min_member}); "
                "the pod is requeued and joins them on the next attempt"
            )
        if not bound:
            return (
                f"no member of this admission was bound ({present} of minMember "
                f"{spec.min_member} bound); the pod is requeued"
            )
        names = ", ".join(sorted(m.name for m in bound))
        if rollback:
            return (
                f"only {present} of minMember {spec.min_member} would stay bound, so the "
                f"members bound by this admission ({names}) are deleted for their controllers "
                f"to recreate them and the gang is retried whole after "
                f"{self._admission.denied_ttl_seconds:g}s (--on-partial-bind=delete-bound)"
            )
        return (
            f"{present} of minMember {spec.min_member} members stay bound ({names}) "
            "because --on-partial-bind=leave; the pod is requeued and joins them on the "
            "next attempt"
        )

    async def _roll_back(
        self, group_key: str, group: _Group, bound: list[MemberRef], why: str
    ) -> None:
        """Delete the members this admission bound: a gang below minMember never stays.

        Members that reached the gate meanwhile are released too: counted with
        siblings about to be deleted, they would open a wave of their own.
        """
        assert self._deleter is not None
        self._admission.deny(group_key, DenyReason.BIND_FAILED, why)
        if self._waker is not None:
            # Members turned away while denied (and the recreated pods) sit in
            # kube-scheduler's unschedulable queue: retry them when it expires.
            self._waker.wake_after(group_key, self._admission.denied_ttl_seconds + 0.1)
        for waiter in list(group.waiting.values()):
            self._drop(group, waiter, f"gang {group_key} is retried whole: {why}")
        results = await asyncio.gather(
            *(self._deleter.evict_pod(m.namespace, m.name, m.uid) for m in bound),
            return_exceptions=True,
        )
        for member, result in zip(bound, results, strict=True):
            if isinstance(result, BaseException):
                log.error(
                    "could not delete a member of a partly bound gang: %s",
                    result,
                    extra={"pod": member.key, "podgroup": group_key, "node": member.node},
                )
            else:
                log.warning(
                    "deleted a member of a partly bound gang",
                    extra={"pod": member.key, "podgroup": group_key, "node": member.node},
                )

    def _expire(self, group_key: str, waiter: Waiter, waited: float) -> None:
        group = self._groups.get(group_key)
        if group is None or group.waiting.get(waiter.pod_key) is not waiter:
            return
        wave = list(group.waiting.values())
        present = self._permit(group).present
        names = ", ".join(sorted(w.name for w in wave))
        message = (
            f"gang {group_key} timed out after waiting {waited:g}s in the permit gate: "
            f"{present} of minMember {group.spec.min_member} members were placed "
            f"(waiting: {names}){self._unplaced_reasons(group_key)}; all waiting members "
            "were released"
        )
        log.info(message, extra={"podgroup": group_key, "verb": "bind"})
        now = self._now()
        for member in wave:
            self._drop(group, member, message)
        self._observer.gang_timed_out(group_key, [_ref(w, now) for w in wave], message)
        self._admission.deny(group_key, DenyReason.TIMEOUT, message)
        self._metrics.admissions.labels(AdmissionResult.TIMEOUT).inc()
        self._settled(group_key, SettleOutcome.RELEASED)
        if self._waker is not None:
            # The released members are parked as "denied"; retry them when that expires.
            self._waker.wake_after(group_key, self._admission.denied_ttl_seconds + 0.1)

    def _unplaced_reasons(self, group_key: str) -> str:
        """Why the members still missing were not placed: kube-scheduler's latest word."""
        unplaced = sorted(
            (p for p in self._state.members(group_key) if not p.placed_node), key=lambda p: p.name
        )
        if not unplaced:
            return ""
        parts = [
            f"{p.name}: {_clip(p.unschedulable_message) or 'not tried by the scheduler yet'}"
            for p in unplaced[:_MAX_REASONS]
        ]
        more = f" and {len(unplaced) - _MAX_REASONS} more" if len(unplaced) > _MAX_REASONS else ""
        return f"; not placed: {'; '.join(parts)}{more}"

    def _drop(
        self, group: _Group, waiter: Waiter, message: str, *, hold: bool = True, gone: bool = False
    ) -> None:
        """Take a waiter out of its group and answer it.

        A preemption victim (with `hold`) is answered later: a moment after its
        pod is `gone`, else when the victim hold runs out (see VICTIM_HOLD_SECONDS).
        """
        group.waiting.pop(waiter.pod_key, None)
        if hold and self._is_victim(waiter):
            delay = self._victim_answer_delay_seconds if gone else self._victim_hold_seconds
            self._hold_victim(waiter, message, delay)
        else:
            self._release(waiter, message)
        if not group.waiting and not group.binding:
            self._groups.pop(group.spec.key, None)

    def _is_victim(self, waiter: Waiter) -> bool:
        return self._victims is not None and self._victims.is_victim(waiter.uid)

    def _hold_victim(self, waiter: Waiter, message: str, seconds: float) -> None:
        """Answer a preemption victim later (see VICTIM_HOLD_SECONDS); it is never bound."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        log.debug(
            "preemption victim answered in %gs",
            seconds,
            extra={"pod": waiter.pod_key, "node": waiter.node, "verb": "bind"},
        )
        self._held_victims[waiter.pod_key] = (waiter, message)
        waiter.timer = asyncio.get_running_loop().call_later(
            seconds, self._answer_victim, waiter, message
        )

    def _answer_victim(self, waiter: Waiter, message: str) -> None:
        if self._held_victims.get(waiter.pod_key, (None, ""))[0] is waiter:
            del self._held_victims[waiter.pod_key]
            self._release(waiter, message)

    def _release(self, waiter: Waiter, message: str) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        self._state.unreserve(waiter.pod_key)
        self._finish_wait(waiter)
        _set_exception(waiter.future, GateError(message))

    def _finish_wait(self, waiter: Waiter) -> None:
        if waiter.future.done():
            return
        self._metrics.gate_waiting.dec()
        self._metrics.gate_wait.observe(max(0.0, self._now() - waiter.arrived))

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A waiter whose pod was deleted or bound elsewhere leaves; a bound sibling may open."""
        pod = old or new
        if pod is None:
            return
        held = self._held_victims.get(pod.key)
        if held is not None and (new is None or new.deleting or new.uid != held[0].uid):
            # Gone: answer once kube-scheduler has seen the deletion of its assumed pod.
            self._hold_victim(held[0], held[1], self._victim_answer_delay_seconds)
        if pod.group is None:
            return
        group = self._groups.get(pod.group.key)
        if group is None:
            return
        waiter = group.waiting.get(pod.key)
        if waiter is not None:
            reason = None
            if new is None or new.uid != waiter.uid:
                reason = f"pod {pod.key} was deleted while waiting for its gang {group.spec.key}"
            elif new.deleting:
                reason = f"pod {pod.key} is being deleted; it left gang {group.spec.key}"
            elif new.node_name:
                reason = (
                    f"pod {pod.key} was bound to {new.node_name} by someone else while "
                    f"waiting in the gate of gang {group.spec.key}"
                )
            if reason is not None:
                log.info(reason, extra={"pod": pod.key, "podgroup": group.spec.key})
                gone = new is None or new.uid != waiter.uid or new.deleting
                # A victim's deletion is answered a moment later; a pod bound elsewhere now.
                self._drop(group, waiter, reason, hold=gone, gone=gone)
                return
        if new is not None and new.node_name and (old is None or not old.node_name):
            # A sibling's binding became visible: the waiting wave may be complete.
            asyncio.get_running_loop().call_soon(self._maybe_open, pod.group.key)


def _clip(message: str, limit: int = 240) -> str:
    """One quoted scheduler message (they can quote earlier gang messages in turn)."""
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _ref(waiter: Waiter, now: float | None = None) -> MemberRef:
    waited = 0.0 if now is None else max(0.0, now - waiter.arrived)
    return MemberRef(waiter.namespace, waiter.name, waiter.uid, waiter.node, waited)


def _set_exception(future: asyncio.Future[None], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
        # Mark retrieved: a waiter whose HTTP call went away must not log
        # "exception was never retrieved".
        future.exception()
