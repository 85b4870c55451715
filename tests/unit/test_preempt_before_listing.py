"""The preempt verb names no victim before the pod cache has been listed once (issue 49's
soak, seed 4: in the second between an extender restart and its first list of pods,
kube-scheduler proposed a running gang's member as a plain pod's victim, and the extender,
not knowing the pod was a gang member, let it go: the gang ran below its minMember)."""

from __future__ import annotations

from app.core.preemption.victims import VictimCandidate
from app.core.state import ClusterState
from app.core.topology.domains import DEFAULT_LEVELS
from app.web.wire import PreemptArgs
from tests.unit.builders import node, pod
from tests.unit.fakes import ExtenderOnState
from tests.unit.test_kept_room import with_priority


def test_no_victim_is_named_until_the_pods_are_listed() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1", cpu="4")])
    extender = ExtenderOnState(state, DEFAULT_LEVELS, every_gang=True).extender
    listed = False
    extender.plans.listed = lambda: listed
    plain = with_priority(pod("plain", cpu="4"), 2000)
    args = PreemptArgs(plain, [VictimCandidate("n1", ["uid-default-low"], 0)])
    assert extender.preempt(args)["NodeNameToMetaVictims"] == {}

    # Listed: the victim (a pod in no gang, of lower priority) may go.
    state.apply_pod(pod("low", node="n1", cpu="4", phase="Running"))
    listed = True
    victims = extender.preempt(args)["NodeNameToMetaVictims"]
    assert [p["UID"] for p in victims["n1"]["Pods"]] == ["uid-default-low"]
