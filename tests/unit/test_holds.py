"""Gangs held in line (--hold-waiting-gangs): the arbiter, the line, the waker and the sweep on
the in-memory cluster state and the real permit gate; the API server is a fake that removes
the gate from the pod as the real one does, and the watch is the state's own apply."""

import asyncio
import copy
import datetime
from typing import Any

from app.base.metrics import Metrics
from app.core.admission import Admission, FilterReason
from app.core.groups import POD_GROUP_LABEL, GroupRef, GroupSpec
from app.core.marking import LINE_GATE
from app.core.observer import NullObserver
from app.core.preemption.victims import VictimPolicy
from app.core.records import pod_record_from
from app.core.state import ClusterState
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.gate import PermitGate
from app.runtime.holds import GRACE_SECONDS, LineHolds
from app.runtime.line import Candidate
from app.runtime.preemption.line_check import ArbiterLineCheck
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.preemption.unasked import UnaskedPreemption
from app.runtime.reconsider import SLICE
from app.runtime.wakeup import SiblingWaker
from app.server import holding
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock, RecordingBinder, eventually
from tests.unit.test_config import settings


def held(raw: dict[str, Any], *others: str) -> dict[str, Any]:
    """The pod as the webhook leaves it with holding on (and other controllers' gates)."""
    raw["spec"]["schedulingGates"] = [{"name": name} for name in (*others, LINE_GATE)]
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    ]
    return raw


class Api:
    """The API server's side of a release: the gate goes, the watch delivers the pod."""

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.released: list[str] = []
        self.touched: list[str] = []
        self.raw: dict[str, dict[str, Any]] = {}

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        self.touched.append(name)

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        self.released.append(name)
        raw = self.raw[name]
        gates = [g for g in raw["spec"]["schedulingGates"] if g["name"] != LINE_GATE]
        raw["spec"]["schedulingGates"] = gates
        if not gates:
            raw["status"]["conditions"] = []
        raw["metadata"]["resourceVersion"] = str(int(raw["metadata"]["resourceVersion"]) + 1)
        assert self.state is not None
        self.state.apply_pod(copy.deepcopy(raw))


class Told(NullObserver):
    def __init__(self) -> None:
        self.held: list[tuple[str, str]] = []

    def gang_held(self, group_key: str, message: str) -> None:
        self.held.append((group_key, message))


class World:
    """Three nodes of 4 CPUs; holding on unless told otherwise."""

    def __init__(self, *, hold: bool = True) -> None:
        self.state = ClusterState()
        self.state.replace_nodes([node(f"n{i}", cpu="4") for i in range(3)])
        self.admission = Admission(3)
        self.gate = PermitGate(self.state, self.admission, RecordingBinder(), Metrics())
        self.clock = Clock(100.0)
        self.api = Api()
        self.api.state = self.state
        self.told = Told()
        self.waker = SiblingWaker(self.state, self.api, cooldown_seconds=0)
        self.arbiter = Arbiter(
            self.state,
            self.admission,
            self.gate,
            lambda spec: 30.0,
            ArbiterPeers(waker=self.waker, observer=self.told),
            ArbiterSettings(aging_seconds=60, clock=self.clock, hold=hold),
        )
        self.state.add_pod_listener(self.waker.on_pod_change)
        self.state.add_pod_listener(self.gate.on_pod_change)
        self.gate.add_settle_listener(self.arbiter.on_settled)
        self.state.add_pod_listener(self.arbiter.on_pod_change)
        self.created = 0

    @property
    def holds(self) -> LineHolds:
        assert self.arbiter.holds is not None
        return self.arbiter.holds

    def gang(
        self,
        name: str,
        members: int,
        cpu: str,
        *,
        created: int | None = None,
        gates: int = 0,
        priority: int = 0,
    ) -> GroupSpec:
        """A PodGroup of minMember `members`; `created` of its pods (all by default), held.
        Each PodGroup is created a second after the one before (the line's order)."""
        group = podgroup(name, members)
        self.created += 1
        stamp = datetime.datetime.fromtimestamp(1_800_000_000 + self.created, datetime.UTC)
        group["metadata"]["creationTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.state.apply_podgroup(group)
        for i in range(members if created is None else created):
            raw = held(pod(f"{name}-{i}", group=name, cpu=cpu), *(["other.io/wait"] * gates))
            raw["spec"]["priority"] = priority
            self.api.raw[f"{name}-{i}"] = raw
            self.state.apply_pod(copy.deepcopy(raw))  # the state keeps what it needs of it
        return GroupSpec(f"default/{name}", members)

    def filter(self, spec: GroupSpec, member: str) -> Any:
        record = self.state.pods[f"default/{member}"]
        return self.arbiter.admit(
            spec,
            GroupRef("default", spec.key.split("/")[1]),
            Candidate(record.key, record.uid, record.priority, {}),
        )

    async def settled(self) -> None:
        await eventually(lambda: not self.arbiter.reconsidering and not self.waker.pending)
        await self.waker.drain()

    def held_now(self) -> set[str]:
        return {p.name for p in self.state.pods.values() if p.held}

    def preemption(self) -> list[str]:
        """The extender's own preemption for held gangs, as the server wires it: the deleted
        pods' keys (the fake API deletes them at once, as the pod simulator does)."""
        plans = PreemptionPlans(self.state, VictimPolicy.PROTECT, Metrics())
        plans.consult(ArbiterLineCheck(self.arbiter, self.state))
        state, deleted = self.state, list[str]()

        class Evicter:
            async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
                deleted.append(f"{namespace}/{name}")
                state.delete_pod(namespace, name)

        unasked = UnaskedPreemption(
            self.state, self.admission, plans, Evicter(), NullObserver(), VictimPolicy.PROTECT
        )
        self.state.add_pod_listener(plans.on_pod_change)
        self.holds.preempting = unasked.for_held
        return deleted

    def running(self, name: str, at: str, cpu: str, priority: int) -> None:
        raw = pod(name, cpu=cpu, node=at, phase="Running")
        raw["spec"]["priority"] = priority
        self.state.apply_pod(raw)


def test_a_held_member_counts_for_its_gang_and_is_not_unschedulable() -> None:
    record = pod_record_from(held(pod("a-0", group="a")))
    assert record.held and not record.gated and record.counts_as_member
    assert not record.unschedulable and record.unschedulable_message == ""
    other = pod_record_from(held(pod("a-1", group="a"), "example.com/wait"))
    assert other.held and other.gated and not other.counts_as_member


async def test_a_gang_that_fits_is_released_whole_and_admitted() -> None:
    world = World()
    a = world.gang("a", 3, "2500m")
    assert "default/a" in world.arbiter.waiting  # it joined the line once whole
    await world.settled()
    assert sorted(world.api.released) == ["a-0", "a-1", "a-2"]
    assert world.held_now() == set()
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    assert world.told.held and world.told.held[0][0] == "default/a"
    assert LINE_GATE in world.told.held[0][1]


async def test_a_gang_that_does_not_fit_stays_held_until_room_frees_in_line_order() -> None:
    world = World()
    a = world.gang("a", 3, "2500m")
    await world.settled()
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    world.gang("b", 3, "2500m")
    world.clock.now += 1
    world.gang("c", 3, "1")
    await world.settled()
    # a holds the room b needs; c (3 x 1 CPU) fits beside it and is not held back by b,
    # which has not aged.
    assert world.held_now() == {"b-0", "b-1", "b-2"}
    assert set(world.api.released) == {"a-0", "a-1", "a-2", "c-0", "c-1", "c-2"}
    assert list(world.arbiter.waiting) == ["default/b", "default/c"]

    # a ends without ever binding: its claim goes and b is released.
    for i in range(3):
        world.state.delete_pod("default", f"a-{i}")
    await world.settled()
    assert world.held_now() == set()


async def test_auto_gates_new_members_only_while_gangs_wait() -> None:
    """--hold-waiting-gangs=auto: a member created on an idle cluster goes straight to
    kube-scheduler; one created while a gang waits in line is held too."""
    world = World()
    assert not world.holds.gangs_wait()
    a = world.gang("a", 3, "2500m")
    await world.settled()
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    assert not world.holds.gangs_wait()  # a is admitted: nobody waits
    world.gang("b", 3, "2500m")
    await world.settled()
    assert world.held_now() == {"b-0", "b-1", "b-2"}
    assert world.holds.gangs_wait()
    for i in range(3):
        world.state.delete_pod("default", f"a-{i}")
    await world.settled()
    b = GroupSpec("default/b", 3)
    assert world.filter(b, "b-0").reason == FilterReason.CLAIMED
    assert not world.holds.gangs_wait()
    assert not World(hold=False).holds.gangs_wait()


async def test_the_sweep_releases_a_gang_short_of_members_after_the_grace() -> None:
    world = World()
    world.gang("short", 3, "1", created=2)
    await world.settled()
    assert world.held_now() == {"short-0", "short-1"}
    assert "default/short" not in world.arbiter.waiting
    world.holds.sweep()
    assert world.api.released == []
    world.clock.now += GRACE_SECONDS
    world.holds.sweep()
    await world.settled()
    # The filter says why now ("cannot find enough sibling pods").
    assert sorted(world.api.released) == ["short-0", "short-1"]


async def test_holding_off_releases_every_held_member() -> None:
    world = World(hold=False)
    world.gang("a", 3, "2500m")
    world.gang("b", 3, "2500m")
    assert not world.holds.enabled
    world.holds.sweep()
    await world.settled()
    assert world.held_now() == set()
    assert len(world.api.released) == 6


async def test_a_member_another_controller_gates_too_loses_only_our_gate() -> None:
    world = World()
    world.gang("k", 2, "1", gates=1)
    world.holds.sweep()
    await world.settled()
    assert sorted(world.api.released) == ["k-0", "k-1"]
    records = [world.state.pods[f"default/k-{i}"] for i in range(2)]
    assert all(r.gated and not r.held for r in records)


async def test_a_release_is_not_asked_again_at_once() -> None:
    world = World()
    api = world.api
    calls: list[str] = []

    async def lost(namespace: str, name: str, uid: str) -> None:
        calls.append(name)  # the patch failed to arrive: the pod stays held

    api.release_pod = lost  # type: ignore[method-assign]
    world.gang("a", 2, "1")
    await world.settled()
    assert sorted(calls) == ["a-0", "a-1"]
    world.holds.sweep()
    await asyncio.sleep(0)
    assert sorted(calls) == ["a-0", "a-1"]
    world.clock.now += 6
    world.holds.sweep()
    await world.settled()
    assert sorted(calls) == ["a-0", "a-0", "a-1", "a-1"]


async def test_the_sweep_passes_over_gangs_waiting_in_line_without_reading_them() -> None:
    world = World()
    a = world.gang("a", 3, "2500m")
    await world.settled()
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    for i in range(200):
        world.gang(f"w{i}", 3, "2500m")
    await world.settled()
    assert len(world.held_now()) == 600
    reads: list[str] = []
    members = world.state.members

    def counted(key: str) -> Any:
        reads.append(key)
        return members(key)

    world.state.members = counted  # type: ignore[method-assign,assignment]
    world.holds.sweep()
    # Only a, which holds a claim and whose members were released already, is looked at.
    assert set(reads) <= {"default/a"}, len(reads)


async def test_a_look_at_a_long_line_lets_the_event_loop_serve_others_between_slices() -> None:
    world = World()
    a = world.gang("a", 3, "2500m")
    await world.settled()
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    for i in range(1000):
        world.gang(f"w{i}", 3, "2500m")
    await world.settled()
    world.clock.now += 100  # every gang in line aged: the look walks all 1,000
    served = 0
    world.arbiter.on_nodes_changed()  # asks for a look

    async def verbs() -> None:
        """Stands for the verbs: counts how often it ran while the look was under way."""
        nonlocal served
        await eventually(lambda: world.arbiter.reconsidering)
        while world.arbiter.reconsidering:
            served += 1
            await asyncio.sleep(0)

    await verbs()
    assert served >= 1000 // SLICE, served
    await world.settled()
    # a's claim ran out meanwhile (it never bound): the first gang in line, and no other,
    # fits.
    assert world.held_now() == {f"w{i}-{m}" for i in range(1, 1000) for m in range(3)}


async def test_a_held_pod_whose_group_cannot_be_read_is_released_until_it_is() -> None:
    world = World()
    calls: list[str] = []

    async def lost(namespace: str, name: str, uid: str) -> None:
        calls.append(name)  # the patch did not arrive (a standby, an API error)

    world.api.release_pod = lost  # type: ignore[method-assign]
    raw = held(pod("bad-0", group="x"))
    raw["metadata"]["labels"] = {POD_GROUP_LABEL: ""}  # refused by the filter, with a message
    world.state.apply_pod(raw)
    assert world.state.pods["default/bad-0"].group is None
    await world.settled()
    assert calls == ["bad-0"]
    world.clock.now += 6
    world.holds.sweep()
    await world.settled()
    assert calls == ["bad-0", "bad-0"]


async def test_a_member_created_after_its_gang_runs_is_released_at_once() -> None:
    world = World()
    world.state.apply_podgroup(podgroup("r", 2))
    for i in range(2):
        world.state.apply_pod(pod(f"r-{i}", group="r", cpu="1", node=f"n{i}", phase="Running"))
    late = held(pod("r-2", group="r", cpu="1"))
    world.api.raw["r-2"] = late
    world.state.apply_pod(copy.deepcopy(late))
    await world.settled()
    assert world.api.released == ["r-2"] and "default/r" not in world.arbiter.waiting


async def test_a_held_gang_that_may_preempt_evicts_what_it_needs_and_is_then_released() -> None:
    """kube-scheduler never tries a held member, so its dry run never starts the gang's
    preemption: the sweep offers the gang to the planner, which evicts the fewest pods of
    lower priority; its members go once the plan lives."""
    world = World()
    deleted = world.preemption()
    for i in range(3):
        world.running(f"low-{i}", f"n{i}", "3", priority=100)
    world.gang("urgent", 3, "2500m", priority=1000)
    await world.settled()
    assert world.held_now() == {"urgent-0", "urgent-1", "urgent-2"}  # the line cannot admit it
    await world.holds.offer_preemptors()
    await world.settled()
    assert sorted(deleted) == ["default/low-0", "default/low-1", "default/low-2"]
    assert world.held_now() == set()


async def test_a_held_gang_that_cannot_fit_even_with_evictions_stays_held_and_evicts_none() -> None:
    world = World()
    deleted = world.preemption()
    world.running("low-0", "n0", "3", priority=100)
    world.running("same-1", "n1", "3", priority=1000)  # not of lower priority: stays
    world.running("same-2", "n2", "3", priority=1000)
    world.gang("urgent", 3, "2500m", priority=1000)
    await world.settled()
    for _ in range(3):
        await world.holds.offer_preemptors()
    await world.settled()
    assert deleted == []
    assert world.held_now() == {"urgent-0", "urgent-1", "urgent-2"}


async def test_a_held_gang_of_priority_zero_is_not_offered_to_the_planner() -> None:
    world = World()
    offered: list[str] = []

    async def preempting(key: str) -> bool:
        offered.append(key)
        return True

    world.holds.preempting = preempting
    world.running("low-0", "n0", "3", priority=0)
    world.gang("big", 3, "4")  # fits no node beside low-0 ... and priority 0 may not preempt
    world.gang("urgent", 3, "4", priority=1000)
    await world.settled()
    await world.holds.offer_preemptors()
    assert offered == ["default/urgent"]


async def test_the_webhook_gates_by_the_flag() -> None:
    """server.holding: true gates every member, auto while gangs wait, false none."""
    world = World()
    gang_only = ["--webhook-port", "9443"]
    auto = holding(settings(gang_only), world.holds)
    always = holding(settings([*gang_only, "--hold-waiting-gangs", "true"]), world.holds)
    never = holding(settings([*gang_only, "--hold-waiting-gangs", "false"]), world.holds)
    assert (auto(), always(), never()) == (False, True, False)
    world.gang("a", 3, "2500m")
    world.gang("b", 3, "2500m")
    await world.settled()
    assert (auto(), always(), never()) == (True, True, False)
    # Every-verb mode (no webhook) holds nothing.
    assert not holding(settings([]), world.holds)()
