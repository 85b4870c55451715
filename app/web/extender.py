"""The four extender verbs, on top of the admission core, the gate and the cluster state.

This is the glue between the wire (app/web/wire.py, app/web/routes.py) and the
decision logic: it looks the pod's group up, asks Admission whether the group
may be placed, and sends gang members through the PermitGate. Pods that
belong to no group pass every verb untouched and are bound at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.admission import Admission, FilterReason, PermitVerdict, WaitPolicy, wholeness
from app.core.groups import (
    GroupLabelError,
    GroupRef,
    GroupSpec,
    PodGroupSpecError,
    describe_task_shortfall,
    group_ref_of_pod,
)
from app.core.hypernode import tier_of
from app.core.observer import GangObserver, MemberRef, NullObserver
from app.core.packing import Demand, placement_of
from app.core.resources import QuantityError, pod_requests
from app.core.scoring import NodeScorer, ScoringPolicy
from app.core.state import ClusterState, GroupNotFound, PodRecord, node_record_from, pod_record_from
from app.core.topology import Domain, TopologyConstraint, TopologyError, domain_message
from app.core.topology_sources import constraint_from_annotations
from app.kube.errors import ApiError
from app.ops.metrics import Metrics
from app.runtime.arbiter import Arbiter, Candidate
from app.runtime.gate import GateError, PermitGate
from app.runtime.preemption import PreemptionPlans, Preemptor, VictimPolicy
from app.runtime.wakeup import SiblingWaker
from app.web.wire import (
    BindingArgs,
    ExtenderArgs,
    PreemptArgs,
    binding_result,
    filter_result,
    host_priorities,
    preempt_result,
)

log = logging.getLogger(__name__)


class PodApi(Protocol):
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class GroupProblem:
    """The pod names a group that cannot be used: it is turned away with this."""

    reason: FilterReason
    message: str


@dataclass(frozen=True, slots=True)
class PodView:
    """What the verbs need of the pod kube-scheduler sent, and its group, read once."""

    namespace: str
    name: str
    uid: str
    priority: int
    # The Pod's spec as sent (requests and placement are read from it when needed).
    pod_spec: Mapping[str, Any]
    ref: GroupRef | None
    spec: GroupSpec | None
    problem: GroupProblem | None
    # Kueue's topology annotations on the pod (app/core/topology.py).
    topology: TopologyConstraint | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def member(self) -> MemberRef:
        return MemberRef(self.namespace, self.name, self.uid)


class GangExtender:
    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        gate: PermitGate,
        api: PodApi,
        metrics: Metrics,
        wait: WaitPolicy,
        waker: SiblingWaker | None = None,
        observer: GangObserver | None = None,
        scoring: ScoringPolicy | None = None,
        arbiter: Arbiter | None = None,
        plans: PreemptionPlans | None = None,
    ) -> None:
        # None: members are admitted one by one (Arbiter.applies says which gangs it places).
        self.arbiter = arbiter
        self._scorer = NodeScorer(scoring or ScoringPolicy(), state)
        # What the preempt verb answers, and every victim it handed out.
        self.plans = plans or PreemptionPlans(
            state, VictimPolicy.PROTECT, metrics, waker=waker, observer=observer
        )
        self._waker = waker
        self._observer: GangObserver = observer or NullObserver()
        self.state = state
        self.admission = admission
        self.gate = gate
        self._api = api
        self._metrics = metrics
        self._wait = wait

    # ---- filter -------------------------------------------------------------------

    def view(self, pod: dict[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        pod_spec = pod.get("spec") or {}
        namespace = meta.get("namespace") or "default"
        ref: GroupRef | None = None
        spec: GroupSpec | None = None
        problem: GroupProblem | None = None
        topology: TopologyConstraint | None = None
        try:
            ref = group_ref_of_pod(namespace, meta, pod_spec, self.state.sources)
            if ref is not None:
                topology = constraint_from_annotations(meta.get("annotations"), "pod")
        except (GroupLabelError, TopologyError) as err:
            problem = GroupProblem(FilterReason.BAD_GROUP, str(err))
        if ref is not None:
            try:
                spec = self.state.group_spec(ref)
            except GroupNotFound as err:
                problem = GroupProblem(FilterReason.NO_GROUP, str(err))
            except PodGroupSpecError as err:
                problem = GroupProblem(FilterReason.BAD_GROUP, str(err))
        return PodView(
            namespace,
            meta.get("name") or "",
            meta.get("uid") or "",
            int(pod_spec.get("priority") or 0),
            pod_spec,
            ref,
            spec,
            problem,
            topology,
        )

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        names = args.names
        self._metrics.filter_requests.labels(
            "node-names" if args.node_names is not None else "nodes"
        ).inc()
        pod = self.view(args.pod)
        if pod.problem is not None:
            problem = pod.problem
            self._metrics.filter_decisions.labels(problem.reason).inc()
            return self._reject(args, names, pod, problem.reason, problem.message)
        if pod.ref is None or pod.spec is None:
            return filter_result(args, names, {}, {})
        spec = pod.spec
        siblings = self._siblings(spec, pod.ref, pod.uid)
        if siblings.task_gap:
            self._metrics.filter_decisions.labels(FilterReason.TOO_FEW_SIBLINGS).inc()
            message = describe_task_shortfall(spec, list(siblings.task_gap))
            return self._reject(args, names, pod, FilterReason.TOO_FEW_SIBLINGS, message)
        verdict = self.admission.check(
            spec,
            siblings,
            lambda: self.state.free_resources(exclude_group=spec.key),
        )
        arbiter = self.arbiter
        if verdict.admitted and arbiter is not None and arbiter.applies(spec, pod.topology):
            verdict = arbiter.admit(
                spec,
                pod.ref,
                Candidate(pod.key, pod.uid, pod.priority, pod.pod_spec, pod.topology),
            )
        self._metrics.filter_decisions.labels(verdict.reason).inc()
        if not verdict.admitted:
            return self._reject(args, names, pod, verdict.reason, verdict.message)
        if verdict.reason is FilterReason.ADMITTED and self._waker is not None:
            # The group just became admissible: siblings rejected before sit in
            # kube-scheduler's unschedulable queue until something touches them.
            self._waker.wake(spec.key, exclude_uid=pod.uid)
        log.debug(
            "gang member admitted by filter (%s)",
            verdict.reason,
            extra={"pod": pod.key, "podgroup": spec.key, "verb": "filter"},
        )
        placed = self.arbiter.domain(spec, pod.topology) if self.arbiter is not None else None
        if placed is not None:
            return self._in_domain(args, names, spec.key, *placed)
        return filter_result(args, names, {}, {})

    def _in_domain(
        self,
        args: ExtenderArgs,
        names: list[str],
        group_key: str,
        domain: Domain,
        constraint: TopologyConstraint,
    ) -> dict[str, Any]:
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
        nodes = self.state.nodes
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
        return filter_result(args, passed, {}, outside)

    def _siblings(self, spec: GroupSpec, ref: GroupRef, uid: str) -> PermitVerdict:
        """The group's existing pods against its minimums (minMember, minTaskMember).

        The pod being scheduled counts even if our watch has not delivered it yet.
        """
        members = self.state.members(ref.key)
        unseen = bool(uid) and not any(p.uid == uid for p in members)

        def tasks() -> list[str]:
            found = [p.group.task for p in members if p.group is not None]
            return [*found, ref.task] if unseen else found

        return wholeness(spec, len(members) + unseen, tasks)

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
            self._observer.member_rejected(pod.member, group_key, reason, message)
            if self._waker is not None:
                self._waker.turned_away(group_key, pod.uid)
        if self.arbiter is not None:
            self.arbiter.note_rejection(pod.uid, message)
        log.debug(
            message,
            extra={"pod": pod.key, "podgroup": group_key, "verb": "filter", "reason": reason},
        )
        # Group-level reasons: no node is better than another and evicting pods
        # cannot help, so every node is "unresolvable" and kube-scheduler skips
        # preemption for this pod.
        return filter_result(args, [], {}, dict.fromkeys(names, message))

    # ---- prioritize -----------------------------------------------------------------

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        pod = self.view(args.pod)
        try:
            requests = pod_requests(pod.pod_spec)
        except QuantityError:
            requests = {}
        in_request = (
            {n["metadata"]["name"]: node_record_from(n) for n in args.nodes}
            if args.nodes is not None
            else None
        )
        group_key = pod.spec.key if pod.spec is not None else None
        scores = self._scorer.score(requests, group_key, args.names, in_request)
        return host_priorities(scores)

    # ---- preempt ----------------------------------------------------------------------

    def preempt(self, args: PreemptArgs) -> dict[str, Any]:
        pod = self.view(args.pod)
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
            return preempt_result([])
        spec = pod.spec
        preemptor = Preemptor(pod.key, pod.uid, pod.priority, spec.key if spec else None)
        if spec is None or pod.ref is None:
            return preempt_result(self.plans.plain(preemptor, args.candidates))
        # A gang whose plan lives is answered from it: the plan was made when the
        # gang could start, and our watch may not have delivered a sibling that
        # kube-scheduler already knows (refusing then left the plan's other
        # slots without a member to take them until it expired).
        blocker = (
            None
            if self.plans.lives(spec.key)
            else self.admission.preemption_blocker(
                spec, self._siblings(spec, pod.ref, pod.uid), self.state.total_allocatable()
            )
        )
        if blocker is not None:
            log.info(
                "preempting nothing: %s",
                blocker,
                extra={"pod": pod.key, "podgroup": spec.key, "verb": "preempt"},
            )
            self.plans.refuse(spec.key, blocker)
            return preempt_result([])
        try:
            requests = pod_requests(pod.pod_spec)
        except QuantityError:
            requests = {}
        own = Demand(pod.key, requests, placement_of(pod.pod_spec))
        answer = self.plans.answer(spec, pod.ref, preemptor, own, args.candidates)
        log.info(
            "%s",
            answer.message,
            extra={"pod": pod.key, "podgroup": spec.key, "verb": "preempt"},
        )
        return preempt_result(answer.candidates)

    # ---- bind ----------------------------------------------------------------------------

    async def bind(self, args: BindingArgs) -> dict[str, Any]:
        try:
            await self._bind(args)
        except (GateError, ApiError) as err:
            return binding_result(str(err))
        return binding_result()

    async def _bind(self, args: BindingArgs) -> None:
        pod = await self._lookup(args)
        if pod.node_name:
            raise GateError(f"pod {pod.key} is already bound to {pod.node_name}")
        if pod.group_error:
            raise GateError(pod.group_error)
        if pod.group is None:
            try:
                await self._api.bind(pod.namespace, pod.name, pod.uid, args.node)
            except ApiError as err:
                self._metrics.bind_errors.labels(err.reason).inc()
                self._observer.bind_failed(
                    MemberRef(pod.namespace, pod.name, pod.uid, args.node), None, str(err)
                )
                raise
            self.state.assume_bound(pod.key, args.node)
            return
        try:
            spec = self.state.group_spec(pod.group)
        except (GroupNotFound, PodGroupSpecError) as err:
            raise GateError(str(err)) from None
        await self.gate.admit(pod, args.node, spec, self._wait.for_group(spec))

    async def _lookup(self, args: BindingArgs) -> PodRecord:
        pod = self.state.pods.get(args.pod_key)
        if pod is None or (args.pod_uid and pod.uid != args.pod_uid):
            # Our watch may lag behind kube-scheduler's: ask the API server.
            raw = await self._api.read_pod(args.pod_namespace, args.pod_name)
            if raw is None:
                raise GateError(f"pod {args.pod_key} not found: it was deleted before binding")
            fresh = pod_record_from(raw, self.state.sources)
            if args.pod_uid and fresh.uid != args.pod_uid:
                raise GateError(
                    f"pod {args.pod_key} was recreated (uid {fresh.uid}, scheduler asked to "
                    f"bind {args.pod_uid}); the new pod is scheduled on its own"
                )
            self.state.apply_pod(raw)
            pod = self.state.pods[args.pod_key]
        return pod
