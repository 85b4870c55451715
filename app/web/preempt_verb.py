"""The preempt verb: which of kube-scheduler's proposed victims may go, for whom.

A plain pod's victims are filtered so no gang is broken below its minimum;
a gang member's are answered from the gang's preemption plan
(app/runtime/preemption/plans.py), made once for the whole gang.
"""

from __future__ import annotations

import logging
from typing import Any

from app.core.preemption.victims import Preemptor
from app.runtime.preemption.plans import PreemptionPlans
from app.web.pod_view import PodViews
from app.web.verb_context import VerbCore
from app.web.wire import PreemptArgs, preempt_result

log = logging.getLogger(__name__)


class PreemptVerb:
    def __init__(self, core: VerbCore, views: PodViews, plans: PreemptionPlans) -> None:
        self._core = core
        self._views = views
        self._plans = plans

    def preempt(self, args: PreemptArgs) -> dict[str, Any]:
        pod = self._views.view(args.pod)
        if not self._plans.listed():
            return _unlisted(pod.key)
        if pod.problem is not None:
            # A gang member whose PodGroup we cannot use (not delivered by our
            # watch yet, or invalid) is no plain pod: it may evict nothing, as
            # our filter would have turned it away. kube-scheduler can ask this
            # before it ever called our filter (when no node passed its own
            # filters), and retries the pod once the PodGroup arrives.
            log.info(
                "preempting nothing: %s",
                pod.problem.message,
                extra={"pod": pod.key, "verb": "preempt", "reason": pod.problem.reason},
            )
            if pod.ref is not None:
                # Asked again when a member arrives or room frees (unasked.py): the
                # PodGroup may be in kube-scheduler's view and not yet in ours.
                self._plans.refusals.remember(pod.ref.key)
            return preempt_result([])
        spec = pod.spec
        preemptor = Preemptor(pod.key, pod.uid, pod.priority, spec.key if spec else None)
        if spec is None or pod.ref is None or self._core.admission.soft.is_plain(spec.key):
            return preempt_result(self._plans.plain(preemptor, pod.requests, args.candidates))
        # A gang whose plan lives is answered from it: the plan was made when the
        # gang could start, and our watch may not have delivered a sibling that
        # kube-scheduler already knows (refusing then left the plan's other
        # slots without a member to take them until it expired).
        core = self._core
        blocker = (
            None
            if self._plans.lives(spec.key)
            else core.admission.preemption_blocker(
                spec,
                self._views.siblings(spec, pod.ref, pod.uid),
                core.state.total_allocatable(),
            )
        )
        if blocker is not None:
            log.info(
                "preempting nothing: %s",
                blocker,
                extra={"pod": pod.key, "podgroup": spec.key, "verb": "preempt"},
            )
            self._plans.refuse(spec.key, blocker)
            return preempt_result([])
        answer = self._plans.answer(spec, pod.ref, preemptor, pod.demand, args.candidates)
        if answer.unplanned:
            self._plans.refusals.remember(spec.key)  # asked again as our view changes
        log.info(
            "%s",
            answer.message,
            extra={"pod": pod.key, "podgroup": spec.key, "verb": "preempt"},
        )
        return preempt_result(answer.candidates)


def _unlisted(pod_key: str) -> dict[str, Any]:
    """Just started: which proposed victims are gang members is not known yet. The soak
    (issue 49, seed 4) saw a running gang's member evicted for a plain pod in the second
    between an extender restart and its first list of pods."""
    log.info(
        "preempting nothing: the extender has just started and not yet listed the pods, so "
        "it cannot tell which victims belong to gangs; kube-scheduler tries again",
        extra={"pod": pod_key, "verb": "preempt"},
    )
    return preempt_result([])
