import asyncio
import dataclasses

import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission, FilterReason, wholeness
from app.core.groups import VOLCANO_API, VOLCANO_GROUP_ANNOTATIONS, GroupSpec
from app.core.state import ClusterState
from app.kube.errors import Conflict
from app.runtime.gate import PermitGate
from app.runtime.gate_settings import GateLinks, GatePolicy
from app.runtime.waiting_room import GateError
from tests.unit.builders import cluster, node, pod
from tests.unit.fakes import RecordingBinder, gauge


def setup(
    members: int, min_member: int
) -> tuple[ClusterState, Admission, RecordingBinder, PermitGate, Metrics, GroupSpec]:
    state = cluster(members)
    admission = Admission(3)
    binder = RecordingBinder()
    metrics = Metrics()
    gate = PermitGate(state, admission, binder, metrics)
    state.add_pod_listener(gate.on_pod_change)
    return state, admission, binder, gate, metrics, GroupSpec("default/g", min_member)


async def test_members_wait_until_min_member_then_all_bind() -> None:
    state, _, binder, gate, metrics, spec = setup(3, 3)
    first = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    second = asyncio.create_task(gate.admit(state.pods["default/p1"], "n2", spec, 30))
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done()
    assert binder.bound == []
    assert gauge(metrics, "gang_extender_gate_waiting_pods") == 2
    # Reserved members hold their resources in our view of the cluster.
    assert state.free_resources()["cpu"] == 8000 - 2000

    await gate.admit(state.pods["default/p2"], "n1", spec, 30)
    await asyncio.gather(first, second)
    assert sorted(binder.bound) == [("p0", "n1"), ("p1", "n2"), ("p2", "n1")]
    assert all(state.pods[f"default/p{i}"].node_name for i in range(3))
    assert gauge(metrics, "gang_extender_gate_waiting_pods") == 0
    assert gauge(metrics, "gang_extender_gang_admissions_total", {"result": "admitted"}) == 1


async def test_timeout_releases_every_waiter_and_denies_the_group() -> None:
    state, admission, binder, gate, metrics, spec = setup(3, 3)
    waits = [
        asyncio.create_task(gate.admit(state.pods[f"default/p{i}"], "n1", spec, 0.05 + i / 100))
        for i in range(2)
    ]
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(r, GateError) for r in results)
    assert "timed out after waiting 0.05s" in str(results[0])
    assert "2 of minMember 3" in str(results[1])
    assert binder.bound == []
    assert state.free_resources()["cpu"] == 8000  # reservations dropped
    assert admission.check(spec, wholeness(spec, 3), dict).reason == FilterReason.DENIED
    assert gauge(metrics, "gang_extender_gang_admissions_total", {"result": "timeout"}) == 1
    assert gate.waiting("default/g") == []


async def test_deleted_waiter_is_released_and_no_longer_counts() -> None:
    state, _, binder, gate, _, spec = setup(3, 3)
    a = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    b = asyncio.create_task(gate.admit(state.pods["default/p1"], "n1", spec, 30))
    await asyncio.sleep(0.01)
    state.delete_pod("default", "p1")
    with pytest.raises(GateError, match="was deleted while waiting"):
        await b
    # p2 arrives: only 2 of 3 are present now, so nobody is bound.
    c = asyncio.create_task(gate.admit(state.pods["default/p2"], "n2", spec, 30))
    await asyncio.sleep(0.01)
    assert binder.bound == []
    assert not a.done() and not c.done()
    state.apply_pod(pod("p3", group="g"))
    await gate.admit(state.pods["default/p3"], "n2", spec, 30)
    await asyncio.gather(a, c)
    assert sorted(n for n, _ in binder.bound) == ["p0", "p2", "p3"]


async def test_pod_bound_by_someone_else_is_released() -> None:
    state, _, _, gate, _, spec = setup(2, 2)
    a = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    await asyncio.sleep(0.01)
    state.apply_pod(pod("p0", group="g", node="n2"))
    with pytest.raises(GateError, match="bound to n2 by someone else"):
        await a


async def test_members_bound_earlier_count_toward_min_member() -> None:
    """The seed's bug: count what is bound and reserved, not only this wave."""
    state, _, binder, gate, _, spec = setup(3, 3)
    state.apply_pod(pod("p0", group="g", node="n1"))
    state.apply_pod(pod("p1", group="g", node="n2"))
    await gate.admit(state.pods["default/p2"], "n1", spec, 30)
    assert binder.bound == [("p2", "n1")]


async def test_a_sibling_binding_seen_later_opens_the_gate() -> None:
    state, _, binder, gate, _, spec = setup(2, 2)
    a = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    await asyncio.sleep(0.01)
    state.apply_pod(pod("p1", group="g", node="n2"))  # bound by an earlier wave, seen now
    await asyncio.wait_for(a, 1)
    assert binder.bound == [("p0", "n1")]


async def test_binding_failure_after_admission_is_reported_per_pod() -> None:
    state, _, binder, gate, metrics, spec = setup(2, 2)
    binder.fail["p1"] = Conflict("API server answered 409: already assigned")
    a = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    with pytest.raises(GateError, match="binding pod default/p1 to n2 failed"):
        await gate.admit(state.pods["default/p1"], "n2", spec, 30)
    await a
    assert binder.bound == [("p0", "n1")]
    assert state.pods["default/p1"].placed_node == ""
    assert gauge(metrics, "gang_extender_bind_errors_total", {"reason": "conflict"}) == 1


async def test_member_arriving_while_a_wave_binds_joins_without_waiting() -> None:
    state, _, binder, gate, _, spec = setup(3, 2)
    binder.hold = asyncio.Event()
    a = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    b = asyncio.create_task(gate.admit(state.pods["default/p1"], "n1", spec, 30))
    await asyncio.sleep(0.01)
    late = asyncio.create_task(gate.admit(state.pods["default/p2"], "n2", spec, 30))
    await asyncio.sleep(0.01)
    binder.hold.set()
    await asyncio.wait_for(asyncio.gather(a, b, late), 1)
    assert sorted(n for n, _ in binder.bound) == ["p0", "p1", "p2"]


async def test_many_concurrent_groups_do_not_interfere() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1", cpu="1000", pods="1000")])
    binder = RecordingBinder()
    gate = PermitGate(state, Admission(3), binder, Metrics())
    state.add_pod_listener(gate.on_pod_change)
    calls = []
    for g in range(20):
        for m in range(4):
            state.apply_pod(pod(f"g{g}-{m}", group=f"g{g}"))
            spec = GroupSpec(f"default/g{g}", 4)
            calls.append(gate.admit(state.pods[f"default/g{g}-{m}"], "n1", spec, 5))
    await asyncio.wait_for(asyncio.gather(*calls), 2)
    assert len(binder.bound) == 80


async def test_release_all_answers_every_waiter() -> None:
    state, _, _, gate, _, spec = setup(3, 3)
    a = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    await asyncio.sleep(0.01)
    gate.release_all("shutting down")
    with pytest.raises(GateError, match="shutting down"):
        await a
    assert state.free_resources()["cpu"] == 8000


class Victims(set[str]):
    """The preempt verb's victims, as the gate asks for them (app/runtime/preemption/plans.py)."""

    def is_victim(self, uid: str) -> bool:
        return uid in self


async def victim_in_gate(
    members: int, min_member: int, hold_seconds: float = 30
) -> tuple[ClusterState, PermitGate, Metrics, GroupSpec, asyncio.Task[None]]:
    """p0 waits in the gate and the preempt verb has just named it a victim."""
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])
    for i in range(members):
        state.apply_pod(pod(f"p{i}", group="g"))
    metrics = Metrics()
    victims = Victims()
    gate = PermitGate(
        state,
        Admission(3),
        RecordingBinder(),
        metrics,
        GateLinks(victims=victims),
        GatePolicy(victim_hold_seconds=hold_seconds, victim_answer_delay_seconds=0.05),
    )
    state.add_pod_listener(gate.on_pod_change)
    spec = GroupSpec("default/g", min_member)
    held = asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30))
    await asyncio.sleep(0.01)
    victims.add(state.pods["default/p0"].uid)
    return state, gate, metrics, spec, held


async def test_released_preemption_victim_is_answered_after_its_deletion() -> None:
    # kube-scheduler retries the preemptor only when the deleted victim is still assumed.
    state, gate, metrics, spec, held = await victim_in_gate(3, 3)
    other = asyncio.create_task(gate.admit(state.pods["default/p1"], "n1", spec, 30))
    await asyncio.sleep(0.01)
    released = gate.release_group(spec.key, "gang released")
    assert sorted(m.name for m in released) == ["p0", "p1"]
    with pytest.raises(GateError, match="gang released"):
        await other
    await asyncio.sleep(0.1)
    assert not held.done()  # still assumed by kube-scheduler, never bound
    assert gate.waiting(spec.key) == []
    state.delete_pod("default", "p0")
    await asyncio.sleep(0.01)
    assert not held.done()
    with pytest.raises(GateError, match="gang released"):
        await asyncio.wait_for(held, 1)
    assert gauge(metrics, "gang_extender_gate_waiting_pods") == 0


async def test_victim_that_is_not_deleted_is_answered_when_the_hold_runs_out() -> None:
    state, gate, _, spec, held = await victim_in_gate(2, 2, hold_seconds=0.3)
    gate.release_group(spec.key, "gang released")
    await asyncio.sleep(0.1)
    assert not held.done()
    with pytest.raises(GateError, match="gang released"):
        await asyncio.wait_for(held, 1)
    assert state.free_resources()["cpu"] == 8000


async def test_waiting_victim_deleted_is_answered_a_moment_later_and_never_counts() -> None:
    state, gate, _, spec, held = await victim_in_gate(3, 2)
    state.delete_pod("default", "p0")
    await asyncio.sleep(0.01)
    assert not held.done() and gate.waiting(spec.key) == []
    with pytest.raises(GateError, match="was deleted while waiting"):
        await asyncio.wait_for(held, 1)


async def test_shutdown_answers_held_victims_at_once() -> None:
    _, gate, _, spec, held = await victim_in_gate(2, 2)
    gate.release_group(spec.key, "gang released")
    gate.release_all("shutting down")
    with pytest.raises(GateError, match="shutting down"):
        await asyncio.wait_for(held, 0.05)


async def test_a_gang_of_sub_groups_is_never_bound_with_a_sub_group_below_its_minimum() -> None:
    """Volcano minMember 2, below its sub-groups' total (two of 2 each): the gate counts each
    sub-group too. Two members of sub-group worker-0 are minMember, yet worker-1 has none:
    nobody is bound until worker-1 has its two; a timeout names the sub-group short."""
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])
    state.apply_podgroup(
        {
            "apiVersion": VOLCANO_API.api_version,
            "kind": VOLCANO_API.kind,
            "metadata": {"name": "big", "namespace": "default", "uid": "pg-big"},
            "spec": {
                "minMember": 2,
                "subGroupPolicy": [
                    {
                        "name": "worker",
                        "subGroupSize": 2,
                        "minSubGroups": 2,
                        "matchLabelKeys": ["volcano.sh/partition-id"],
                    }
                ],
            },
        },
        VOLCANO_API.source,
    )
    for i in range(4):
        raw = pod(f"w{i}", cpu="100m")
        raw["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "big"}
        raw["metadata"]["labels"]["volcano.sh/partition-id"] = str(i // 2)
        state.apply_pod(raw)
    ref = state.pods["default/w0"].group
    assert ref is not None
    # The source raises minMember to the sub-groups' total; the gate must not rely on it.
    spec = dataclasses.replace(state.group_spec(ref), min_member=2)
    binder = RecordingBinder()
    gate = PermitGate(state, Admission(3), binder, Metrics())
    state.add_pod_listener(gate.on_pod_change)
    first = [
        asyncio.create_task(gate.admit(state.pods[f"default/w{i}"], "n1", spec, 30))
        for i in range(2)
    ]
    await asyncio.sleep(0.05)
    assert binder.bound == []  # minMember 2 is met, but not sub-group worker-1's 2
    third = asyncio.create_task(gate.admit(state.pods["default/w2"], "n2", spec, 30))
    await asyncio.sleep(0.05)
    assert binder.bound == []
    await gate.admit(state.pods["default/w3"], "n2", spec, 30)
    await asyncio.wait_for(asyncio.gather(*first, third), 1)
    assert sorted(n for n, _ in binder.bound) == ["w0", "w1", "w2", "w3"]

    # A timeout says which sub-group was short.
    for i in range(4):
        state.apply_pod(pod(f"w{i}", group="x"))  # out of the gang
    for i in range(4, 6):
        raw = pod(f"w{i}", cpu="100m")
        raw["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "big"}
        raw["metadata"]["labels"]["volcano.sh/partition-id"] = "0"
        state.apply_pod(raw)
    for i in range(6, 8):
        raw = pod(f"w{i}", cpu="100m")
        raw["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "big"}
        raw["metadata"]["labels"]["volcano.sh/partition-id"] = "1"
        state.apply_pod(raw)
    waits = [
        asyncio.create_task(gate.admit(state.pods[f"default/w{i}"], "n1", spec, 0.05))
        for i in range(4, 6)
    ]
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(r, GateError) for r in results), results
    assert "sub-groups short: sub-group worker-1: 0 of 2" in str(results[0])
