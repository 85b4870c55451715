"""Preemption kube-scheduler never starts for a gang (app/runtime/preemption/unasked.py).

Gangs short of DRA devices, and gangs whose members each fit alone while the
whole gang needs evictions: kube-scheduler starts no preemption for them; the
extender asks the gang's plan of the one owner of preemption and deletes the
victims it names.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission
from app.core.groups import SOURCE_NATIVE
from app.core.observer import NullObserver
from app.core.packing import Packing
from app.core.preemption.victims import VictimPolicy
from app.core.state import ClusterState
from app.runtime.device_cel import CelEngine
from app.runtime.preemption import plan as plan_module
from app.runtime.preemption import unasked as unasked_preemption
from app.runtime.preemption.plan import Answer
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.preemption.refusals import REFUSED_SECONDS, Refusals
from app.runtime.preemption.unasked import DRA_UNSCHEDULABLE, NO_DOMAIN_ROOM, UnaskedPreemption
from tests.unit.builders import node, pod, podgroup
from tests.unit.preempt_call import preempt_call
from tests.unit.test_devices import (
    CLASSES,
    SLICES,
    TEMPLATES,
    device_class,
    gpu_pod,
    requests_of,
    resource_slice,
    template,
)


class Deleted:
    def __init__(self) -> None:
        self.pods: list[str] = []

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.pods.append(f"{namespace}/{name}")


def held(name: str, at: str, kind: str) -> Any:
    raw = gpu_pod(name, template_name=kind, node=at, phase="Running")
    raw["spec"]["priority"] = 100
    return raw


def waiting(name: str, message: str = f"0/4 nodes are available: 2 {DRA_UNSCHEDULABLE}.") -> Any:
    raw = gpu_pod(name, template_name="two", group="urgent")
    raw["spec"]["priority"] = 1000
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return raw


def unasked_over(state: ClusterState) -> tuple[UnaskedPreemption, Deleted, PreemptionPlans]:
    """The extender's own preemption over `state` (protect policy), recording deletions."""
    plans = PreemptionPlans(state, VictimPolicy.PROTECT, Metrics())
    deleted = Deleted()
    preemption = UnaskedPreemption(
        state, Admission(3), plans, deleted, NullObserver(), VictimPolicy.PROTECT
    )
    state.add_pod_listener(preemption.on_pod_change)
    return preemption, deleted, plans


def cluster() -> tuple[ClusterState, UnaskedPreemption, Deleted]:
    """n1's 4 devices held by 2 pods (2 each), n2's by 4 (1 each), all priority 100."""
    state = ClusterState(CelEngine())
    for name in ("n1", "n2"):
        state.apply_node(node(name))
    state.devices.apply(CLASSES, device_class())
    for name in ("n1", "n2"):
        state.devices.apply(SLICES, resource_slice(f"{name}-gpus", name))
    state.devices.apply(TEMPLATES, template("one", requests_of(1)))
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    for i in range(2):
        state.apply_pod(held(f"pair-{i}", "n1", "two"))
    for i in range(4):
        state.apply_pod(held(f"single-{i}", "n2", "one"))
    state.apply_podgroup(podgroup("urgent", 2))
    metrics = Metrics()
    plans = PreemptionPlans(state, VictimPolicy.PROTECT, metrics)
    deleted = Deleted()
    preemption = UnaskedPreemption(
        state, Admission(3), plans, deleted, NullObserver(), VictimPolicy.PROTECT
    )
    state.add_pod_listener(preemption.on_pod_change)
    return state, preemption, deleted


def test_a_gang_short_of_devices_evicts_the_fewest_lower_priority_holders(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, deleted = cluster()

    async def run() -> None:
        for i in range(2):
            state.apply_pod(waiting(f"urgent-{i}"))
        await preemption.drain()

    asyncio.run(run())
    assert sorted(deleted.pods) == ["default/pair-0", "default/pair-1"]


def test_nothing_is_evicted_for_a_gang_missing_members_or_waiting_for_something_else(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, deleted = cluster()

    async def run() -> None:
        state.apply_pod(waiting("urgent-0"))  # one of minMember 2
        await preemption.drain()
        state.apply_pod(waiting("urgent-1", "0/4 nodes are available: 4 Insufficient cpu."))
        await preemption.drain()

    asyncio.run(run())
    assert deleted.pods == []
    assert preemption.victims("default/urgent") != []  # once whole, it would preempt


# What kube-scheduler wrote for the soak's stalled gang (issue 49): the filter's
# whole-gang refusal, then its own dry run's verdict.
STALLED = (
    "0/3 nodes are available: 3 gang default/whole needs 5 more member(s) placed at once "
    "(cpu 10, memory 5Gi, pods 5 in all) but only 3 fit in the free capacity; short by cpu "
    "2500m. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


def each_fits_alone(
    *, priority: int = 1000, policy: str | None = None, message: str = STALLED
) -> tuple[list[str], list[str]]:
    """3 nodes of 4 CPUs, a 1500m pod of priority 0 on each; a gang of 5 x 2000m arrives,
    whose members each fit alone: (the pods deleted, the plan's groups)."""
    state = ClusterState()
    for i in range(3):
        state.apply_node(node(f"n{i}"))
        state.apply_pod(pod(f"low-{i}", cpu="1500m", node=f"n{i}", phase="Running"))
    state.apply_podgroup(podgroup("whole", 5))
    preemption, deleted, plans = unasked_over(state)

    async def run() -> None:
        for i in range(5):
            raw = pod(f"whole-{i}", group="whole", cpu="2")
            raw["spec"]["priority"] = priority
            if policy is not None:
                raw["spec"]["preemptionPolicy"] = policy
            raw["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "message": message}
            ]
            state.apply_pod(raw)
        await preemption.drain()

    asyncio.run(run())
    return sorted(deleted.pods), [p["group"] for p in plans.snapshot()]


def test_a_gang_whose_members_each_fit_alone_evicts_exactly_what_the_whole_needs(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    deleted, plans = each_fits_alone()
    assert len(deleted) == 2 and set(deleted) < {f"default/low-{i}" for i in range(3)}
    assert plans == ["default/whole"]


def test_a_gang_whose_preempt_calls_got_no_answer_evicts_what_it_needs(
    monkeypatch: Any,
) -> None:
    """kube-scheduler's preempt calls found the extender down (restarting): it parked the
    members as if nothing could be evicted; the extender, up again, plans for them."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    down = (
        "0/3 nodes are available: 3 Insufficient cpu. preemption: Post "
        '"http://127.0.0.1:19888/scheduler/preempt": dial tcp 127.0.0.1:19888: connect: '
        "connection refused"
    )
    deleted, plans = each_fits_alone(message=down)
    assert len(deleted) == 2 and set(deleted) < {f"default/low-{i}" for i in range(3)}
    assert plans == ["default/whole"]
    assert each_fits_alone(message=down, priority=0) == ([], [])


def test_no_unasked_preemption_for_a_pod_that_may_not_or_when_kube_scheduler_found_room(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    assert each_fits_alone(policy="Never") == ([], [])
    assert each_fits_alone(priority=0) == ([], [])
    # kube-scheduler found a candidate: its own preemption asks the preempt verb.
    found = STALLED.replace("preemption: 0/3 nodes are available", "preemption: found")
    assert each_fits_alone(message=found) == ([], [])


def test_the_words_it_reads_are_the_ones_written() -> None:
    """The trigger reads the filter's refusal: the packing's message must keep its words."""
    assert unasked_preemption.GANG_SHORT in Packing({}, 3).describe("default/g", [])


# What kube-scheduler v1.37.2 wrote (PodScheduled, reason SchedulerError) for a native
# PodGroup with a rack key whose filter left no node in any rack (tests/cluster/
# test_native_preemption.py, its log "Error scheduling pod group").
NO_PLACEMENT = (
    'running NormalizePlacementScore on PlacementScore plugins: plugin "PodGroupPodsCount" '
    "failed with: no pods from pod group are assigned to any of the candidate placements"
)

# What it wrote (reason Unschedulable) for the other members of such a gang once the
# profile enables GangScheduling's PreEnqueue, which brings its PlacementFeasible.
NO_FEASIBLE = (
    "pod group is unschedulable, 0/2 placements are available, first placement status: "
    "minCount (2) cannot be satisfied: 0 scheduled, 1 remaining"
)

# The topology filter's refusal of a gang with a rack key in a single rack (kube-scheduler
# then has one placement, no scorer error; tests/unit/test_topology.py checks the words).
DOMAIN_SHORT = (
    "0/2 nodes are available: 2 gang native:default/whole needs its 2 missing member(s) "
    "(cpu 6, pods 2) in one rack (required by topology key example.com/rack); no rack has "
    "that much free now (nodes without the node label example.com/rack belong to none)"
)


def native_member(name: str, message: str, *, native: bool = True) -> Any:
    """A high-priority member of PodGroup `whole` (native, or scheduler-plugins') asking 3
    CPUs, which kube-scheduler reported with `message`."""
    raw = pod(name, group=None if native else "whole", cpu="3")
    if native:
        raw["spec"]["schedulingGroup"] = {"podGroupName": "whole"}
    raw["spec"]["priority"] = 1000
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": message}
    ]
    return raw


def native_cluster(*, native: bool = True) -> tuple[ClusterState, UnaskedPreemption, Deleted]:
    """3 nodes of 4 CPUs, a 1500m pod of priority 0 on each, and PodGroup `whole` of 2."""
    state = ClusterState()
    for i in range(3):
        state.apply_node(node(f"n{i}"))
        state.apply_pod(pod(f"low-{i}", cpu="1500m", node=f"n{i}", phase="Running"))
    if native:
        spec = {"schedulingPolicy": {"gang": {"minCount": 2}}}
        raw = {"metadata": {"name": "whole", "namespace": "default", "uid": "pg"}, "spec": spec}
        state.apply_podgroup(raw, SOURCE_NATIVE)
    else:
        state.apply_podgroup(podgroup("whole", 2))
    preemption, deleted, _ = unasked_over(state)
    return state, preemption, deleted


@pytest.mark.parametrize(
    ("message", "native", "evicts"),
    [
        (NO_PLACEMENT, True, True),
        (NO_FEASIBLE, True, True),
        # The filter's refusal without a preemption verdict: kube-scheduler's pod-group
        # preemption asks no extender, so none follows for a native gang.
        (STALLED.split(" preemption:", maxsplit=1)[0], True, True),
        (
            f"{DOMAIN_SHORT}; it stays pending, nothing is reserved, and is {NO_DOMAIN_ROOM}",
            True,
            True,
        ),
        # Preemption would not help: a priority kube-scheduler refuses to schedule.
        ("all pods in a single pod group should have the same priority", True, False),
        # Another source's pods go kube-scheduler's per-pod way, whose preemption asks.
        (NO_PLACEMENT, False, False),
        (NO_FEASIBLE, False, False),
    ],
)
def test_a_native_gang_kube_scheduler_left_without_preemption_evicts(
    monkeypatch: Any, message: str, native: bool, evicts: bool
) -> None:
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, deleted = native_cluster(native=native)

    async def run() -> None:
        for i in range(2):
            state.apply_pod(native_member(f"whole-{i}", message, native=native))
        await preemption.drain()

    asyncio.run(run())
    assert len(deleted.pods) == (2 if evicts else 0), deleted.pods


def test_a_member_reported_during_the_retry_window_is_tried_when_it_ends(
    monkeypatch: Any,
) -> None:
    """kube-scheduler writes a message only when it changes: the same scorer error on the
    last member, while its gang's try (one member short) is recent, must not be lost."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    monkeypatch.setattr(unasked_preemption, "RETRY_SECONDS", 0.2)
    state, preemption, deleted = native_cluster()

    async def run() -> None:
        state.apply_pod(native_member("whole-0", NO_PLACEMENT))
        await preemption.drain()  # one of 2: no plan
        assert deleted.pods == []
        state.apply_pod(native_member("whole-1", NO_PLACEMENT))
        await preemption.drain()

    asyncio.run(run())
    assert len(deleted.pods) == 2, deleted.pods


def verb_answers(state: ClusterState, plans: PreemptionPlans, name: str) -> Answer:
    """The preempt verb's call for member `name`, every node offered, and what the verb does
    with an answer that makes no plan (app/web/preempt_verb.py): it is remembered."""
    answer = preempt_call(state, plans, f"default/{name}")
    group = state.pods[f"default/{name}"].group
    if answer.unplanned and group is not None:
        plans.refusals.remember(group.key)
    return answer


def test_a_gang_refused_on_a_lagging_view_is_asked_again_when_that_view_frees_room(
    monkeypatch: Any,
) -> None:
    """The CI stall of issue 49: the preempt verb answered from a view still holding a pod
    already gone (`gone` on n1), refused the gang, and kube-scheduler, which had seen the
    deletion, parked the members with no event left to wake them. When the extender's view
    catches up (the deletion arrives), the refused gang is planned again and the victims its
    plan names are evicted; a second deletion does not ask again without a new refusal.

    Two nodes of 4 CPUs, each with a 2-CPU pod of priority 0 and a 2-CPU pod above the
    gang's priority; a gang of 3 x 2 CPUs. With `gone` in view, evicting both low pods
    leaves room for 2 members: refused. Without it, the same two evictions place all 3."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state = ClusterState()
    for name, high in (("n0", "guard"), ("n1", "gone")):
        state.apply_node(node(name))
        state.apply_pod(pod(f"low-{name}", cpu="2", node=name, phase="Running"))  # priority 0
        above = pod(high, cpu="2", node=name, phase="Running")
        above["spec"]["priority"] = 5000  # above the gang: never a victim
        state.apply_pod(above)
    state.apply_podgroup(podgroup("whole", 3))
    for i in range(3):
        raw = pod(f"whole-{i}", group="whole", cpu="2")
        raw["spec"]["priority"] = 500
        state.apply_pod(raw)
    preemption, deleted, plans = unasked_over(state)

    async def run() -> None:
        refusal = verb_answers(state, plans, "whole-0")
        assert refusal.unplanned and refusal.candidates == [], refusal
        await preemption.drain()
        assert deleted.pods == []
        state.delete_pod("default", "gone")  # the view catches up
        await preemption.drain()
        assert sorted(deleted.pods) == ["default/low-n0", "default/low-n1"]
        assert [p["group"] for p in plans.snapshot()] == ["default/whole"]
        assert plans.refusals.take() == []  # asked once per refusal

    asyncio.run(run())


def test_a_pod_taking_or_leaving_room_on_a_node_moves_room_and_nothing_else_does() -> None:
    placed = state_record(pod("a", node="n0", phase="Running"))
    moves = unasked_preemption.moves_room
    assert moves(placed, None) and moves(None, placed)
    assert moves(placed, state_record(pod("a", node="n0", phase="Failed")))
    assert moves(state_record(pod("a")), placed)  # bound
    assert not moves(placed, placed)
    assert not moves(state_record(pod("a")), None)


def test_a_gang_told_its_room_is_free_on_a_view_missing_pods_is_asked_again_when_they_come(
    monkeypatch: Any,
) -> None:
    """The lag the other way: the verb's view misses two pods kube-scheduler has bound, finds
    the gang's room free and plans nothing ("they wait for it"); kube-scheduler, which saw the
    node full, parks the members. The pods' arrival in view asks again: the low pods go."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state = ClusterState()
    for name in ("n0", "n1"):
        state.apply_node(node(name))
        state.apply_pod(pod(f"low-{name}", cpu="2", node=name, phase="Running"))  # priority 0
    state.apply_podgroup(podgroup("whole", 2))
    for i in range(2):
        raw = pod(f"whole-{i}", group="whole", cpu="2")
        raw["spec"]["priority"] = 500
        state.apply_pod(raw)
    preemption, deleted, plans = unasked_over(state)

    async def run() -> None:
        free = verb_answers(state, plans, "whole-0")
        assert free.unplanned and free.candidates == [] and "without evictions" in free.message
        for name in ("n0", "n1"):
            late = pod(f"late-{name}", cpu="2", node=name, phase="Running")
            late["spec"]["priority"] = 5000
            state.apply_pod(late)  # the view catches up
        await preemption.drain()
        assert sorted(deleted.pods) == ["default/low-n0", "default/low-n1"]

    asyncio.run(run())


def state_record(raw: Any) -> Any:
    state = ClusterState()
    state.apply_pod(raw)
    return next(iter(state.pods.values()))


def test_a_gang_refused_before_its_last_member_was_in_view_is_asked_again_when_it_comes(
    monkeypatch: Any,
) -> None:
    """The preempt verb refuses a gang whose members it does not all see yet (the blocker:
    fewer than minMember); kube-scheduler, which saw them, parks them. The last member's
    arrival in the extender's view asks again, and the plan's victims are evicted."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state = ClusterState()
    for name in ("n0", "n1"):
        state.apply_node(node(name))
        state.apply_pod(pod(f"low-{name}", cpu="4", node=name, phase="Running"))  # priority 0
    state.apply_podgroup(podgroup("whole", 2))
    preemption, deleted, plans = unasked_over(state)

    def member(i: int) -> Any:
        raw = pod(f"whole-{i}", group="whole", cpu="4")
        raw["spec"]["priority"] = 500
        return raw

    async def run() -> None:
        state.apply_pod(member(0))
        plans.refuse("default/whole", "gang default/whole has 1 of its 2 members")  # the verb
        await preemption.drain()
        assert deleted.pods == []
        state.apply_pod(member(1))  # the view catches up
        await preemption.drain()
        assert sorted(deleted.pods) == ["default/low-n0", "default/low-n1"]
        assert plans.refusals.take("default/whole") == []

    asyncio.run(run())


def test_a_refusal_is_asked_again_within_its_window_and_not_for_ever() -> None:
    """Refused again on a look (renew), a gang keeps its first refusal's window: a gang that
    cannot preempt is not planned again at every pod that leaves, for ever."""
    now = [0.0]
    refusals = Refusals(lambda: now[0])
    refusals.remember("g")
    assert refusals.take("other") == [] and refusals.take() == ["g"]
    assert refusals.take() == []  # handed out once
    now[0] = REFUSED_SECONDS / 2
    refusals.renew("g")
    assert refusals.take("g") == ["g"]
    now[0] = REFUSED_SECONDS + 1
    refusals.renew("g")  # the window is closed
    assert refusals.take() == []
    refusals.remember("g")  # kube-scheduler asked again, and was refused: a new window
    assert refusals.take() == ["g"]


def handed_to_kube_scheduler(
    monkeypatch: Any,
) -> tuple[ClusterState, UnaskedPreemption, Deleted, PreemptionPlans]:
    """n0 (4 CPUs) runs low (3 CPUs, priority 0); gang whole (1 x 2 CPUs, priority 500) asks
    the preempt verb, whose answer hands `low` to kube-scheduler. The extender follows that
    up as the server wires it."""
    monkeypatch.setattr(unasked_preemption, "STALLED_SECONDS", 0.2)
    monkeypatch.setattr(plan_module, "STALLED_SECONDS", 0.2)
    state = ClusterState()
    state.apply_node(node("n0"))
    state.apply_pod(pod("low", cpu="3", node="n0", phase="Running"))
    state.apply_podgroup(podgroup("whole", 1))
    raw = pod("whole-0", group="whole", cpu="2")
    raw["spec"]["priority"] = 500
    state.apply_pod(raw)
    preemption, deleted, plans = unasked_over(state)
    plans.handed_to_scheduler = preemption.follow
    return state, preemption, deleted, plans


def test_a_victim_kube_scheduler_was_handed_and_did_not_delete_is_evicted_by_the_extender(
    monkeypatch: Any,
) -> None:
    """Seed 5's his5-149 (issue 49): kube-scheduler's asynchronous preemption of the victim
    the plan handed it failed on an API server restart ("Async Preemption finished
    completely ... result=error"); it deleted nothing and did not retry, the member was not
    asked again, and the plan held the gang's room until it expired a minute later."""
    state, preemption, deleted, plans = handed_to_kube_scheduler(monkeypatch)

    async def run() -> None:
        answer = preempt_call(state, plans, "default/whole-0")
        assert [c.victim_uids for c in answer.candidates] == [["uid-default-low"]]
        await asyncio.sleep(0.1)
        assert deleted.pods == []  # kube-scheduler's to delete, for now
        await preemption.drain()

    asyncio.run(run())
    assert deleted.pods == ["default/low"]
    assert plans.stalled_victims("default/whole") == ([], None)  # ours now: not twice


def test_a_victim_kube_scheduler_is_deleting_is_left_to_it(monkeypatch: Any) -> None:
    state, preemption, deleted, plans = handed_to_kube_scheduler(monkeypatch)

    async def run() -> None:
        preempt_call(state, plans, "default/whole-0")
        state.apply_pod(pod("low", cpu="3", node="n0", phase="Running", deleting=True))
        await preemption.drain()

    asyncio.run(run())
    assert deleted.pods == []
