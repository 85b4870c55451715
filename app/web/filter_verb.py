"""The filter verb: may this gang member be placed now, and on which of the nodes offered?

A group-level refusal (too few siblings, no room for the whole gang, a
broken PodGroup) marks every node unresolvable, so kube-scheduler does not
preempt for it; a gang held to a topology domain passes only that domain's
nodes. An admitted member is given the one node the prioritize score ranks
first, unless it has preferences only kube-scheduler weighs
(app/core/node_choice.py): kube-scheduler then skips scoring for it.

A pod in no gang passes every node but those whose room live preemption
plans keep for a gang at its priority or above (PreemptionPlans.kept_from):
unresolvable there, since evicting pods of lower priority than that gang
cannot give the pod the gang's room.
"""

from __future__ import annotations

import logging
from typing import Any

from app.core.admission import FilterReason
from app.core.group_rules import describe_task_shortfall
from app.core.node_choice import (
    SoftTaintedNodes,
    SoftTaints,
    soft_preference,
    soft_taints_of,
    without_disfavoured,
)
from app.core.records import NodeRecord, node_record_from
from app.core.scoring import NodeScorer
from app.core.topology.domains import Domain, TopologyConstraint, domain_message
from app.core.topology.hypernode import tier_of
from app.runtime.line import Candidate
from app.runtime.preemption.plans import PreemptionPlans
from app.web.pod_view import PodView, PodViews
from app.web.verb_context import VerbCore, VerbLinks
from app.web.wire import ExtenderArgs, filter_result

log = logging.getLogger(__name__)


class FilterVerb:
    def __init__(
        self,
        core: VerbCore,
        views: PodViews,
        links: VerbLinks,
        scorer: NodeScorer,
        plans: PreemptionPlans,
    ) -> None:
        self._core = core
        self._plans = plans
        self._views = views
        self._links = links
        self._scorer = scorer
        self._soft_tainted = SoftTaintedNodes(core.state)
        # Counted once per admitted member: the label lookups done here, not per call.
        choices = core.metrics.member_node_choices
        self._ranked_by_us = choices.labels("extender")
        self._ranked_by_scheduler = choices.labels("scheduler")

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        core, names = self._core, args.names
        core.metrics.filter_requests.labels(
            "node-names" if args.node_names is not None else "nodes"
        ).inc()
        pod = self._views.view(args.pod)
        if pod.problem is not None:
            problem = pod.problem
            core.metrics.filter_decisions.labels(problem.reason).inc()
            return self._reject(args, names, pod, problem.reason, problem.message)
        if pod.ref is None or pod.spec is None or core.admission.soft.is_plain(pod.spec.key):
            return self._plain(args, names, pod)
        spec = pod.spec
        siblings = self._views.siblings(spec, pod.ref, pod.uid)
        if siblings.task_gap:
            core.metrics.filter_decisions.labels(FilterReason.TOO_FEW_SIBLINGS).inc()
            message = describe_task_shortfall(spec, list(siblings.task_gap))
            return self._reject(args, names, pod, FilterReason.TOO_FEW_SIBLINGS, message)
        verdict = core.admission.check(
            spec,
            siblings,
            lambda: core.state.free_resources(exclude_group=spec.key),
        )
        arbiter = self._links.arbiter
        candidate = Candidate(
            pod.key,
            pod.uid,
            pod.priority,
            pod.pod_spec,
            pod.topology,
            pod.slicing,
            pod.rank,
            pod.ref.task,
            (args.pod.get("metadata") or {}).get("labels"),
        )
        if verdict.admitted and arbiter is not None and arbiter.applies(spec, candidate):
            verdict = arbiter.admit(spec, pod.ref, candidate)
        core.metrics.filter_decisions.labels(verdict.reason).inc()
        if not verdict.admitted:
            return self._reject(args, names, pod, verdict.reason, verdict.message)
        if verdict.reason is FilterReason.ADMITTED and self._links.waker is not None:
            # The group just became admissible: siblings rejected before sit in
            # kube-scheduler's unschedulable queue until something touches them.
            self._links.waker.wake(spec.key, exclude_uid=pod.uid)
        log.debug(
            "gang member admitted by filter (%s)",
            verdict.reason,
            extra={"pod": pod.key, "podgroup": spec.key, "verb": "filter"},
        )
        placed = arbiter.domain(spec, pod.topology, candidate) if arbiter is not None else None
        passed, outside = names, dict[str, str]()
        if placed is not None:
            passed, outside = self._in_domain(args, names, spec.key, *placed)
        return filter_result(args, self._pick(args, passed, pod), {}, outside)

    def _plain(self, args: ExtenderArgs, names: list[str], pod: PodView) -> dict[str, Any]:
        """A pod placed alone: every node but those whose room a gang's preemption keeps."""
        kept = self._plans.kept_from(pod.requests, pod.priority, names)
        if not kept:
            return filter_result(args, names, {}, {})
        log.info(
            "pod in no gang kept off %d node(s) a gang preempted for",
            len(kept),
            extra={"pod": pod.key, "verb": "filter", "nodes": sorted(kept)},
        )
        return filter_result(args, [n for n in names if n not in kept], {}, kept)

    def _pick(self, args: ExtenderArgs, passed: list[str], pod: PodView) -> list[str]:
        """[the node an admitted member goes to], or `passed` when kube-scheduler should rank them.

        See app/core/node_choice.py; the other nodes are left out of the
        answer, not failed: they could take the pod, we just prefer one.
        """
        scorer = self._scorer
        if len(passed) < 2 or pod.spec is None:
            return passed
        if not scorer.policy.pick_member_node or (
            soft_preference(pod.pod_spec, args.pod.get("metadata")) is not None
        ):
            self._ranked_by_scheduler.inc()
            return passed
        in_request: dict[str, NodeRecord] | None = None
        soft_taints: SoftTaints
        if args.nodes is not None:
            in_request = {n["metadata"]["name"]: node_record_from(n) for n in args.nodes}
            soft_taints = soft_taints_of(in_request)
        else:
            soft_taints = self._soft_tainted.current()
        offered = without_disfavoured(passed, soft_taints, pod.pod_spec)
        best = scorer.best(pod.requests, pod.spec.key, offered, in_request)
        (self._ranked_by_scheduler if best is None else self._ranked_by_us).inc()
        return [best] if best is not None else passed

    def _in_domain(
        self,
        args: ExtenderArgs,
        names: list[str],
        group_key: str,
        domain: Domain,
        constraint: TopologyConstraint,
    ) -> tuple[list[str], dict[str, str]]:
        """Only the nodes of the gang's domain pass; the others are told where the gang is.

        Unresolvable: evicting pods on a node outside the domain cannot make
        room for this gang, so kube-scheduler must not preempt there.
        """
        in_request = (
            {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in args.nodes}
            if args.nodes is not None
            else {}
        )
        passed: list[str] = []
        outside: dict[str, str] = {}
        # One message per other domain: thousands of nodes share a few.
        messages: dict[str | None, str] = {}
        nodes = self._core.state.nodes
        # A HyperNode tier is no label of the node objects kube-scheduler sends.
        synthetic = tier_of(domain.level) is not None
        for name in names:
            labels = None if synthetic else in_request.get(name)
            if labels is None:
                record = nodes.get(name)
                labels = record.labels if record is not None else {}
            value = labels.get(domain.level)
            if value == domain.value:
                passed.append(name)
                continue
            message = messages.get(value)
            if message is None:
                message = messages[value] = domain_message(group_key, domain, constraint, value)
            outside[name] = message
        return passed, outside

    def _reject(
        self,
        args: ExtenderArgs,
        names: list[str],
        pod: PodView,
        reason: FilterReason,
        message: str,
    ) -> dict[str, Any]:
        group_key = pod.ref.key if pod.ref is not None else None
        if group_key is not None:
            self._links.observer.member_rejected(pod.member, group_key, reason, message)
            if self._links.waker is not None:
                self._links.waker.turned_away(group_key, pod.uid)
        if self._links.arbiter is not None:
            self._links.arbiter.note_rejection(pod.uid, message)
        log.debug(
            message,
            extra={"pod": pod.key, "podgroup": group_key, "verb": "filter", "reason": reason},
        )
        # Group-level reasons: no node is better than another and evicting pods
        # cannot help, so every node is "unresolvable" and kube-scheduler skips
        # preemption for this pod.
        return filter_result(args, [], {}, dict.fromkeys(names, message))
