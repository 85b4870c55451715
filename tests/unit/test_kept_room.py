"""A pod in no gang is kept off the room a gang's preemption freed, through the filter verb.

kube-scheduler keeps a planned member's room only while it remembers the
member's nomination, and clears one when its own dry run finds no victim
(they are leaving already). The filter keeps it instead: the real
extender, arbiter, gate and plans over an in-memory ClusterState.
"""

from __future__ import annotations

from typing import Any

from app.core.preemption.victims import VictimCandidate
from app.core.state import ClusterState
from app.core.topology.domains import DEFAULT_LEVELS
from app.web.wire import ExtenderArgs, PreemptArgs
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import ExtenderOnState
from tests.unit.preempt_call import preempt_call

NODES = ("n1", "n2", "n3")


def with_priority(raw: dict[str, Any], priority: int) -> dict[str, Any]:
    raw["spec"]["priority"] = priority
    return raw


class World:
    """3 nodes x 4 CPUs: n1 and n2 full with a 4-CPU pod of priority 0, n3 empty;
    a gang of 2 x 4 CPUs at priority 1000, one of whose members fits n3 alone."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.state.replace_nodes([node(n) for n in NODES])
        for n in ("n1", "n2"):
            self.state.apply_pod(pod(f"low-{n}", node=n, cpu="4", phase="Running"))
        self.extender = ExtenderOnState(self.state, DEFAULT_LEVELS, every_gang=True).extender
        self.plans = self.extender.plans
        self.state.add_pod_listener(self.plans.on_pod_change)
        self.state.add_placement_listener(self.plans.on_pod_placed)
        self.state.apply_podgroup(podgroup("urgent", 3))
        for i in range(3):
            member = pod(f"urgent-{i}", group="urgent", cpu="4")
            self.state.apply_pod(with_priority(member, 1000))

    def preempt(self) -> set[str]:
        """Every member's preempt call; the victims' nodes, their victims deleted."""
        nodes: set[str] = set()
        for i in range(3):
            for candidate in preempt_call(self.state, self.plans, f"default/urgent-{i}").candidates:
                nodes.add(candidate.node)
                for uid in candidate.victim_uids:
                    victim = self.state.pod_by_uid(uid)
                    assert victim is not None
                    self.state.delete_pod(victim.namespace, victim.name)
        return nodes

    def filter(self, name: str, priority: int, cpu: str = "2") -> dict[str, Any]:
        raw = with_priority(pod(name, cpu=cpu), priority)
        return self.extender.filter(ExtenderArgs(raw, list(NODES), None))


def test_a_lower_priority_pod_is_kept_off_the_room_freed_for_a_gang() -> None:
    world = World()
    assert world.preempt() == {"n1", "n2"}
    # The victims are gone and kube-scheduler may have forgotten the nominations:
    # n1 and n2 look free, and n3's 4 CPUs are planned for the third member.
    result = world.filter("thief", 0)
    assert result["NodeNames"] == []
    kept = result["FailedAndUnresolvableNodes"]
    assert sorted(kept) == list(NODES)
    assert "kept for gang default/urgent" in kept["n1"] and "priority 0" not in kept["n1"]
    assert "this pod's 0" in kept["n1"]
    assert result["FailedNodes"] == {}


def test_a_pod_that_fits_beside_the_planned_slots_passes() -> None:
    world = World()
    world.state.replace_nodes([node(n, cpu="10") if n == "n3" else node(n) for n in NODES])
    assert world.preempt() == {"n1"}
    result = world.filter("thief", 0)
    # n3 has 10 CPUs: two members' 8 are kept, the thief's 2 fit beside them. n2 is
    # no plan's: kube-scheduler's own fit check finds it full, not the extender.
    assert result["NodeNames"] == ["n2", "n3"]
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["n1"]


def test_a_pod_of_higher_priority_than_the_gang_is_not_held_back() -> None:
    world = World()
    world.preempt()
    result = world.filter("urgent-plain", 2000)
    assert result["NodeNames"] == list(NODES)
    assert result["FailedAndUnresolvableNodes"] == {}


def test_the_room_is_given_back_once_the_gang_is_placed() -> None:
    world = World()
    world.preempt()
    for i, n in enumerate(NODES):
        world.state.reserve(f"default/urgent-{i}", n)
    assert world.plans.plans == {}  # the plan is done
    # The gang holds all three nodes now: nothing is kept, kube-scheduler's own fit
    # check (not the extender's) says there is no room.
    result = world.filter("thief", 0)
    assert result["NodeNames"] == list(NODES)


def test_without_a_plan_a_pod_in_no_gang_passes_every_node() -> None:
    world = World()
    result = world.filter("thief", 0)
    assert result["NodeNames"] == list(NODES)
    assert result["FailedAndUnresolvableNodes"] == {}


def test_while_a_victim_leaves_its_room_is_not_yet_free_for_anyone() -> None:
    """n1 of 10 CPUs runs an 8-CPU victim: the gang's two members take 8 of them, and a
    2-CPU pod fits beside them once the victim is gone, not while it is leaving (as
    kube-scheduler counts it, with the members' nominations)."""
    state = ClusterState()
    state.replace_nodes([node("n1", cpu="10"), node("n2"), node("n3")])
    state.apply_pod(pod("low-n1", node="n1", cpu="8", phase="Running"))
    for n in ("n2", "n3"):
        state.apply_pod(with_priority(pod(f"top-{n}", node=n, cpu="4", phase="Running"), 5000))
    extender = ExtenderOnState(state, DEFAULT_LEVELS, every_gang=True).extender
    state.add_pod_listener(extender.plans.on_pod_change)
    state.apply_podgroup(podgroup("urgent", 2))
    for i in range(2):
        state.apply_pod(with_priority(pod(f"urgent-{i}", group="urgent", cpu="4"), 1000))
    victims = {
        uid
        for i in range(2)
        for c in preempt_call(state, extender.plans, f"default/urgent-{i}").candidates
        for uid in c.victim_uids
    }
    assert victims == {"uid-default-low-n1"}
    thief = with_priority(pod("thief", cpu="2"), 0)
    state.apply_pod(pod("low-n1", node="n1", cpu="8", phase="Running", deleting=True))
    leaving = extender.filter(ExtenderArgs(thief, list(NODES), None))
    assert sorted(leaving["FailedAndUnresolvableNodes"]) == ["n1"]
    state.delete_pod("default", "low-n1")
    gone = extender.filter(ExtenderArgs(thief, list(NODES), None))
    assert gone["NodeNames"] == list(NODES)


class Planned:
    """n1 of 8 CPUs runs low-a and low-b (4 CPUs each, priority 0), n2 and n3 are full
    with pods of priority 5000: gang urgent (one member of 4 CPUs, priority 1000) plans
    to evict one of them on n1. Its victim is handed, still on the node."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.state.replace_nodes([node("n1", cpu="8"), node("n2"), node("n3")])
        for name in ("low-a", "low-b"):
            self.state.apply_pod(pod(name, node="n1", cpu="4", phase="Running"))
        for n in ("n2", "n3"):
            top = pod(f"top-{n}", node=n, cpu="4", phase="Running")
            self.state.apply_pod(with_priority(top, 5000))
        self.extender = ExtenderOnState(self.state, DEFAULT_LEVELS, every_gang=True).extender
        self.state.add_pod_listener(self.extender.plans.on_pod_change)
        self.state.apply_podgroup(podgroup("urgent", 1))
        self.state.apply_pod(with_priority(pod("urgent-0", group="urgent", cpu="4"), 1000))
        answer = preempt_call(self.state, self.extender.plans, "default/urgent-0")
        (self.planned,) = [uid for c in answer.candidates for uid in c.victim_uids]
        (self.other,) = {"uid-default-low-a", "uid-default-low-b"} - {self.planned}

    def preempt(self, priority: int, cpu: str, victims: list[str]) -> dict[str, list[str]]:
        """A plain pod's preempt call with kube-scheduler's candidate n1: what we answer."""
        raw = with_priority(pod("plain", cpu=cpu), priority)
        result = self.extender.preempt(PreemptArgs(raw, [VictimCandidate("n1", victims, 0)]))
        return {
            n: [p["UID"] for p in v["Pods"]] for n, v in result["NodeNameToMetaVictims"].items()
        }


def test_a_victim_a_gangs_plan_evicts_is_not_named_again_for_a_plain_preemptor() -> None:
    """kube-scheduler (its view a little behind ours) offers both pods on n1 to a pod of
    higher priority than the gang: the one the plan is evicting is left out, so that its
    departure, not kube-scheduler's own delete call, retries the preemptor."""
    world = Planned()
    both = [world.planned, world.other]
    assert world.preempt(2000, "8", both) == {"n1": [world.other]}
    # Every victim going already: nothing to evict, the preemptor waits for them.
    assert world.preempt(2000, "4", [world.planned]) == {}


def test_a_victim_being_deleted_is_not_named_again() -> None:
    world = Planned()
    world.state.apply_pod(pod("low-x", node="n2", cpu="4", phase="Running", deleting=True))
    low_x = "uid-default-low-x"
    raw = with_priority(pod("plain", cpu="4"), 2000)
    result = world.extender.preempt(PreemptArgs(raw, [VictimCandidate("n2", [low_x], 0)]))
    assert result["NodeNameToMetaVictims"] == {}


def test_a_plain_preemptor_is_refused_the_room_a_gang_of_its_priority_planned() -> None:
    """At the gang's priority, a pod may evict on n1 only what leaves it room beside the
    planned member: 4 CPUs once both pods are gone, not 6."""
    world = Planned()
    assert world.preempt(1000, "4", [world.other]) == {"n1": [world.other]}
    assert world.preempt(1000, "6", [world.other]) == {}
    # Above the gang's priority the planned room is not kept from it.
    assert world.preempt(2000, "6", [world.other]) == {"n1": [world.other]}


class Nominations:
    """Records the nomination writes (the real ones are app/kube/pods.py)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.writes.append((name, node))


async def test_a_preemptor_refused_for_a_plans_room_is_requeued_when_the_plan_ends() -> None:
    """kube-scheduler parks it, and the plan's end is no event it retries it on: the
    extender sets and removes a nomination on it, which kube-scheduler takes as room
    given back (tests/cluster/test_parked_preemptor.py shows that half)."""
    world = Planned()
    api = Nominations()
    world.extender.plans.nominate_through(api)
    world.state.apply_pod(with_priority(pod("plain", cpu="6"), 1000))
    assert world.preempt(1000, "6", [world.other]) == {}  # refused: the plan keeps n1
    world.state.delete_pod("default", "urgent-0")  # the plan ends: its member is gone
    await world.extender.plans.stop()
    assert ("plain", "n1") in api.writes and api.writes[-1] == ("plain", "")
    # Told once: the next plan's end does not requeue it again.
    count = len(api.writes)
    world.extender.plans.on_nodes_changed()
    await world.extender.plans.stop()
    assert len([w for w in api.writes[count:] if w[0] == "plain"]) == 0
