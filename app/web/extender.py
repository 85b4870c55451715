"""The four extender verbs, on top of the admission core, the gate and the cluster state.

This is the glue between the wire (app/web/wire.py, app/web/routes.py) and the
decision logic: each verb has its own object (filter_verb.py, preempt_verb.py,
bind_verb.py; prioritize is one call to the node scorer), and GangExtender
routes each call to it. Pods that belong to no group pass every verb
untouched and are bound at once.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from app.core.preemption.victims import VictimPolicy
from app.core.records import node_record_from
from app.core.scoring import NodeScorer, ScoringPolicy
from app.runtime.gate import PermitGate
from app.runtime.preemption.plans import PreemptionPlans
from app.web.bind_verb import BindVerb, PodBinder
from app.web.filter_verb import FilterVerb
from app.web.pod_view import PodViews
from app.web.preempt_verb import PreemptVerb
from app.web.verb_context import VerbCore, VerbLinks
from app.web.wire import BindingArgs, ExtenderArgs, PreemptArgs, host_priorities

__all__ = ["GangExtender"]


class GangExtender:
    def __init__(
        self,
        core: VerbCore,
        gate: PermitGate,
        api: PodBinder,
        links: VerbLinks | None = None,
        scoring: ScoringPolicy | None = None,
    ) -> None:
        links = links or VerbLinks()
        state = core.state
        # What the preempt verb answers, and every victim it handed out.
        self.plans = links.plans or PreemptionPlans(
            state, VictimPolicy.PROTECT, core.metrics, waker=links.waker, observer=links.observer
        )
        self._views = PodViews(state)
        self._scorer = NodeScorer(scoring or ScoringPolicy(), state)
        self._filter = FilterVerb(core, self._views, links, self._scorer, self.plans)
        self._preempt = PreemptVerb(core, self._views, self.plans)
        self._bind = BindVerb(core, gate, api, links)

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        return self._filter.filter(args)

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        pod = self._views.view(args.pod)
        in_request = (
            {n["metadata"]["name"]: node_record_from(n) for n in args.nodes}
            if args.nodes is not None
            else None
        )
        group_key = pod.spec.key if pod.spec is not None else None
        scores = self._scorer.score(pod.requests, group_key, args.names, in_request)
        return host_priorities(scores)

    def preempt(self, args: PreemptArgs) -> dict[str, Any]:
        return self._preempt.preempt(args)

    def bind(self, args: BindingArgs) -> Coroutine[Any, Any, dict[str, Any]]:
        # Handed on, not awaited here: a frame less for every member waiting in the gate.
        return self._bind.bind(args)
