"""PreemptionPlans: one plan per preempting gang, every member answered from it, and its life."""

from __future__ import annotations

import asyncio
from typing import Any

from app.base.metrics import Metrics
from app.core.groups import KUEUE_GROUP_LABEL, KUEUE_TOTAL_COUNT_ANNOTATION
from app.core.observer import NullObserver
from app.core.preemption.victims import VictimCandidate, VictimPolicy
from app.core.state import ClusterState
from app.core.topology.sources import KUEUE_POD_INDEX, KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE
from app.runtime.preemption.plan import REHAND_SECONDS, PlanPhase
from app.runtime.preemption.plans import PlanSettings, PreemptionPlans
from app.runtime.wakeup import SiblingWaker
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock
from tests.unit.preempt_call import preempt_call

RACK = "example.com/rack"
TWO_CPU = {"cpu": 2000, "memory": 1024**3 * 1000, "pods": 1000}


class Told(NullObserver):
    def __init__(self) -> None:
        self.planned: list[str] = []
        self.ended: list[str] = []
        self.refused: list[str] = []

    def preemption_planned(self, group_key: str, message: str) -> None:
        self.planned.append(message)

    def preemption_ended(self, group_key: str, message: str) -> None:
        self.ended.append(message)

    def preemption_refused(self, group_key: str, message: str) -> None:
        self.refused.append(message)


class Touches:
    def __init__(self) -> None:
        self.pods: list[str] = []

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        self.pods.append(name)

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        raise AssertionError("no member is held in these tests")


def with_priority(raw: dict[str, Any], priority: int) -> dict[str, Any]:
    raw["spec"]["priority"] = priority
    return raw


class World:
    """3 nodes x 4 CPUs, each full: a 3-CPU and a 1-CPU pod of priority 0."""

    def __init__(self, policy: VictimPolicy = VictimPolicy.PROTECT) -> None:
        self.state = ClusterState()
        self.state.replace_nodes([node(n) for n in ("n1", "n2", "n3")])
        for n in ("n1", "n2", "n3"):
            self.state.apply_pod(pod(f"big-{n}", node=n, cpu="3"))
            self.state.apply_pod(pod(f"small-{n}", node=n, cpu="1"))
        self.clock = Clock()
        self.told = Told()
        self.metrics = Metrics()
        self.plans = PreemptionPlans(
            self.state,
            policy,
            self.metrics,
            observer=self.told,
            settings=PlanSettings(clock=self.clock, plan_seconds=60),
        )
        self.state.add_pod_listener(self.plans.on_pod_change)
        self.state.add_placement_listener(self.plans.on_pod_placed)
        self.state.add_node_listener(self.plans.on_nodes_changed)

    def gang(self, name: str, members: int, cpu: str = "2", priority: int = 1000) -> None:
        self.state.apply_podgroup(podgroup(name, members))
        for i in range(members):
            self.state.apply_pod(with_priority(pod(f"{name}-{i}", group=name, cpu=cpu), priority))

    def ask(self, group: str, i: int) -> list[VictimCandidate]:
        return preempt_call(self.state, self.plans, f"default/{group}-{i}").candidates

    def victims(self, answers: list[list[VictimCandidate]]) -> list[str]:
        return [uid for a in answers for c in a for uid in c.victim_uids]

    def victims_leave(self, answers: list[list[VictimCandidate]]) -> None:
        for uid in self.victims(answers):
            victim = self.state.pod_by_uid(uid)
            assert victim is not None
            self.state.delete_pod(victim.namespace, victim.name)


def test_one_plan_for_the_gang_and_no_new_victims_while_it_lives() -> None:
    w = World()
    w.gang("u", 3)
    answers = [w.ask("u", i) for i in (2, 0, 1)]
    victims = w.victims(answers)
    # Three members of 2 CPUs on three full nodes: one node emptied (2 evictions)
    # takes two members, a 3-CPU pod elsewhere makes room for the third.
    assert len(victims) == 3, answers
    assert len(w.told.planned) == 1 and "3 eviction(s) for 3 member(s)" in w.told.planned[0]
    nodes = {c.node for a in answers for c in a}
    assert {w.state.pod_by_uid(v).placed_node for v in victims} <= nodes  # type: ignore[union-attr]
    # Asking again names only victims of the plan, never new ones.
    for i in range(3):
        assert set(w.victims([w.ask("u", i)])) <= set(victims)
    assert all(w.plans.is_victim(v) and w.plans.beneficiary(v) == "default/u" for v in victims)
    assert w.plans.snapshot()[0]["phase"] == PlanPhase.EVICTING


def test_the_plan_is_done_once_the_gang_holds_its_nodes() -> None:
    w = World()
    w.gang("u", 2)
    answers = [w.ask("u", i) for i in range(2)]
    w.victims_leave(answers)
    assert w.plans.snapshot()[0]["phase"] == PlanPhase.PLACING
    for i, c in enumerate(c for a in answers for c in a):
        w.state.reserve(f"default/u-{i}", c.node)
    w.state.apply_pod(with_priority(pod("u-0", group="u", cpu="2", node="n1"), 1000))
    w.state.apply_pod(with_priority(pod("u-1", group="u", cpu="2", node="n1"), 1000))
    assert w.plans.snapshot() == []
    assert w.told.ended == []  # done is no news


def test_an_expired_plan_is_made_again_on_the_next_call() -> None:
    w = World()
    w.gang("u", 2)
    first = w.victims([w.ask("u", 0)])
    w.clock.now += 61
    again = w.ask("u", 1)
    assert "did not leave within 60s" in w.told.ended[0]
    assert len(w.told.planned) == 2
    # The victims of the first plan are still there, so the new plan may name them again.
    assert set(w.victims([again])) <= set(first) | {
        p.uid for p in w.state.pods.values() if p.placed_node
    }


def test_a_plan_whose_node_goes_away_is_cancelled() -> None:
    w = World()
    w.gang("u", 1)
    (candidate,) = w.ask("u", 0)
    w.state.delete_node(candidate.node)
    assert w.plans.snapshot() == []
    assert "gone or cordoned" in w.told.ended[0]


def test_a_pod_placed_in_the_planned_room_ends_the_plan_and_the_next_try_evicts_it() -> None:
    """kube-scheduler may place a lower-priority pod in a plan's room before it sees the
    members' nominations (the soak, issue 49: a slow API server, the members held in line):
    the plan ends at once, not at its deadline 60 s later, and the next try plans again."""
    w = World()
    w.gang("u", 1)
    answers = [w.ask("u", 0)]
    (candidate,) = answers[0]
    w.victims_leave(answers)  # a 3-CPU pod: 3 CPUs free beside the 1-CPU pod staying
    w.state.apply_pod(pod("beside", node=candidate.node, cpu="1"))
    assert w.plans.snapshot()[0]["phase"] == PlanPhase.PLACING  # 2 CPUs left: the slot fits
    w.state.apply_pod(pod("thief", node=candidate.node, cpu="1"))
    assert w.plans.plans == {}  # at its landing, not at the next question
    assert f"pods placed on {candidate.node} since took the room" in w.told.ended[0]
    again = w.victims([w.ask("u", 0)])
    assert len(w.told.planned) == 2 and again, w.told.planned


def test_a_higher_priority_gang_cancels_a_lower_plan_on_the_same_nodes() -> None:
    w = World()
    w.state.replace_nodes([node("n1")])
    w.gang("low", 1, cpu="3", priority=500)
    assert w.victims([w.ask("low", 0)]) == ["uid-default-big-n1"]
    w.gang("top", 1, cpu="4", priority=2000)
    assert sorted(w.victims([w.ask("top", 0)])) == ["uid-default-small-n1"]
    assert "higher-priority gang default/top" in w.told.ended[0]


def test_a_gang_that_cannot_fit_is_refused_once_per_reason() -> None:
    w = World()
    w.gang("huge", 4, cpu="4")
    keep = with_priority(pod("keep", node="n1", cpu="0"), 5000)
    w.state.apply_pod(keep)
    w.state.apply_pod(with_priority(pod("big-n1", node="n1", cpu="3"), 5000))
    assert w.ask("huge", 0) == []
    assert w.ask("huge", 1) == []
    assert len(w.told.refused) == 1 and "cannot preempt" in w.told.refused[0]


def test_protect_never_takes_a_running_gang_below_min_member() -> None:
    w = World()
    w.state.replace_nodes([node("a"), node("b")])
    for name in list(w.state.pods):
        w.state.delete_pod("default", name.split("/")[1])
    w.state.apply_podgroup(podgroup("run", 2))
    for i, at in enumerate(["a", "b", "b"]):
        w.state.apply_pod(pod(f"run-{i}", group="run", node=at, cpu="2"))
    w.state.apply_pod(pod("plain", node="a", cpu="2"))
    # One member of 4 CPUs: node a (run-0 and plain) keeps the gang at minMember 2;
    # node b would take two of its members.
    w.gang("one", 1, cpu="4")
    assert sorted(w.victims([w.ask("one", 0)])) == ["uid-default-plain", "uid-default-run-0"]
    # Two such members would need both nodes: no plan, and the users are told why.
    w.gang("two", 2, cpu="4", priority=1000)
    assert w.victims([w.ask("two", 0), w.ask("two", 1)]) == []
    assert "cannot preempt" in w.told.refused[-1]


async def test_deleting_an_unbound_preemption_victim_wakes_the_nominated_preemptor() -> None:
    """kube-scheduler does not retry a preemptor when a victim it only held goes."""
    touches = Touches()
    state = ClusterState()
    state.replace_nodes([node("n0")])
    waker = SiblingWaker(state, touches, cooldown_seconds=0)
    plans = PreemptionPlans(state, VictimPolicy.PROTECT, Metrics(), waker=waker)
    state.add_pod_listener(plans.on_pod_change)
    preemptor = pod("urgent", cpu="1")
    preemptor["status"]["nominatedNodeName"] = "n0"
    state.apply_pod(preemptor)
    victim = pod("victim", group="a", cpu="1")
    victim["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ]
    state.apply_pod(victim)
    state.delete_pod("default", "victim")
    await asyncio.sleep(0)
    await waker.drain()
    assert touches.pods == ["urgent"]


def racked_state(racks: dict[str, str], pods: dict[str, list[str]]) -> ClusterState:
    """Nodes (node -> rack) of 4 CPUs with low-priority pods (node -> their CPUs) bound."""
    state = ClusterState()
    raws = [node(n) for n in racks]
    for raw in raws:
        raw["metadata"]["labels"][RACK] = racks[raw["metadata"]["name"]]
    state.replace_nodes(raws)
    for n, cpus in pods.items():
        for i, cores in enumerate(cpus):
            state.apply_pod(pod(f"low-{n}-{i}", node=n, cpu=cores))
    return state


def slice_gang(state: ClusterState) -> None:
    """A high-priority Kueue gang of 4 x 2 CPUs in slices of 2 by rack, no rack of its own."""
    for i in range(4):
        raw = with_priority(pod(f"train-{i}", cpu="2"), 1000)
        raw["metadata"]["labels"] |= {KUEUE_GROUP_LABEL: "train", KUEUE_POD_INDEX: str(i)}
        raw["metadata"]["annotations"] = {
            KUEUE_TOTAL_COUNT_ANNOTATION: "4",
            KUEUE_SLICE_REQUIRED: RACK,
            KUEUE_SLICE_SIZE: "2",
        }
        state.apply_pod(raw)


def ask(state: ClusterState, plans: PreemptionPlans, i: int) -> list[VictimCandidate]:
    """Member train-`i` asks to preempt, every node offered: the candidates it is answered."""
    return preempt_call(state, plans, f"default/train-{i}").candidates


def test_a_gang_of_slices_plans_each_slice_in_one_rack_and_its_members_take_their_own() -> None:
    """Racks r0 (n1 empty, n2 full) and r1 (n3, n4 full); a Kueue gang of 4 x 2 CPUs in
    slices of 2 by rack. A flat plan would put 2 members on n1 and the other slice on n2
    and n3, over two racks; the tree's plan keeps each slice in one rack, and a member
    is answered only with a slot of its own slice."""
    rack_of = {"n1": "r0", "n2": "r0", "n3": "r1", "n4": "r1"}
    state = racked_state(rack_of, {n: ["3", "1"] for n in ("n2", "n3", "n4")})
    told = Told()
    plans = PreemptionPlans(
        state, VictimPolicy.PROTECT, Metrics(), observer=told, settings=PlanSettings(clock=Clock())
    )
    state.add_pod_listener(plans.on_pod_change)
    slice_gang(state)
    ask(state, plans, 2)  # a member of the slice that must evict asks first
    (made,) = plans.plans.values()
    assert made.evictions == 2, told.planned
    for path in {("rack-0",), ("rack-1",)}:
        racks = {rack_of[s.node] for s in made.slots if s.path == path}
        assert len(racks) == 1, (path, made.slots)
        assert made.groups[path].value in racks
    assert "sub-groups: rack-0 in rack" in told.planned[0]
    for i in range(4):
        answer = ask(state, plans, i)
        planned = made.groups[made.paths[f"default/train-{i}"]].value
        mine = [s for s in made.slots if s.member == state.pods[f"default/train-{i}"].uid]
        assert len(mine) == 1 and rack_of[mine[0].node] == planned
        assert all(rack_of[c.node] == planned for c in answer)


def test_a_gang_of_slices_with_no_rack_of_its_own_evicts_the_fewest_only_in_its_racks() -> None:
    """Three racks of 4-CPU nodes: r0's two nodes each hold one 4-CPU pod, r1's node one
    4-CPU pod and r2's node four 1-CPU pods. Each slice of 2 x 2 CPUs takes one node: one
    eviction in r0 or r1, four in r2. The plan (the preempt verb's, through the plan
    maker) evicts two pods, only in the racks its slices take, never in r2."""
    rack_of = {"n1": "r0", "n2": "r0", "n3": "r1", "n4": "r2"}
    state = racked_state(rack_of, {"n1": ["4"], "n2": ["4"], "n3": ["4"], "n4": ["1"] * 4})
    plans = PreemptionPlans(
        state, VictimPolicy.PROTECT, Metrics(), settings=PlanSettings(clock=Clock())
    )
    state.add_pod_listener(plans.on_pod_change)
    slice_gang(state)
    ask(state, plans, 0)
    (made,) = plans.plans.values()
    taken = {domain.value for domain in made.groups.values()}
    assert made.evictions == 2, made.victims
    assert {rack_of[node] for _, node in made.victims.values()} <= taken
    assert "r2" not in taken


def test_the_plan_ends_as_its_gang_is_placed_not_at_the_next_question() -> None:
    """The gate reserves members and binds them in place: the watch's echo of a binding
    changes nothing the plans hear of. The plan must end as the last member is placed;
    left live, a gang gone right after (its Job deleted, its PodGroup lingering) keeps
    its slots as a promise for a minute, and the next gang is refused room that is free
    (test_preemption.py's planned-room test, after the test before it, under CI load)."""
    w = World()
    w.gang("u", 2)
    answers = [w.ask("u", i) for i in range(2)]
    w.victims_leave(answers)
    nodes = {s.planned: s.node for s in w.plans.plans["default/u"].slots}
    for key, node_name in nodes.items():
        w.state.reserve(key, node_name)
    assert w.plans.plans == {}
    for key, node_name in nodes.items():
        w.state.assume_bound(key, node_name)
    for i in range(2):
        w.state.delete_pod("default", f"u-{i}")
    # Where u's victims were, 2 CPUs each are free: v of the same priority needs no eviction.
    w.gang("v", 2)
    assert [w.ask("v", i) for i in range(2)] == [[], []]
    assert w.told.refused == []


def test_a_plan_whose_members_all_left_is_cancelled() -> None:
    """Every member gone (a Job deleted before its gang was placed; its PodGroup lingers
    until the namespace goes): nothing may keep room for a gang that has no pod."""
    w = World()
    w.gang("u", 2)
    assert w.victims([w.ask("u", i) for i in range(2)])
    for i in range(2):
        w.state.delete_pod("default", f"u-{i}")
    assert w.plans.plans == {}
    assert w.told.ended == ["preemption plan cancelled: its members are gone"]


def test_a_victim_our_evictor_was_handed_lately_is_not_handed_to_kube_scheduler() -> None:
    """The unasked path hands a member's victims to the extender's own evictor; when
    kube-scheduler then asks for that member while the delete call is under way, handing
    them to it too lets its asynchronous preemption find them gone and never retry the
    member (the every-verb test_preemption_lag, once, behind a slow API server)."""
    w = World()
    w.gang("u", 1, cpu="3")
    ours = w.victims([preempt_call(w.state, w.plans, "default/u-0", ours=True).candidates])
    assert len(ours) == 1
    assert w.ask("u", 0) == []  # our evictor is deleting it
    w.clock.now += REHAND_SECONDS + 1  # still on its node: that deletion failed
    assert w.victims([w.ask("u", 0)]) == ours


def test_a_victim_handed_to_kube_scheduler_is_handed_again_on_its_next_call() -> None:
    """kube-scheduler does not preempt twice while a victim it chose leaves: its own
    delete call failing, it asks again, and gets the victim again."""
    w = World()
    w.gang("u", 1, cpu="3")
    first = w.victims([w.ask("u", 0)])
    assert len(first) == 1
    assert w.victims([w.ask("u", 0)]) == first
