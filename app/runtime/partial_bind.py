"""The end of an admission whose bindings partly failed: answer the failed, apply --on-partial-bind.

A gang left below minMember bound either has the members this admission
bound deleted, for their controllers to recreate them and the gang to be
retried whole (delete-bound), or keeps them bound for the failed members to
join when kube-scheduler retries (leave).
"""

from __future__ import annotations

import asyncio
import logging

from app.base.metrics import Metrics
from app.core.admission import Admission, DenyReason, PermitVerdict, permit
from app.core.groups import GroupSpec
from app.core.observer import MemberRef
from app.runtime.gate_settings import GateLinks, PartialBindPolicy
from app.runtime.waiting_room import (
    AdmissionResult,
    GangWait,
    GateError,
    WaitingRoom,
    member_ref,
    set_exception,
)

log = logging.getLogger(__name__)


def deny_for_a_while(
    admission: Admission, links: GateLinks, group_key: str, reason: DenyReason, message: str
) -> None:
    """Deny the group, and retry its members parked meanwhile once the denial expires.

    Members turned away while denied (and recreated pods) sit in
    kube-scheduler's unschedulable queue until something touches them.
    """
    admission.deny(group_key, reason, message)
    if links.waker is not None:
        links.waker.wake_after(group_key, admission.denied_ttl_seconds + 0.1)


class PartialBind:
    def __init__(
        self,
        room: WaitingRoom,
        admission: Admission,
        metrics: Metrics,
        links: GateLinks,
        policy: PartialBindPolicy,
    ) -> None:
        self._room = room
        self._admission = admission
        self._metrics = metrics
        self._links = links
        self._policy = policy

    async def settle(self, group_key: str, group: GangWait) -> None:
        """The last binding in flight returned: answer the failed members, apply the policy."""
        failures, bound = group.episode_failed, group.episode_bound
        group.episode_failed, group.episode_bound = [], []
        if not failures:
            self._metrics.admissions.labels(AdmissionResult.ADMITTED).inc()
            return
        # A gang left below minMember bound: the case --on-partial-bind decides.
        # The bound members alone: what stays if the gate lets go.
        kept = permit(group.spec, self._room.bound_members(group_key), {}, {})
        partial = bool(bound) and kept.missing > 0
        rollback = (
            partial
            and self._policy is PartialBindPolicy.DELETE_BOUND
            and self._links.deleter is not None
        )
        outcome = self._outcome(group.spec, kept, bound, rollback)
        observer = self._links.observer
        for waiter, error in failures:
            message = (
                f"gang {group_key} was admitted but binding pod {waiter.pod_key} to "
                f"{waiter.node} failed: {error}; {outcome}"
            )
            observer.bind_failed(member_ref(waiter), group_key, message)
            set_exception(waiter.future, GateError(message))
        self._metrics.admissions.labels(
            AdmissionResult.ROLLED_BACK if rollback else AdmissionResult.REJECTED
        ).inc()
        if partial:
            refused = "; ".join(f"{w.pod_key} to {w.node}: {e}" for w, e in failures[:3])
            observer.gang_partly_bound(group_key, bound, f"binding {refused}; {outcome}", rollback)
        if rollback:
            await self._roll_back(group_key, group, bound, outcome)

    def _outcome(
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
        self, group_key: str, group: GangWait, bound: list[MemberRef], why: str
    ) -> None:
        """Delete the members this admission bound: a gang below minMember never stays.

        Members that reached the gate meanwhile are released too: counted with
        siblings about to be deleted, they would open a wave of their own.
        """
        deleter = self._links.deleter
        assert deleter is not None
        deny_for_a_while(self._admission, self._links, group_key, DenyReason.BIND_FAILED, why)
        for waiter in list(group.waiting.values()):
            self._room.drop(group, waiter, f"gang {group_key} is retried whole: {why}")
        results = await asyncio.gather(
            *(deleter.evict_pod(m.namespace, m.name, m.uid) for m in bound),
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
