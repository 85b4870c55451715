"""Queues in the arbiter: Queue objects from the watch, shares at filter time, reclaim."""

from __future__ import annotations

import asyncio
from typing import Any

from app.base.metrics import Metrics
from app.core.admission import Admission, FilterReason
from app.core.groups import GroupRef, GroupSpec
from app.core.observer import NullObserver
from app.core.preemption.victims import Preemptor, VictimCandidate, VictimPolicy
from app.core.queues import QUEUE_ANNOTATION
from app.core.state import ClusterState
from app.core.topology.sources import (
    KUEUE_POD_INDEX,
    KUEUE_REQUIRED,
    KUEUE_SLICE_REQUIRED,
    KUEUE_SLICE_SIZE,
)
from app.kube.errors import Transient
from app.ops.queue_status import QueueStatusWriter
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.gate import PermitGate
from app.runtime.line import Candidate
from app.runtime.preemption.plan import PlanKind, PlanPhase
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.queues.book import QueueBook
from app.runtime.queues.reclaimer import Reclaimer
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock, RecordingBinder


def queue(name: str, weight: int = 1, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"weight": weight, **spec}}


class Evictions:
    """The Eviction API as PodDisruptionBudgets answer it: `refuse` pods, dry run or real."""

    def __init__(self) -> None:
        self.evicted: list[str] = []
        self.deleted: list[str] = []
        self.refuse: set[str] = set()  # refused in the dry run and for real
        self.refuse_for_real: set[str] = set()  # allowed in the dry run only

    async def evict_through_api(
        self, namespace: str, name: str, uid: str, *, dry_run: bool = False
    ) -> None:
        key = f"{namespace}/{name}"
        if key in self.refuse or (not dry_run and key in self.refuse_for_real):
            raise Transient("Cannot evict pod as it would violate the pod's disruption budget.")
        if not dry_run:
            self.evicted.append(key)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(f"{namespace}/{name}")


class Reclaimed(NullObserver):
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], str]] = []

    def gang_reclaimed(self, group_key: str, evicted: Any, message: str) -> None:
        self.messages.append((group_key, sorted(m.name for m in evicted), message))


class World:
    """3 nodes of 4 CPUs; gangs of 2 one-CPU pods whose PodGroup names a queue."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.state.replace_nodes([node(f"n{i}", cpu="4", memory="64Gi") for i in range(3)])
        admission = Admission(3)
        self.gate = PermitGate(self.state, admission, RecordingBinder(), Metrics())
        self.book = QueueBook(self.state, metrics=Metrics())
        self.evictions = Evictions()
        self.observer = Reclaimed()
        self.plans = PreemptionPlans(self.state, VictimPolicy.PROTECT, Metrics())
        self.reclaimer = Reclaimer(self.state, self.evictions, self.observer, plans=self.plans)
        self.state.add_pod_listener(self.plans.on_pod_change)
        self.arbiter = Arbiter(
            self.state,
            admission,
            self.gate,
            lambda spec: 30.0,
            ArbiterPeers(observer=self.observer, queues=self.book, reclaimer=self.reclaimer),
            ArbiterSettings(clock=Clock(100.0)),
        )
        self.state.add_pod_listener(self.arbiter.on_pod_change)
        self.reclaimer.when_refused(self.arbiter.retry_reclaim)

    def gang(self, name: str, queue: str, *, bound_on: str = "") -> GroupSpec:
        group = podgroup(name, 2)
        group["metadata"]["annotations"] = {QUEUE_ANNOTATION: queue}
        group["metadata"]["creationTimestamp"] = (
            f"2026-01-01T00:00:{len(self.state.podgroups):02d}Z"
        )
        self.state.apply_podgroup(group)
        for i in range(2):
            self.state.apply_pod(pod(f"{name}-{i}", group=name, cpu="1", node=bound_on))
        spec = self.state.podgroups[f"default/{name}"].spec
        assert spec is not None and spec.queue == queue
        return spec

    def filter(self, spec: GroupSpec, member: str) -> Any:
        record = self.state.pods[f"default/{member}"]
        return self.arbiter.admit(
            spec,
            GroupRef("default", spec.key.split("/")[1]),
            Candidate(record.key, record.uid, record.priority, {}),
        )


def test_without_queue_objects_nothing_changes() -> None:
    world = World()
    spec = world.gang("a", "team-a")
    assert not world.book.active
    assert world.filter(spec, "a-0").reason == FilterReason.CLAIMED
    assert "queues" not in world.arbiter.snapshot()


def test_a_queue_at_its_share_waits_while_the_other_queue_below_it_waits() -> None:
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(3):  # team-a holds 6 of 12 CPUs: its deserved half
        world.gang(f"a{i}", "team-a", bound_on=f"n{i}")
    more = world.gang("a3", "team-a")
    for i in range(3):  # team-b asks for its half too
        world.gang(f"b{i}", "team-b")
    verdict = world.filter(more, "a3-0")
    assert verdict.reason == FilterReason.QUEUE_SHARE
    assert verdict.message.startswith(
        "gang default/a3 waits in its queue: queue team-a (weight 1) holds cpu 6, "
        "memory 6Gi of its deserved cpu 6"
    )
    assert "queue team-b (weight 1) holds nothing" in verdict.message
    assert "with 3 gang(s) waiting" in verdict.message
    debug = {q["queue"]: q for q in world.arbiter.snapshot()["queues"]}
    assert debug["team-a"]["allocated"] == "cpu 6, memory 6Gi"
    assert debug["team-b"]["pendingGangs"] == 3


def test_work_conserving_a_queue_may_exceed_its_share_while_no_other_waits() -> None:
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(3):
        world.gang(f"a{i}", "team-a", bound_on=f"n{i}")
    more = world.gang("a3", "team-a")
    assert world.filter(more, "a3-0").reason == FilterReason.CLAIMED


def test_a_queue_that_does_not_exist_holds_its_gangs_with_a_message() -> None:
    world = World()
    world.book.replace([queue("team-a")])
    spec = world.gang("x", "typo")
    verdict = world.filter(spec, "x-0")
    assert verdict.reason == FilterReason.QUEUE_SHARE
    assert "names queue typo, which does not exist" in verdict.message


async def test_reclaim_evicts_the_latest_gang_of_the_queue_above_its_share() -> None:
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(6):  # team-a fills the cluster while team-b is idle
        world.gang(f"a{i}", "team-a", bound_on=f"n{i // 2}")
    needy = world.gang("b0", "team-b")
    verdict = world.filter(needy, "b0-0")
    assert verdict.reason == FilterReason.INSUFFICIENT_CAPACITY
    assert verdict.message.endswith(
        "reclaiming 1 gang(s) for it from queues above their share: default/a5 (queue team-a)"
    )
    await world.reclaimer.drain()
    assert sorted(world.evictions.evicted) == ["default/a5-0", "default/a5-1"]
    [(key, members, message)] = world.observer.messages
    assert (key, members) == ("default/a5", ["a5-0", "a5-1"])
    assert "queue team-b is below its deserved share" in message
    # Asked again before the evictions show: nothing more is evicted.
    world.filter(needy, "b0-1")
    await world.reclaimer.drain()
    assert len(world.evictions.evicted) == 2


async def test_a_gang_a_disruption_budget_protects_is_not_reclaimed_another_is() -> None:
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(6):
        world.gang(f"a{i}", "team-a", bound_on=f"n{i // 2}")
    world.evictions.refuse = {"default/a5-1"}
    needy = world.gang("b0", "team-b")
    world.filter(needy, "b0-0")
    await world.reclaimer.drain()
    # One member's budget says no: none of a5 goes, and no Event says it did.
    assert world.evictions.evicted == [] and world.evictions.deleted == []
    assert world.observer.messages == []
    # The arbiter was told to look again (its reclaim check, a moment later):
    # another victim, the most recent of the others.
    world.arbiter.check_reclaims()
    await world.reclaimer.drain()
    assert sorted(world.evictions.evicted) == ["default/a4-0", "default/a4-1"]
    [(key, _members, _message)] = world.observer.messages
    assert key == "default/a4"


async def test_a_member_refused_after_its_dry_run_is_deleted_not_left_alone() -> None:
    """A budget allowing one disruption passes both dry runs, then refuses the second."""
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(6):
        world.gang(f"a{i}", "team-a", bound_on=f"n{i // 2}")
    world.evictions.refuse_for_real = {"default/a5-1"}
    world.filter(world.gang("b0", "team-b"), "b0-0")
    await world.reclaimer.drain()
    assert world.evictions.evicted == ["default/a5-0"]
    assert world.evictions.deleted == ["default/a5-1"]


async def test_a_reclaim_is_the_needy_gangs_preemption_plan_until_it_is_placed() -> None:
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(6):
        world.gang(f"a{i}", "team-a", bound_on=f"n{i // 2}")
    needy = world.gang("b0", "team-b")
    world.filter(needy, "b0-0")
    await world.reclaimer.drain()
    plan = world.plans.plans["default/b0"]
    assert (plan.kind, plan.phase) == (PlanKind.RECLAIM, PlanPhase.EVICTING)
    assert plan.describe() == "2 eviction(s) by queue reclaim: default/a5-0, default/a5-1"
    assert [p["kind"] for p in world.plans.snapshot()] == ["reclaim"]
    assert world.plans.beneficiary("uid-default-a5-0") == "default/b0"
    # The needy gang's own preempt call evicts nothing more: it waits for this room.
    own = world.state.pods["default/b0-1"]
    answer = world.plans.answer(
        needy,
        GroupRef("default", "b0"),
        Preemptor(own.key, own.uid, own.priority, "default/b0"),
        world.arbiter.line.gang(needy, None).demands[0],
        [VictimCandidate("n0", ["uid-default-a0-0"], 0)],
    )
    assert answer.candidates == [] and "queue reclaim" in answer.message
    # The victims leave, the gang is placed: the plan ends done.
    for i in range(2):
        world.state.delete_pod("default", f"a5-{i}")
    assert plan.phase is PlanPhase.PLACING
    for i in range(2):
        world.state.apply_pod(pod(f"b0-{i}", group="b0", cpu="1", node="n2"))
    world.plans.snapshot()
    assert plan.phase.value == "done" and "default/b0" not in world.plans.plans


async def test_nothing_is_reclaimed_before_the_pods_are_listed_then_the_latest_gang_is() -> None:
    """Just started, its first list of pods still landing: a gang seen in part would be
    evicted in part (PreemptionPlans.listed, issue 49's soak)."""
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(6):
        world.gang(f"a{i}", "team-a", bound_on=f"n{i // 2}")
    needy = world.gang("b0", "team-b")
    listed = False
    world.plans.listed = lambda: listed
    world.filter(needy, "b0-0")
    await world.reclaimer.drain()
    assert world.evictions.evicted == []
    listed = True
    world.arbiter.on_nodes_changed()  # the verdict kept for its retries is weighed again
    world.filter(needy, "b0-1")
    await world.reclaimer.drain()
    assert sorted(world.evictions.evicted) == ["default/a5-0", "default/a5-1"]


async def test_a_gang_still_in_the_gate_is_not_reclaimed() -> None:
    """Admitted but not bound yet: evicting it would cut it in the middle of its binding."""
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    for i in range(5):
        world.gang(f"a{i}", "team-a", bound_on=f"n{i // 2}")
    world.gang("a5", "team-a")
    for i in range(2):
        world.state.reserve(f"default/a5-{i}", "n2")  # the most recent, held in the gate
    verdict = world.filter(world.gang("b0", "team-b"), "b0-0")
    assert verdict.message.endswith("default/a4 (queue team-a)")
    await world.reclaimer.drain()
    assert sorted(world.evictions.evicted) == ["default/a4-0", "default/a4-1"]


async def test_no_reclaim_from_a_queue_that_is_not_reclaimable() -> None:
    world = World()
    world.book.replace([queue("team-a", reclaimable=False), queue("team-b")])
    for i in range(6):
        world.gang(f"a{i}", "team-a", bound_on=f"n{i // 2}")
    needy = world.gang("b0", "team-b")
    verdict = world.filter(needy, "b0-0")
    assert verdict.reason == FilterReason.INSUFFICIENT_CAPACITY
    assert "reclaiming" not in verdict.message
    await world.reclaimer.drain()
    assert world.evictions.evicted == []


class StatusPatches:
    """The status subresource; each patch comes back through the watch, as the API server's."""

    def __init__(self, book: QueueBook) -> None:
        self.book = book
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def patch(self, name: str, status: dict[str, Any]) -> None:
        self.patches.append((name, status))
        self.book.upsert({**queue(name), "status": status})


async def test_queue_status_counts_are_written_by_the_leader_only_when_they_change() -> None:
    world = World()
    world.book.replace([queue("team-a"), queue("team-b")])
    world.gang("a0", "team-a", bound_on="n0")
    world.gang("a1", "team-a")
    api = StatusPatches(world.book)
    leading = [False]
    writer = QueueStatusWriter(world.book, world.arbiter.holders, api, lambda: leading[0])
    await writer.tick()
    assert api.patches == []
    leading[0] = True
    await writer.tick()
    assert sorted(api.patches, key=lambda p: p[0]) == [
        (
            "team-a",
            {
                "pending": 1,
                "inqueue": 0,
                "running": 1,
                "allocated": {"cpu": "2", "memory": "2147483648", "pods": "2"},
            },
        ),
        ("team-b", {"pending": 0, "inqueue": 0, "running": 0, "allocated": {}}),
    ]
    await writer.tick()
    assert len(api.patches) == 2
    # team-b deleted and created again under its name: its new object is written.
    world.book.delete(queue("team-b"))
    world.book.upsert(queue("team-b"))
    await writer.tick()
    assert [name for name, _ in api.patches[2:]] == ["team-b"]


async def test_the_writer_keeps_the_tally_current_between_ticks_and_ticks() -> None:
    world = World()
    world.book.replace([queue("team-a")])
    world.gang("a0", "team-a", bound_on="n0")
    world.gang("a1", "team-a")
    api = StatusPatches(world.book)
    writer = QueueStatusWriter(
        world.book, world.arbiter.holders, api, lambda: True, interval_seconds=0.05
    )
    writer.start()
    await asyncio.sleep(0.2)
    await writer.stop()
    assert [name for name, _ in api.patches] == ["team-a"]
    assert api.patches[0][1]["pending"] == 1 and api.patches[0][1]["running"] == 1


def test_a_younger_gang_does_not_take_the_queue_room_an_older_one_waits_for() -> None:
    world = World()
    world.book.replace([queue("team-a", capability={"cpu": "4"})])
    world.gang("a0", "team-a", bound_on="n0")
    world.gang("a1", "team-a")  # older: the queue's last 2 CPUs are its
    younger = world.gang("a2", "team-a")
    verdict = world.filter(younger, "a2-0")
    assert verdict.reason == FilterReason.QUEUE_SHARE
    assert verdict.message.startswith(
        "gang default/a2 waits behind 1 older or higher-priority gang(s) of queue team-a "
        "(default/a1): the queue's share has room for them first"
    )


RACK = "example.com/rack"


def racked(world: World, racks: tuple[str, ...], cpu: str) -> None:
    """The world's nodes made n0.. with `cpu` each, node i in rack racks[i]; queues team-a
    and team-b."""
    nodes = []
    for i, rack in enumerate(racks):
        raw = node(f"n{i}", cpu=cpu, memory="64Gi")
        raw["metadata"]["labels"][RACK] = rack
        nodes.append(raw)
    world.state.replace_nodes(nodes)
    world.book.replace([queue("team-a"), queue("team-b")])


def needy_gang(world: World, annotations: dict[str, str], ranked: bool = False) -> GroupSpec:
    """team-b's gang b0 of 4 one-CPU pods, each with `annotations` (and its rank)."""
    group = podgroup("b0", 4)
    group["metadata"]["annotations"] = {QUEUE_ANNOTATION: "team-b"}
    group["metadata"]["creationTimestamp"] = "2026-01-01T00:01:00Z"
    world.state.apply_podgroup(group)
    for i in range(4):
        raw = pod(f"b0-{i}", group="b0", cpu="1")
        raw["metadata"]["annotations"] = dict(annotations)
        if ranked:
            raw["metadata"]["labels"][KUEUE_POD_INDEX] = str(i)
        world.state.apply_pod(raw)
    spec = world.state.podgroups["default/b0"].spec
    assert spec is not None
    return spec


async def test_a_gang_that_needs_one_rack_reclaims_room_in_one_rack_only() -> None:
    """Racks r1 (n0, n1) and r2 (n2, n3) of 2-CPU nodes, full of team-a's gangs; team-b's
    gang of 4 one-CPU pods must fit in one rack (Kueue's podset-required-topology). Team-a
    may lose 2 gangs (half the CPUs is its share): by age alone that is a3 (r2) and a2
    (r1), room the gang cannot use; its own fits test takes both of one rack."""
    world = World()
    racked(world, ("r1", "r1", "r2", "r2"), "2")
    for name, on in (("a0", "n2"), ("a1", "n0"), ("a2", "n1"), ("a3", "n3")):
        world.gang(name, "team-a", bound_on=on)
    spec = needy_gang(world, {KUEUE_REQUIRED: RACK})
    verdict = world.filter(spec, "b0-0")
    assert verdict.message.endswith(
        "reclaiming 2 gang(s) for it from queues above their share: "
        "default/a3 (queue team-a), default/a0 (queue team-a)"
    ), verdict.message
    await world.reclaimer.drain()
    assert sorted(world.evictions.evicted) == [
        "default/a0-0",
        "default/a0-1",
        "default/a3-0",
        "default/a3-1",
    ]


async def test_a_gang_of_slices_reclaims_the_fewest_only_in_the_racks_its_slices_take() -> None:
    """Racks r1..r4 of two 1-CPU nodes: team-a's two oldest gangs of two hold all of r3
    and all of r4, its four most recent hold one node each of r1 and r2. team-b's gang of
    4 in slices of 2 by rack (no rack of its own) reclaims the gangs of r3 and r4, two;
    by age alone the four of r1 and r2 would go."""
    world = World()
    racked(world, ("r1", "r1", "r2", "r2", "r3", "r3", "r4", "r4"), "1")
    for name, nodes in (("a0", ("n4", "n5")), ("a1", ("n6", "n7"))):
        world.gang(name, "team-a")
        for i, on in enumerate(nodes):
            world.state.apply_pod(pod(f"{name}-{i}", group=name, cpu="1", node=on))
    for name, on in (("a2", "n2"), ("a3", "n0"), ("a4", "n3"), ("a5", "n1")):
        group = podgroup(name, 1)
        group["metadata"]["annotations"] = {QUEUE_ANNOTATION: "team-a"}
        group["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{int(name[1]):02d}Z"
        world.state.apply_podgroup(group)
        world.state.apply_pod(pod(f"{name}-0", group=name, cpu="1", node=on))
    slices = {KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "2"}
    verdict = world.filter(needy_gang(world, slices, ranked=True), "b0-0")
    assert verdict.message.endswith(
        "reclaiming 2 gang(s) for it from queues above their share: "
        "default/a1 (queue team-a), default/a0 (queue team-a)"
    ), verdict.message
    await world.reclaimer.drain()
    evicted = [f"default/{name}-{i}" for name in ("a0", "a1") for i in range(2)]
    assert sorted(world.evictions.evicted) == evicted  # r1's and r2's gangs keep running
