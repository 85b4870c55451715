from collections.abc import Sequence

from app.admission import Admission, wholeness
from app.groups import GroupSpec
from app.packing import Bin, Demand
from app.preemption import (
    IN_FLIGHT_SECONDS,
    Candidate,
    PreemptionsInFlight,
    Preemptor,
    VictimPolicy,
    choose_for_gang,
    gang_room,
    preemption_gap,
    select_victims,
)
from app.state import ClusterState
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
    one = Candidate("n1", [uid("low-0")], 0)
    two = Candidate("n1", [uid("low-0"), uid("low-1")], 0)
    plain = Candidate("n2", [uid("plain")], 1)
    selection = select_victims(HIGH, [one, plain], state, VictimPolicy.PROTECT)
    assert selection.candidates == [one, plain]  # order and PDB count kept
    selection = select_victims(HIGH, [two], state, VictimPolicy.PROTECT)
    assert selection.candidates == []
    assert "below its minMember 3" in selection.dropped["n1"]


def test_whole_gang_extends_victims_to_the_members_on_the_same_node() -> None:
    state = cluster()
    selection = select_victims(
        HIGH, [Candidate("n1", [uid("low-0")], 0)], state, VictimPolicy.WHOLE_GANG
    )
    assert selection.candidates == [Candidate("n1", [uid("low-0"), uid("low-1")], 0)]
    assert selection.gangs_hit == {"default/low"}


def test_whole_gang_refuses_when_a_member_outranks_the_preemptor() -> None:
    state = cluster()
    important = pod("low-3", group="low", node="n3", cpu="1")
    important["spec"]["priority"] = 2000
    state.apply_pod(important)
    selection = select_victims(
        HIGH, [Candidate("n1", [uid("low-0")], 0)], state, VictimPolicy.WHOLE_GANG
    )
    assert selection.candidates == []
    assert "default/low-3" in selection.dropped["n1"]


def test_never_evict_a_member_of_the_preemptors_own_gang() -> None:
    state = cluster()
    own = Preemptor("default/low-9", "uid-9", 1000, "default/low")
    selection = select_victims(
        own, [Candidate("n2", [uid("plain"), uid("low-2")], 0)], state, VictimPolicy.PROTECT
    )
    assert selection.candidates == []
    assert "own gang" in selection.dropped["n2"]


def test_unknown_victims_are_treated_as_plain_pods() -> None:
    state = cluster()
    candidate = Candidate("n3", ["not-in-cache"], 0)
    assert select_victims(HIGH, [candidate], state, VictimPolicy.PROTECT).candidates == [candidate]


def test_gap_refuses_a_gang_that_cannot_fit_even_after_evicting_everything_lower() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2"), node("n3")])  # 12 CPUs
    high = pod("keep", node="n1", cpu="3")
    high["spec"]["priority"] = 5000
    state.apply_pod(high)  # not evictable by priority 1000
    spec = GroupSpec("default/big", 4)
    preemptor = Preemptor("default/big-0", "u0", 1000, "default/big")
    need = [{"cpu": 3000, "pods": 1000}] * 4
    assert preemption_gap(spec, preemptor, need, state) == {"cpu": 3000}
    small = [{"cpu": 2000, "pods": 1000}] * 4
    assert preemption_gap(spec, preemptor, small, state) == {}


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


# ---- members of one gang preempting one after the other ------------------------------

URGENT = Preemptor("default/u-0", "uid-default-u-0", 1000, "default/urgent")
TWO_CPU = Demand("default/u-0", {"cpu": 2000, "pods": 1000})


def urgent_gang(state: ClusterState, members: int) -> None:
    state.apply_podgroup(podgroup("urgent", members))
    for i in range(members):
        member = pod(f"u-{i}", group="urgent", cpu="2", memory="0")
        member["spec"]["priority"] = 1000
        state.apply_pod(member)


def free_cpu(room_bins: Sequence[Bin], name: str) -> int:
    return int(next(b.free["cpu"] for b in room_bins if b.name == name))


def test_room_counts_leaving_pods_as_free_and_nominated_pods_as_taken() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])
    state.apply_pod(pod("going", node="n1", cpu="3", deleting=True))
    state.apply_pod(pod("victim", node="n2", cpu="3"))
    urgent_gang(state, 2)
    nominated = pod("other", cpu="1")
    nominated["spec"]["priority"] = 5000
    nominated["status"]["nominatedNodeName"] = "n1"
    state.apply_pod(nominated)
    lower = pod("lower", cpu="1")
    lower["status"]["nominatedNodeName"] = "n1"  # priority 0: kube-scheduler ignores it for us
    state.apply_pod(lower)
    in_flight = PreemptionsInFlight()
    in_flight.record("uid-default-u-1", "n2", {"cpu": 2000}, ["uid-default-victim"])
    room = gang_room(state, in_flight.active(state), URGENT, TWO_CPU, "default/urgent")
    assert free_cpu(room.bins, "n1") == 4000 - 1000  # "going" is leaving, "other" is promised
    assert free_cpu(room.bins, "n2") == 4000 - 2000  # the victim leaves, u-1 is promised it
    assert room.leaving == {"uid-default-going", "uid-default-victim"}
    assert [d.key for d in room.waiting] == ["default/u-0"]  # u-1 is promised n2
    assert room.fits


def test_room_does_not_fit_when_a_sibling_without_a_promise_is_left_over() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1")])
    state.apply_pod(pod("victim", node="n1", cpu="3"))
    urgent_gang(state, 3)
    in_flight = PreemptionsInFlight()
    in_flight.record("uid-default-u-2", "n1", {"cpu": 2000}, ["uid-default-victim"])
    room = gang_room(state, in_flight.active(state), URGENT, TWO_CPU, "default/urgent")
    assert [d.key for d in room.waiting] == ["default/u-0", "default/u-1"]
    assert not room.fits  # 2 CPUs left on n1, two members of 2 waiting


def test_in_flight_ends_when_the_member_lands_or_after_its_time() -> None:
    now = [0.0]
    state = ClusterState()
    state.replace_nodes([node("n1")])
    urgent_gang(state, 2)
    in_flight = PreemptionsInFlight(clock=lambda: now[0])
    in_flight.record("uid-default-u-0", "n1", {"cpu": 2000}, [])
    in_flight.record("uid-default-u-1", "n1", {"cpu": 2000}, [])
    in_flight.record("uid-unknown", "n1", {"cpu": 2000}, [])  # not in our cache (yet)
    assert len(in_flight.active(state)) == 3
    state.apply_pod({**pod("u-0", group="urgent", cpu="2", node="n1")})
    assert {e.preemptor_uid for e in in_flight.active(state)} == {
        "uid-default-u-1",
        "uid-unknown",
    }
    now[0] = IN_FLIGHT_SECONDS + 1
    assert in_flight.active(state) == []


def test_choice_puts_pdb_and_victim_priority_first_then_room_for_most_members() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2"), node("n3")])
    state.apply_pod(pod("small", node="n1", cpu="2"))  # frees room for one member
    state.apply_pod(pod("big", node="n2", cpu="4"))  # frees room for two
    important = pod("important", node="n3", cpu="4")
    important["spec"]["priority"] = 500
    state.apply_pod(important)
    for n in ("n1", "n2"):
        state.apply_pod(pod(f"fill-{n}", node=n, cpu="2" if n == "n1" else "0"))
    urgent_gang(state, 2)
    room = gang_room(state, [], URGENT, TWO_CPU, "default/urgent")
    one = Candidate("n1", ["uid-default-small"], 0)
    two = Candidate("n2", ["uid-default-big"], 0)
    assert choose_for_gang([one, two], state, room) == two
    assert choose_for_gang([one, Candidate("n2", ["uid-default-big"], 1)], state, room) == one
    higher = Candidate("n3", ["uid-default-important"], 0)
    assert choose_for_gang([higher, one], state, room) == one
