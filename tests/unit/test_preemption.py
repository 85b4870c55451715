"""Plain preemptors' candidates (select_victims) and the gang-agnostic blocker."""

from app.base.metrics import Metrics
from app.core.admission import Admission, wholeness
from app.core.groups import GroupSpec
from app.core.preemption.victim_pool import node_victims
from app.core.preemption.victims import Preemptor, VictimCandidate, VictimPolicy, select_victims
from app.core.state import ClusterState
from app.runtime.preemption.plans import PreemptionPlans
from tests.unit.builders import node, pod, podgroup


def cluster() -> ClusterState:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2"), node("n3")])
    state.apply_podgroup(podgroup("low", 3))
    # A running gang of 4 with minMember 3: one extra member.
    for i, n in enumerate(["n1", "n1", "n2", "n3"]):
        state.apply_pod(pod(f"low-{i}", group="low", node=n, cpu="1"))
    state.apply_pod(pod("plain", node="n2", cpu="1"))
    return state


def uid(name: str) -> str:
    return f"uid-default-{name}"


HIGH = Preemptor("default/high", "uid-high", 1000, None)


def test_protect_allows_evicting_only_the_extra_member() -> None:
    state = cluster()
    one = VictimCandidate("n1", [uid("low-0")], 0)
    two = VictimCandidate("n1", [uid("low-0"), uid("low-1")], 0)
    plain = VictimCandidate("n2", [uid("plain")], 1)
    selection = select_victims(HIGH, [one, plain], state, VictimPolicy.PROTECT)
    assert selection.candidates == [one, plain]  # order and PDB count kept
    selection = select_victims(HIGH, [two], state, VictimPolicy.PROTECT)
    assert selection.candidates == []
    assert "below its minMember 3" in selection.dropped["n1"]


def test_whole_gang_extends_victims_to_the_members_on_the_same_node() -> None:
    state = cluster()
    selection = select_victims(
        HIGH, [VictimCandidate("n1", [uid("low-0")], 0)], state, VictimPolicy.WHOLE_GANG
    )
    assert selection.candidates == [VictimCandidate("n1", [uid("low-0"), uid("low-1")], 0)]


def test_victims_leaving_already_are_not_named_nor_added_by_whole_gang() -> None:
    """Being deleted, or evicted by a gang's plan (`going`): their departure retries the
    preemptor, kube-scheduler's own delete call for them might not."""
    state = cluster()
    state.apply_pod(pod("low-1", group="low", node="n1", cpu="1", deleting=True))
    candidate = VictimCandidate("n1", [uid("low-0"), uid("low-1")], 0)
    selection = select_victims(HIGH, [candidate], state, VictimPolicy.WHOLE_GANG)
    assert selection.candidates == [VictimCandidate("n1", [uid("low-0")], 0)]
    selection = select_victims(HIGH, [candidate], state, VictimPolicy.WHOLE_GANG, {uid("low-0")})
    assert selection.candidates == []
    assert "leaving the node already" in selection.dropped["n1"]
    # The whole gang goes, but a member a plan is evicting is not named again.
    one = VictimCandidate("n1", [uid("low-0")], 0)
    selection = select_victims(HIGH, [one], cluster(), VictimPolicy.WHOLE_GANG, {uid("low-1")})
    assert selection.candidates == [VictimCandidate("n1", [uid("low-0")], 0)]
    plain = VictimCandidate("n2", [uid("plain"), uid("low-2")], 0)
    selection = select_victims(HIGH, [plain], cluster(), VictimPolicy.PROTECT, {uid("plain")})
    assert selection.candidates == [VictimCandidate("n2", [uid("low-2")], 0)]


def test_whole_gang_refuses_when_a_member_outranks_the_preemptor() -> None:
    state = cluster()
    important = pod("low-3", group="low", node="n3", cpu="1")
    important["spec"]["priority"] = 2000
    state.apply_pod(important)
    selection = select_victims(
        HIGH, [VictimCandidate("n1", [uid("low-0")], 0)], state, VictimPolicy.WHOLE_GANG
    )
    assert selection.candidates == []
    assert "default/low-3" in selection.dropped["n1"]


def test_never_evict_a_member_of_the_preemptors_own_gang() -> None:
    state = cluster()
    own = Preemptor("default/low-9", "uid-9", 1000, "default/low")
    selection = select_victims(
        own, [VictimCandidate("n2", [uid("plain"), uid("low-2")], 0)], state, VictimPolicy.PROTECT
    )
    assert selection.candidates == []
    assert "own gang" in selection.dropped["n2"]


def test_unknown_victims_are_treated_as_plain_pods() -> None:
    state = cluster()
    candidate = VictimCandidate("n3", ["not-in-cache"], 0)
    assert select_victims(HIGH, [candidate], state, VictimPolicy.PROTECT).candidates == [candidate]


def test_victims_whose_bind_the_gate_refused_are_not_evicted() -> None:
    """kube-scheduler's snapshot may still show a pod the gate just released."""
    state = cluster()
    state.apply_pod(pod("held-0", group="mid", cpu="1"))
    state.apply_pod(pod("held-1", group="mid", cpu="1"))
    for name in ("held-0", "held-1"):
        state.reserve(f"default/{name}", "n3")
    state.unreserve("default/held-0")  # the gate answered its bind with an error
    only_refused = VictimCandidate("n3", [uid("held-0")], 0)
    mixed = VictimCandidate("n3", [uid("held-0"), uid("held-1")], 0)
    selection = select_victims(HIGH, [only_refused], state, VictimPolicy.WHOLE_GANG)
    assert selection.candidates == []
    assert "leaving the node already" in selection.dropped["n3"]
    selection = select_victims(HIGH, [mixed], state, VictimPolicy.WHOLE_GANG)
    assert selection.candidates == [VictimCandidate("n3", [uid("held-1")], 0)]
    # Reserved again by a later bind call: a victim like any other.
    state.reserve("default/held-0", "n3")
    assert select_victims(HIGH, [only_refused], state, VictimPolicy.WHOLE_GANG).candidates == [
        only_refused
    ]


def test_preemption_blocker_is_read_only() -> None:
    admission = Admission(3)
    spec = GroupSpec("ns/g", 3, {"cpu": 100_000})
    assert "beyond the whole cluster" in (
        admission.preemption_blocker(spec, wholeness(spec, 3), {"cpu": 12_000}) or ""
    )
    assert "2 of minMember 3" in (admission.preemption_blocker(spec, wholeness(spec, 2), {}) or "")
    assert (
        admission.preemption_blocker(GroupSpec("ns/g", 3), wholeness(GroupSpec("ns/g", 3), 3), {})
        is None
    )
    assert "ns/g" not in admission.denied and "ns/g" not in admission.permitted


def seed_two_node() -> ClusterState:
    """The soak's seed 2: n3 (4 CPUs) runs gang full (3 x 1 CPU, minMember 3) and a pod in no
    gang, late (1 CPU), all of priority 0."""
    state = ClusterState()
    state.replace_nodes([node("n3")])
    state.apply_podgroup(podgroup("full", 3))
    for i in range(3):
        state.apply_pod(pod(f"full-{i}", group="full", node="n3", cpu="1"))
    state.apply_pod(pod("late", node="n3", cpu="1"))
    return state


def test_a_candidate_refused_for_a_gang_is_offered_again_with_pods_in_no_gang() -> None:
    """kube-scheduler's dry run named full-2 (started after `late`, or its start time
    unknown): protect refuses it, and the plain pod waited 13 minutes though evicting
    `late` frees the CPU it needs. The node is offered again with `late` as the victim."""
    state = seed_two_node()
    plans = PreemptionPlans(state, VictimPolicy.PROTECT, Metrics())
    theirs = VictimCandidate("n3", [uid("full-2")], 0)
    assert plans.plain(HIGH, {"cpu": 1000}, [theirs]) == [VictimCandidate("n3", [uid("late")], 0)]
    # Two CPUs needed: evicting `late` is not enough, and the gang stays whole.
    assert plans.plain(HIGH, {"cpu": 2000}, [theirs]) == []


def test_pods_in_no_gang_that_are_leaving_or_above_the_preemptor_are_not_taken() -> None:
    protect = VictimPolicy.PROTECT
    state = seed_two_node()
    assert node_victims(state, protect, HIGH, {"cpu": 1000}, "n3") == [uid("late")]
    assert node_victims(state, protect, HIGH, {"cpu": 1000}, "n3", {uid("late")}) is None
    state.apply_pod(pod("late", node="n3", cpu="1", deleting=True))
    assert node_victims(state, protect, HIGH, {"cpu": 1000}, "n3") is None
    above = pod("late", node="n3", cpu="1")
    above["spec"]["priority"] = 1000  # the preemptor's
    state.apply_pod(above)
    assert node_victims(state, protect, HIGH, {"cpu": 1000}, "n3") is None
