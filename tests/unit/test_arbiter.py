"""The arbiter's plumbing on the in-memory cluster state and the real permit gate."""

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission, FilterReason, wholeness
from app.core.groups import GroupRef, GroupSpec
from app.core.observer import NullObserver
from app.core.state import ClusterState
from app.kube.errors import NotFound
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.gate import PermitGate
from app.runtime.line import Candidate
from app.runtime.waiting_room import GateError
from app.runtime.wakeup import SiblingWaker
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock, RecordingBinder, eventually


class Released(NullObserver):
    def __init__(self) -> None:
        self.released: list[tuple[str, list[str], str]] = []

    def gang_released(self, group_key: str, released: Any, message: str) -> None:
        self.released.append((group_key, sorted(m.name for m in released), message))


def with_priority(raw: dict[str, Any], priority: int) -> dict[str, Any]:
    raw["spec"]["priority"] = priority
    return raw


def with_unschedulable(raw: dict[str, Any], message: str) -> dict[str, Any]:
    raw["metadata"]["resourceVersion"] = "2"
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return raw


class World:
    def __init__(self, nodes: int = 3, cpu: str = "4", touches: Any = None) -> None:
        self.state = ClusterState()
        self.state.replace_nodes([node(f"n{i}", cpu=cpu) for i in range(nodes)])
        self.clock = Clock(100.0)
        self.admission = Admission(3, clock=self.clock)  # a denial lasts 3 s of self.clock
        self.binder = RecordingBinder()
        self.gate = PermitGate(self.state, self.admission, self.binder, Metrics())
        self.observer = Released()
        waker = SiblingWaker(self.state, touches, cooldown_seconds=0) if touches else None
        self.arbiter = Arbiter(
            self.state,
            self.admission,
            self.gate,
            lambda spec: 30.0,
            ArbiterPeers(waker=waker, observer=self.observer),
            ArbiterSettings(aging_seconds=60, clock=self.clock),
        )
        self.state.add_pod_listener(self.gate.on_pod_change)
        if waker is not None:
            self.state.add_pod_listener(waker.on_pod_change)
        self.gate.add_settle_listener(self.arbiter.on_settled)
        self.state.add_pod_listener(self.arbiter.on_pod_change)
        self.state.add_node_listener(self.arbiter.on_nodes_changed)

    def gang(self, name: str, members: int, cpu: str, priority: int = 0) -> GroupSpec:
        self.state.apply_podgroup(podgroup(name, members))
        for i in range(members):
            self.state.apply_pod(with_priority(pod(f"{name}-{i}", group=name, cpu=cpu), priority))
        return GroupSpec(f"default/{name}", members)

    def two_gangs_a_claiming(self) -> tuple[GroupSpec, GroupSpec]:
        """Gangs a and b, each needing most of the 3 nodes; a has claimed them."""
        a = self.gang("a", 3, "2500m")
        b = self.gang("b", 3, "2500m")
        assert self.filter(a, "a-0").reason == FilterReason.CLAIMED
        return a, b

    def filter(self, spec: GroupSpec, member: str) -> Any:
        record = self.state.pods[f"default/{member}"]
        name = spec.key.split("/")[1]
        verdict = self.arbiter.admit(
            spec,
            GroupRef("default", name),
            Candidate(record.key, record.uid, record.priority, {}),
        )
        if not verdict.admitted and self.arbiter.waker is not None:
            # As GangExtender._reject does: kube-scheduler parks a pod our filter turned away.
            self.arbiter.waker.turned_away(spec.key, record.uid)
        return verdict

    def reserve(self, spec: GroupSpec, member: str, node_name: str) -> asyncio.Task[None]:
        record = self.state.pods[f"default/{member}"]
        return asyncio.create_task(self.gate.admit(record, node_name, spec, 30))


async def test_second_gang_waits_behind_the_one_holding_the_capacity() -> None:
    world = World()
    a, b = world.two_gangs_a_claiming()
    assert world.filter(a, "a-1").reason == FilterReason.HOLDING
    verdict = world.filter(b, "b-0")
    assert not verdict.admitted and verdict.reason == FilterReason.WAITING_BEHIND
    assert "waiting behind default/a (priority 0)" in verdict.message
    # Nothing of b was reserved or claimed.
    assert "default/b" not in world.arbiter.claims
    assert world.gate.waiting("default/b") == []

    # a is bound whole: its claim ends; b still does not fit (a's pods hold the nodes).
    tasks = [world.reserve(a, f"a-{i}", f"n{i}") for i in range(3)]
    await asyncio.gather(*tasks)
    assert "default/a" not in world.arbiter.claims
    assert world.filter(b, "b-0").reason == FilterReason.INSUFFICIENT_CAPACITY

    # a finishes: b is admitted as a whole.
    for i in range(3):
        world.state.delete_pod("default", f"a-{i}")
    assert world.filter(b, "b-1").reason == FilterReason.CLAIMED


async def test_a_gang_larger_than_the_free_capacity_is_short_and_reserves_nothing() -> None:
    world = World()
    big = world.gang("big", 4, "3")
    verdict = world.filter(big, "big-0")
    assert verdict.reason == FilterReason.INSUFFICIENT_CAPACITY
    assert "needs 4 more member(s)" in verdict.message and "only 3 fit" in verdict.message
    assert world.arbiter.claims == {}


async def test_a_member_that_finds_no_node_releases_the_whole_gang_at_once() -> None:
    world = World()
    a = world.gang("a", 3, "1")
    assert world.filter(a, "a-0").admitted
    first = world.reserve(a, "a-0", "n0")
    second = world.reserve(a, "a-1", "n1")
    await asyncio.sleep(0)
    assert len(world.gate.waiting("default/a")) == 2
    # kube-scheduler found no node for a-2 (its own filters, not ours).
    world.state.apply_pod(
        with_unschedulable(
            pod("a-2", group="a", cpu="1"), "0/3 nodes are available: 3 Insufficient cpu."
        )
    )
    for task in (first, second):
        with pytest.raises(GateError, match="released its reservations at once"):
            await task
    assert world.gate.waiting("default/a") == []
    assert world.state.free_resources()["cpu"] == 12000
    assert world.admission.check(a, wholeness(a, 3), dict).reason == FilterReason.DENIED
    group, released, message = world.observer.released[0]
    assert group == "default/a" and released == ["a-0", "a-1"]
    assert "member a-2 found no node (0/3 nodes are available: 3 Insufficient cpu.)" in message


async def test_a_member_kube_scheduler_preempts_for_does_not_fail_the_gang() -> None:
    world = World()
    a = world.gang("a", 3, "1")
    assert world.filter(a, "a-0").admitted
    nominated = with_unschedulable(
        pod("a-2", group="a", cpu="1"),
        "0/3 nodes are available: 3 Insufficient cpu. preemption: found a potential "
        "placement for pod on node n1, preempting 1 victims",
    )
    nominated["status"]["nominatedNodeName"] = "n1"
    world.state.apply_pod(nominated)
    assert "default/a" in world.arbiter.claims


async def test_room_of_preemption_victims_counts_as_free() -> None:
    world = World(nodes=2)
    for i in range(2):
        world.state.apply_pod(pod(f"low-{i}", cpu="3", node=f"n{i}", phase="Running"))
    urgent = world.gang("urgent", 2, "2")
    assert world.filter(urgent, "urgent-0").reason == FilterReason.INSUFFICIENT_CAPACITY
    # kube-scheduler marked both as victims and is deleting them.
    for i in range(2):
        victim = pod(f"low-{i}", cpu="3", node=f"n{i}", phase="Running")
        victim["status"]["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ]
        world.state.apply_pod(victim)
    world.clock.now += 1
    assert world.filter(urgent, "urgent-0").reason == FilterReason.CLAIMED


async def test_our_own_rejection_in_the_condition_is_not_a_capacity_failure() -> None:
    world = World()
    a = world.gang("a", 3, "1")
    world.arbiter.note_rejection("uid-default-a-2", "pod with pgName: default/a last failed")
    assert world.filter(a, "a-0").admitted
    world.state.apply_pod(
        with_unschedulable(
            pod("a-2", group="a", cpu="1"),
            "0/3 nodes are available: 3 pod with pgName: default/a last failed.",
        )
    )
    assert "default/a" in world.arbiter.claims


async def test_higher_priority_gang_takes_over_from_a_lower_one_collecting() -> None:
    world = World()
    low = world.gang("low", 3, "2500m", priority=1)
    high = world.gang("high", 3, "2500m", priority=100)
    assert world.filter(low, "low-0").reason == FilterReason.CLAIMED
    waiting = world.reserve(low, "low-0", "n0")
    await asyncio.sleep(0)
    verdict = world.filter(high, "high-0")
    assert verdict.reason == FilterReason.CLAIMED
    with pytest.raises(GateError, match="gave way to gang default/high"):
        await waiting
    assert set(world.arbiter.claims) == {"default/high"}
    # low is back in line, behind high.
    behind = world.filter(low, "low-1")
    assert behind.reason == FilterReason.WAITING_BEHIND
    assert "waiting behind default/high (priority 100)" in behind.message


async def test_gated_pods_do_not_count_toward_min_member() -> None:
    world = World()
    world.state.apply_podgroup(podgroup("g", 2))
    world.state.apply_pod(pod("g-0", group="g"))
    gated = pod("g-1", group="g")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    world.state.apply_pod(gated)
    assert [p.name for p in world.state.members("default/g")] == ["g-0"]
    del gated["spec"]["schedulingGates"]
    world.state.apply_pod(gated)
    assert len(world.state.members("default/g")) == 2


async def test_timeout_message_quotes_why_the_unplaced_members_were_not_placed() -> None:
    world = World()
    a = world.gang("a", 3, "1")
    world.state.apply_pod(
        with_unschedulable(
            pod("a-2", group="a", cpu="1"), "0/3 nodes are available: 3 Too many pods."
        )
    )
    member = world.state.pods["default/a-0"]
    with pytest.raises(GateError) as err:
        await world.gate.admit(member, "n0", a, 0.01)
    text = str(err.value)
    assert "not placed: a-1: not tried by the scheduler yet; a-2: 0/3 nodes are available" in text
    # A long message (it may quote an earlier timeout in turn) is clipped.
    world.state.apply_pod(with_unschedulable(pod("a-2", group="a", cpu="1"), "x" * 5000))
    with pytest.raises(GateError) as err:
        await world.gate.admit(world.state.pods["default/a-0"], "n0", a, 0.01)
    assert "a-2: " + "x" * 237 + "...; all waiting members were released" in str(err.value)


def test_snapshot_lists_claims_and_line() -> None:
    world = World()
    a = world.gang("a", 3, "2500m")
    b = world.gang("b", 3, "2500m")
    world.filter(a, "a-0")
    world.filter(b, "b-0")
    snap = world.arbiter.snapshot()
    assert snap["claims"] == [{"group": "default/a", "priority": 0, "members": 3}]
    assert [e["group"] for e in snap["line"]] == ["default/b"]


async def test_a_claim_whose_members_never_reach_the_gate_expires() -> None:
    world = World()
    _, b = world.two_gangs_a_claiming()
    world.clock.now += 31  # the group's wait (30 s) passed with nobody in the gate
    assert world.filter(b, "b-0").reason == FilterReason.CLAIMED
    assert set(world.arbiter.claims) == {"default/b"}


async def test_a_claiming_gang_that_loses_a_member_gives_up_its_claim_at_once() -> None:
    world = World()
    _, b = world.two_gangs_a_claiming()
    assert world.filter(b, "b-0").reason == FilterReason.WAITING_BEHIND
    # No time passes: the periodic look over all claims is not due, the deletion is.
    world.state.delete_pod("default", "a-2")
    assert world.filter(b, "b-0").reason == FilterReason.CLAIMED
    assert set(world.arbiter.claims) == {"default/b"}


class Touches:
    def __init__(self) -> None:
        self.pods: list[str] = []

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        self.pods.append(name)

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        raise AssertionError("no member is held in these tests")


async def settled(world: World) -> None:
    """The line's reconsidering ran, the wake-ups it scheduled fired, their touches ended."""
    waker = world.arbiter.waker
    assert waker is not None
    # A change schedules the reconsidering (0.05 s), which schedules wake-ups: wait for both.
    await eventually(lambda: not world.arbiter.reconsidering and not waker.pending)
    await waker.drain()


async def test_freed_capacity_wakes_the_gangs_in_line_that_now_fit() -> None:
    touches = Touches()
    world = World(touches=touches)
    waker = world.arbiter.waker
    assert waker is not None
    a = world.gang("a", 3, "2500m")
    b = world.gang("b", 3, "2500m")
    world.filter(a, "a-0")
    await asyncio.gather(*(world.reserve(a, f"a-{i}", f"n{i}") for i in range(3)))
    for member in ("b-0", "b-1", "b-2"):  # kube-scheduler tried each; each was turned away
        assert world.filter(b, member).reason == FilterReason.INSUFFICIENT_CAPACITY
    await waker.drain()
    touches.pods.clear()
    # a finishes: its pods go away, and b's members are touched so that
    # kube-scheduler retries them now.
    for i in range(3):
        world.state.delete_pod("default", f"a-{i}")
    await settled(world)
    assert sorted(touches.pods) == ["b-0", "b-1", "b-2"]


async def test_a_new_node_wakes_a_gang_that_did_not_fit() -> None:
    touches = Touches()
    world = World(touches=touches)
    big = world.gang("big", 4, "3")
    for i in range(4):  # kube-scheduler tried each member; each was turned away
        assert world.filter(big, f"big-{i}").reason == FilterReason.INSUFFICIENT_CAPACITY
    assert world.arbiter.waker is not None
    await settled(world)
    touches.pods.clear()  # the wake-ups of the members' creation
    for i in range(4):  # kube-scheduler retried the woken members: turned away again
        assert world.filter(big, f"big-{i}").reason == FilterReason.INSUFFICIENT_CAPACITY
    world.state.apply_node(node("n-extra"))
    await settled(world)
    assert sorted(touches.pods) == ["big-0", "big-1", "big-2", "big-3"]
    assert world.filter(big, "big-0").reason == FilterReason.CLAIMED


def test_what_a_claim_holds_follows_every_change_of_its_members() -> None:
    """The arbiter reuses a claim's holdings until one of its members changes."""
    w = World()
    a = w.gang("a", 3, "1")
    assert w.filter(a, "a-0").reason == FilterReason.CLAIMED
    claim = w.arbiter.claims[a.key]

    def holds() -> Any:
        return w.arbiter.ledger.holder(a.key, claim)

    def fresh() -> Any:
        return w.arbiter.ledger.compute_holder(a.key, claim)

    assert holds() == fresh()
    assert holds() is holds()  # reused while nothing changed
    node_of = dict(claim.plan)
    steps: list[Callable[[], None]] = [
        lambda: w.state.reserve("default/a-0", node_of["default/a-0"]),
        lambda: w.state.assume_bound("default/a-0", node_of["default/a-0"]),
        lambda: w.state.reserve("default/a-1", node_of["default/a-1"]),
        lambda: w.state.unreserve("default/a-1"),
        lambda: w.state.apply_pod(pod("a-2", group="a", cpu="1", phase="Failed")),
        lambda: w.state.delete_pod("default", "a-1"),
    ]
    for step in steps:
        before = holds()
        step()
        assert holds() == fresh()
        assert holds() is not before  # recomputed


def test_behind_an_aged_gang_small_gangs_take_what_it_can_never_use() -> None:
    """The issue's story, small: every node runs a 6-CPU pod, big gangs of 6-CPU members wait
    and age; gangs of 100m run in the 2 CPUs beside, and /debug says where the big one holds."""
    world = World(nodes=4, cpu="8")
    for i in range(4):
        world.state.apply_pod(pod(f"run-{i}", cpu="6", node=f"n{i}", phase="Running"))
    big = world.gang("big", 4, "6")
    assert world.filter(big, "big-0").reason == FilterReason.INSUFFICIENT_CAPACITY
    world.clock.now += 61  # the big gang has aged
    small = world.gang("small", 2, "100m")
    assert world.filter(small, "small-0").reason == FilterReason.CLAIMED
    line = world.arbiter.snapshot()["line"]
    assert line == [
        {
            "group": "default/big",
            "priority": 0,
            "waitingSeconds": 61.0,
            "aged": True,
            "heldFor": {"nodes": [], "nodeCount": 0, "why": "all it may use is in use"},
        }
    ]
    # A run ends: its node is empty, and the big gang holds there what its members can use.
    world.state.delete_pod("default", "run-3")  # (the small gang was promised n0)
    mid = world.gang("mid", 1, "3")
    verdict = world.filter(mid, "mid-0")
    assert verdict.reason == FilterReason.WAITING_BEHIND
    assert (
        "waiting behind default/big (priority 0), which has waited longest and holds what its "
        "4 member(s) can use on nodes n3; it is admitted as a whole once its 1 member(s) fit in "
        "what it cannot use" in verdict.message
    )
    held = world.arbiter.snapshot()["line"][0]["heldFor"]
    assert held == {"nodes": ["n3"], "nodeCount": 1}
    # A gang of 2 CPUs per member still fits beside it there.
    two = world.gang("two", 1, "2")
    assert world.filter(two, "two-0").reason == FilterReason.CLAIMED


async def test_a_wave_whose_every_binding_failed_ends_its_claim() -> None:
    """Its pods deleted while admitted: no filter call comes to prune the claim (issue 49)."""
    world = World()
    a = world.gang("a", 2, "1")
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    for i in range(2):
        world.binder.fail[f"a-{i}"] = NotFound(f'API server answered 404: pods "a-{i}" not found')
    results = await asyncio.gather(
        *(world.reserve(a, f"a-{i}", f"n{i}") for i in range(2)), return_exceptions=True
    )
    assert all(isinstance(r, Exception) for r in results)
    assert "default/a" not in world.arbiter.claims


async def test_a_claim_whose_gang_is_deleted_ends_without_a_filter_call() -> None:
    """Found by the soak (seed 51): a preempting gang claimed room, two members were
    reserved in the gate, then the whole gang was deleted. Its claim stood until the next
    filter call, and in a quiet cluster none comes: capacity held for a gang that is gone."""
    world = World()
    a = world.gang("a", 3, "1")
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    waiting = [world.reserve(a, f"a-{i}", f"n{i}") for i in range(2)]
    await asyncio.sleep(0)
    for i in range(3):
        world.state.delete_pod("default", f"a-{i}")
    world.state.delete_podgroup("default", "a")
    await asyncio.gather(*waiting, return_exceptions=True)
    await eventually(lambda: not world.arbiter.claims)  # reconsidered 0.05 s after a change
    assert world.arbiter.claims == {}
    assert world.arbiter.snapshot()["claims"] == []


async def test_a_retried_gang_short_of_devices_is_not_counted_again_until_they_change() -> None:
    from tests.unit import test_devices as dra

    world = World()
    devices = world.state.devices
    devices.apply(dra.CLASSES, dra.device_class())
    devices.apply(dra.SLICES, dra.resource_slice("n0-gpus", "n0"))
    devices.apply(dra.TEMPLATES, dra.template("two", dra.requests_of(2)))
    world.state.apply_podgroup(podgroup("train", 3))
    for i in range(3):
        world.state.apply_pod(
            dra.gpu_pod(f"train-{i}", template_name="two", group="train", cpu="1")
        )
    spec = GroupSpec("default/train", 3)
    memo = world.arbiter.shortfalls
    verdict = world.filter(spec, "train-0")
    assert verdict.reason == FilterReason.INSUFFICIENT_CAPACITY
    assert verdict.message.startswith(
        "gang default/train needs 6 devices of class gpu.example.com, 4 free in the cluster"
    )
    world.filter(spec, "train-1")  # (joining the line moved the revision: counted again)
    computed = memo.computed
    assert world.filter(spec, "train-2").message == verdict.message
    assert memo.computed == computed  # the retry reused it
    devices.apply(dra.SLICES, dra.resource_slice("n1-gpus", "n1"))
    assert world.filter(spec, "train-0").reason == FilterReason.CLAIMED
    assert memo.computed == computed + 1


async def test_a_gang_kube_scheduler_found_no_node_for_joins_the_line_and_keeps_its_place() -> None:
    """Its members never reached our filter (kube-scheduler's own filters turned them away:
    every node short of CPU), yet it waits for room as any other: in line, by creation."""
    world = World()
    world.two_gangs_a_claiming()
    late = world.gang("late", 3, "2500m")
    raw = world.state.pods["default/late-0"]
    assert "default/late" not in world.arbiter.waiting
    world.state.apply_pod(
        with_unschedulable(
            pod("late-0", group="late", cpu="2500m"), "0/3 nodes are available: 3 Insufficient cpu."
        )
    )
    await eventually(lambda: "default/late" in world.arbiter.waiting)
    assert world.state.pods["default/late-0"].uid == raw.uid
    assert late.key == "default/late" and "default/a" in world.arbiter.claims


@pytest.mark.parametrize(
    ("message", "joins"),
    [
        ("0/3 nodes are available: 3 Insufficient cpu.", True),
        ("0/3 nodes are available: 1 Insufficient memory, 2 Insufficient cpu.", True),
        (
            "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.",
            False,
        ),
    ],
)
async def test_only_a_refusal_for_room_puts_the_gang_in_line(message: str, joins: bool) -> None:
    """The line models room only: a gang refused for anti-affinity aged in line would hold
    room back for a placement kube-scheduler refuses anyway."""
    world = World()
    world.two_gangs_a_claiming()
    world.gang("late", 3, "2500m")
    world.state.apply_pod(with_unschedulable(pod("late-0", group="late", cpu="2500m"), message))
    assert world.state.pods["default/late-0"].refused_for_room == joins
    if joins:
        await eventually(lambda: "default/late" in world.arbiter.waiting)
    else:
        await asyncio.sleep(0.3)
        assert "default/late" not in world.arbiter.waiting
