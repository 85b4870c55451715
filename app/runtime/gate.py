"""The permit gate: gang members wait inside the bind verb until the gang is whole.

kube-scheduler calls bind once per pod, in its own goroutine, after it has
assumed the pod on a node. A gang member's bind call waits here (an asyncio
future, no thread per waiter) until the members already bound plus those
reserved here reach minMember; then every waiting member is bound and every
call answered. If any member's wait runs out first, the whole wave is
released with an error (kube-scheduler forgets the assumed pods and requeues
them) and the group is denied for a while: no admission binds fewer than
minMember members.

PermitGate is the gate's door; behind it the waiting room holds the members
(app/runtime/waiting_room.py), the bind wave binds them
(app/runtime/bind_wave.py), the partial-bind policy ends a wave that partly
failed (app/runtime/partial_bind.py), and preemption victims are answered
late (app/runtime/preemption/held_victims.py).
"""

from __future__ import annotations

import asyncio
import logging

from app.base.metrics import Metrics
from app.core.admission import Admission, DenyReason
from app.core.groups import GroupSpec
from app.core.observer import MemberRef
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.runtime.bind_wave import BindWaves
from app.runtime.gate_settings import (
    Binder,
    GateLinks,
    GatePolicy,
)
from app.runtime.partial_bind import PartialBind, deny_for_a_while
from app.runtime.waiting_room import (
    AdmissionResult,
    GangWait,
    GateError,
    SettleListener,
    SettleOutcome,
    Waiter,
    WaitingRoom,
    member_ref,
)

__all__ = ["PermitGate"]

log = logging.getLogger(__name__)

_MAX_REASONS = 5
# Waiting members a timeout message names (kubectl describe shows it on each of them).
_MAX_NAMES = 20


class PermitGate:
    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        binder: Binder,
        metrics: Metrics,
        links: GateLinks | None = None,
        policy: GatePolicy | None = None,
    ) -> None:
        links = links or GateLinks()
        policy = policy or GatePolicy()
        self._links = links
        self._admission = admission
        self._metrics = metrics
        self._room = WaitingRoom(state, metrics, links.clock, links.victims, policy)
        partial = PartialBind(self._room, admission, metrics, links, policy.partial_bind)
        self._waves = BindWaves(self._room, binder, metrics, links.observer, partial, self._settled)
        self._settle_listeners: list[SettleListener] = []

    def add_settle_listener(self, listener: SettleListener) -> None:
        self._settle_listeners.append(listener)

    def _settled(self, group_key: str, outcome: SettleOutcome) -> None:
        if outcome is SettleOutcome.BOUND:
            self._admission.soft.stop(group_key)
        for listener in self._settle_listeners:
            listener(group_key, outcome)

    # ---- the bind verb's entry point ---------------------------------------------

    async def admit(self, pod: PodRecord, node: str, spec: GroupSpec, wait_seconds: float) -> None:
        """Hold `pod` (reserved on `node`) until its gang is whole, then bind it.

        Returns once the pod is bound; raises GateError when it was released
        (timeout, deletion, failed binding) with a message for the user.
        """
        room = self._room
        group = room.group_for(spec)
        room.victims.answer_now(pod.key)
        previous = group.waiting.pop(pod.key, None)
        if previous is not None:
            room.release(previous, "superseded by a newer bind request for the same pod")
        if pod.key in group.binding:
            raise GateError(f"pod {pod.key} is already being bound by the gate")
        waiter = room.enter(group, pod, node)
        if spec.plain_after_timeout:
            self._admission.soft.start(spec.key)
        waiter.timer = asyncio.get_running_loop().call_later(
            wait_seconds, self._expire, spec.key, waiter, wait_seconds
        )
        log.debug(
            "gang member reserved",
            extra={"pod": pod.key, "podgroup": spec.key, "node": node, "verb": "bind"},
        )
        if not self._waves.open(spec.key):
            present = room.permit(group).present
            self._links.observer.member_waiting(
                member_ref(waiter), spec.key, present, spec.min_member
            )
            if self._links.waker is not None:
                # Siblings rejected earlier (e.g. while the group was denied) sit in
                # kube-scheduler's unschedulable queue: bring them to the gate.
                self._links.waker.wake(spec.key, exclude_uid=pod.uid)
        # shield: a dropped HTTP connection must not cancel the gate's own bookkeeping.
        await asyncio.shield(waiter.future)

    # ---- queries --------------------------------------------------------------

    def waiting(self, group_key: str) -> list[Waiter]:
        group = self._room.groups.get(group_key)
        return list(group.waiting.values()) if group else []

    def waiting_groups(self) -> dict[str, list[Waiter]]:
        groups = self._room.groups
        return {k: list(g.waiting.values()) for k, g in groups.items() if g.waiting}

    async def drain(self) -> None:
        """Wait for bindings in flight (used at shutdown and by tests)."""
        await self._waves.drain()

    # ---- letting go -------------------------------------------------------------

    def release_group(self, group_key: str, message: str) -> list[MemberRef]:
        """Answer every waiting member of the group with an error now (not at the timeout).

        kube-scheduler forgets the assumed pods and requeues them; what they
        held becomes free for other gangs at once.
        """
        group = self._room.groups.get(group_key)
        if group is None:
            return []
        wave = self._drop_all(group, message)
        if wave:
            self._metrics.admissions.labels(AdmissionResult.REJECTED).inc()
            self._settled(group_key, SettleOutcome.RELEASED)
        return wave

    def release_all(self, reason: str) -> None:
        """Answer every waiter with an error (shutdown): nothing stays reserved."""
        for group in list(self._room.groups.values()):
            for waiter in list(group.waiting.values()):
                self._room.drop(group, waiter, reason, hold=False)
        self._room.victims.release_all(reason)

    def _drop_all(self, group: GangWait, message: str) -> list[MemberRef]:
        """Answer every waiting member of the group; the members as reported."""
        now = self._room.now()
        wave = list(group.waiting.values())
        for waiter in wave:
            self._room.drop(group, waiter, message)
        return [member_ref(w, now) for w in wave]

    def _expire(self, group_key: str, waiter: Waiter, waited: float) -> None:
        group = self._room.groups.get(group_key)
        if group is None or group.waiting.get(waiter.pod_key) is not waiter:
            return
        verdict = self._room.permit(group, gaps=True)
        present = verdict.present
        waiting = sorted(w.name for w in group.waiting.values())
        names = ", ".join(waiting[:_MAX_NAMES])
        if len(waiting) > _MAX_NAMES:
            names += f" and {len(waiting) - _MAX_NAMES} more"
        short = f"; sub-groups short: {verdict.describe_groups()}" if verdict.group_gap else ""
        spec = group.spec
        # YuniKorn's Soft style: once its whole timeout has run (it may span several waits).
        plain = spec.plain_after_timeout and self._admission.soft.due(
            group_key, spec.schedule_timeout_seconds or waited
        )
        message = (
            f"gang {group_key} timed out after waiting {waited:g}s in the permit gate: "
            f"{present} of minMember {spec.min_member} members were placed{short} "
            f"(waiting: {names}){self._unplaced_reasons(group_key)}; all waiting members "
            "were released"
            + (
                " and, as its gangSchedulingStyle is Soft, every member is scheduled as a "
                "plain pod from now on (no longer all or nothing)"
                if plain
                else ""
            )
        )
        log.info(message, extra={"podgroup": group_key, "verb": "bind"})
        released = self._drop_all(group, message)
        self._links.observer.gang_timed_out(group_key, released, message)
        if plain:
            self._admission.soft.fall_back(group_key)
            if self._links.waker is not None:
                # Members parked in kube-scheduler's unschedulable queue may go now.
                self._links.waker.wake(group_key)
        else:
            # The released members are parked as "denied"; retried when that expires.
            deny_for_a_while(self._admission, self._links, group_key, DenyReason.TIMEOUT, message)
        self._metrics.admissions.labels(AdmissionResult.TIMEOUT).inc()
        self._settled(group_key, SettleOutcome.RELEASED)

    def _unplaced_reasons(self, group_key: str) -> str:
        """Why the members still missing were not placed: kube-scheduler's latest word."""
        members = self._room.state.members(group_key)
        unplaced = sorted((p for p in members if not p.placed_node), key=lambda p: p.name)
        if not unplaced:
            return ""
        parts = [
            f"{p.name}: {_clip(p.unschedulable_message) or 'not tried by the scheduler yet'}"
            for p in unplaced[:_MAX_REASONS]
        ]
        more = f" and {len(unplaced) - _MAX_REASONS} more" if len(unplaced) > _MAX_REASONS else ""
        return f"; not placed: {'; '.join(parts)}{more}"

    # ---- what the watch reports ---------------------------------------------------

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A waiter whose pod was deleted or bound elsewhere leaves; a bound sibling may open."""
        pod = old or new
        if pod is None:
            return
        self._room.victims.on_pod_change(old, new)
        if pod.group is None:
            return
        soft = self._admission.soft
        if (
            new is None
            and soft.tracks(pod.group.key)
            and not self._room.state.members(pod.group.key)
        ):
            soft.forget(pod.group.key)  # the gang has no pods left: a new run is a gang again
        group = self._room.groups.get(pod.group.key)
        if group is None:
            return
        waiter = group.waiting.get(pod.key)
        if waiter is not None:
            reason = _why_left(pod.key, group.spec.key, waiter, new)
            if reason is not None:
                log.info(reason, extra={"pod": pod.key, "podgroup": group.spec.key})
                gone = new is None or new.uid != waiter.uid or new.deleting
                # A victim's deletion is answered a moment later; a pod bound elsewhere now.
                self._room.drop(group, waiter, reason, hold=gone, gone=gone)
                return
        if new is not None and new.node_name and (old is None or not old.node_name):
            # A sibling's binding became visible: the waiting wave may be complete.
            asyncio.get_running_loop().call_soon(self._waves.open, pod.group.key)


def _why_left(pod_key: str, group_key: str, waiter: Waiter, new: PodRecord | None) -> str | None:
    """Why a waiting member leaves the gate as its pod changed (None: it stays)."""
    if new is None or new.uid != waiter.uid:
        return f"pod {pod_key} was deleted while waiting for its gang {group_key}"
    if new.deleting:
        return f"pod {pod_key} is being deleted; it left gang {group_key}"
    if new.node_name:
        return (
            f"pod {pod_key} was bound to {new.node_name} by someone else while "
            f"waiting in the gate of gang {group_key}"
        )
    return None


def _clip(message: str, limit: int = 240) -> str:
    """One quoted scheduler message (they can quote earlier gang messages in turn)."""
    return message if len(message) <= limit else message[: limit - 3] + "..."
