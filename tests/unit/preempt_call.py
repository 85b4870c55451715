"""The preempt verb's call for one gang member, as the unit tests of preemption make it."""

from __future__ import annotations

from app.core.packing import Demand
from app.core.preemption.victims import Preemptor, VictimCandidate
from app.core.state import ClusterState
from app.runtime.preemption.plan import Answer
from app.runtime.preemption.plans import PreemptionPlans


def preempt_call(
    state: ClusterState, plans: PreemptionPlans, pod_key: str, ours: bool = False
) -> Answer:
    """Member `pod_key` asks to preempt with every node offered (kube-scheduler offers each
    node where evicting lower-priority pods could help): the plans' answer. `ours`: asked
    by the extender's own preemption (unasked.py), whose evictor deletes the victims."""
    member = state.pods[pod_key]
    assert member.group is not None
    spec = state.group_spec(member.group)
    preemptor = Preemptor(member.key, member.uid, member.priority, spec.key)
    own = Demand(member.key, member.requests, member.placement)
    offered = [VictimCandidate(n, [], 0) for n in state.nodes]
    return plans.answer(spec, member.group, preemptor, own, offered, ours=ours)
