"""Gang members (and preemptors) that reached the cluster without their mark, gang-only mode.

kube-scheduler calls the gang-only extender entry only for pods that request
the member resource (app/core/marking.py), so a member the webhook did not mark
(the extender was down when the pod was created, the
MutatingWebhookConfiguration was missing, the pod named another scheduler
then) would be placed and bound by kube-scheduler alone, below minMember.
The ValidatingAdmissionPolicy refuses such pods at creation; where it is not
installed, this listener is the alarm: a Warning Event on the pod that says
what to fix, and a counter an alert can watch. It cannot hold the pod: no
verb of ours is called for it.

With --expect-marked-preemptors the same goes for a plain pod that may
preempt and came without the preemptor mark. The MutatingAdmissionPolicy
that marks such pods runs in the API server itself, so this happens only to
pods created before the policy was installed (or with it removed, or where
its failurePolicy Ignore let an error through); if one preempts,
kube-scheduler does so without asking us, so the warning is all there is.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Protocol

from app.base.metrics import Metrics
from app.core.observer import MemberRef
from app.core.records import PodRecord
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE

log = logging.getLogger(__name__)


class NotMarkedReport(Protocol):
    def member_not_marked(self, member: MemberRef, group_key: str, message: str) -> None: ...

    def preemptor_not_marked(self, pod: MemberRef, message: str) -> None: ...


def not_marked_message(group_key: str) -> str:
    return (
        f"this pod is a member of gang {group_key} but requests no {MEMBER_RESOURCE}: "
        "kube-scheduler does not call gang-extender for it and may bind it alone, below "
        "the gang's minMember. gang-extender's admission webhook did not mark it (was the "
        "extender down, or its MutatingWebhookConfiguration missing, when the pod was "
        "created?) and no ValidatingAdmissionPolicy refused it (install the chart's "
        "gang-extender-member-mark policy). Delete the pod: its controller creates it "
        "again, and the webhook marks the new one."
    )


def preemptor_not_marked_message(priority: int) -> str:
    return (
        f"this pod may preempt others (priority {priority}) but requests no "
        f"{PREEMPTOR_RESOURCE}: if it preempts, kube-scheduler does not ask gang-extender "
        "first and may evict part of a running gang. gang-extender's preemptor-mark "
        "MutatingAdmissionPolicy did not mark it (was it installed, with its binding, when "
        "the pod was created?). If it is still pending, delete it: its controller "
        "creates it again, and the policy marks the new one."
    )


class UnmarkedMembers:
    """Reports each pending pod of our schedulers that lacks the mark it needs, once."""

    def __init__(
        self,
        report: NotMarkedReport,
        metrics: Metrics,
        scheduler_names: Collection[str] = (),
        expect_marked_preemptors: bool = False,
    ) -> None:
        self._report = report
        self._metrics = metrics
        # Empty: every scheduler calls us (as the webhook's --webhook-scheduler-names).
        self._scheduler_names = frozenset(scheduler_names)
        self._expect_marked_preemptors = expect_marked_preemptors

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if new is None or not self._needs_report(new):
            return
        if old is not None and old.uid == new.uid:
            return  # seen already: one report per pod
        if new.node_name or new.terminal or new.deleting:
            return
        if self._scheduler_names and new.scheduler_name not in self._scheduler_names:
            return
        pod = MemberRef(new.namespace, new.name, new.uid)
        if new.group is None:
            text = preemptor_not_marked_message(new.priority)
            log.warning(text, extra={"pod": new.key})
            self._metrics.unmarked_preemptors.inc()
            self._report.preemptor_not_marked(pod, text)
            return
        message = not_marked_message(new.group.key)
        log.warning(message, extra={"pod": new.key, "podgroup": new.group.key})
        self._metrics.unmarked_members.inc()
        self._report.member_not_marked(pod, new.group.key, message)

    def _needs_report(self, pod: PodRecord) -> bool:
        """A member without the member mark, or (when preemptors are marked) a plain pod
        that may preempt without its mark: the policy that marks them runs in
        the API server for every namespace, so one without it anywhere was
        created before the policy existed.
        """
        if pod.group is not None:
            return not pod.marked
        return self._expect_marked_preemptors and pod.unmarked_preemptor
