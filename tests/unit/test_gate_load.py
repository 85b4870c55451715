"""2,000 members waiting in the gate at once hold no thread and little memory (fault 5).

The filter latency under that load is a benchmark figure (bench/run.py,
BENCHMARKS.md), not a timed test; here the bounds that do not depend on the
machine: no thread per waiter, memory per waiter, and every waiter answered.
"""

from __future__ import annotations

import asyncio
import threading
import tracemalloc

import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission
from app.core.groups import GroupSpec
from app.core.state import ClusterState
from app.runtime import waiting_room
from app.runtime.gate import PermitGate
from app.runtime.waiting_room import GateError
from tests.unit.builders import node, pod
from tests.unit.fakes import RecordingBinder

WAITERS = 2000


async def test_two_thousand_waiters_hold_no_thread_and_are_all_answered() -> None:
    state = ClusterState()
    state.replace_nodes([node(f"n{i}", cpu="1000", pods="1000") for i in range(10)])
    for i in range(WAITERS):
        state.apply_pod(pod(f"w{i}", group="big"))
    gate = PermitGate(state, Admission(3), RecordingBinder(), Metrics())
    state.add_pod_listener(gate.on_pod_change)
    spec = GroupSpec("default/big", WAITERS + 1)
    threads = threading.active_count()
    tracemalloc.start()
    try:
        waits = [
            asyncio.create_task(gate.admit(state.pods[f"default/w{i}"], f"n{i % 10}", spec, 60))
            for i in range(WAITERS)
        ]
        await asyncio.sleep(0.1)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(gate.waiting("default/big")) == WAITERS
    assert threading.active_count() == threads, "a waiter must not hold a thread"
    # Task, future, timer and gate record: a few KB each, not a stack per waiter.
    assert held / WAITERS < 8 * 1024, f"{held / WAITERS:.0f} bytes per waiter"
    gate.release_all("test over")
    results = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 5)
    assert all(isinstance(r, GateError) for r in results)
    assert state.free_resources()["cpu"] == 10 * 1000 * 1000


async def test_filling_the_gate_opens_it_once_for_everyone() -> None:
    """Whatever the order of arrival, a 2,000-member gang is bound in one admission."""
    state = ClusterState()
    state.replace_nodes([node("n1", cpu="100000", pods="10000")])
    for i in range(WAITERS):
        state.apply_pod(pod(f"w{i}", group="big", cpu="10m"))
    binder = RecordingBinder()
    metrics = Metrics()
    gate = PermitGate(state, Admission(3), binder, metrics)
    state.add_pod_listener(gate.on_pod_change)
    spec = GroupSpec("default/big", WAITERS)
    waits = []
    for i in range(WAITERS):
        waits.append(asyncio.create_task(gate.admit(state.pods[f"default/w{i}"], "n1", spec, 60)))
        await asyncio.sleep(0)  # each member arrives on its own turn of the loop
    await asyncio.wait_for(asyncio.gather(*waits), 10)
    assert len(binder.bound) == WAITERS
    admitted = metrics.registry.get_sample_value(
        "gang_extender_gang_admissions_total", {"result": "admitted"}
    )
    assert admitted == 1


async def test_a_members_arrival_costs_no_pass_over_its_gang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each arrival asks the gate whether the gang is whole: reading the gang's tree (a
    pass over every member) then would make 2,000 arrivals cost 2,000 x 2,000 (they once
    took over 60 s under load, and the gate's wait ran out before the gang was whole)."""
    reads: list[str] = []

    def counted(state: ClusterState, spec: GroupSpec, pod: object = None) -> None:
        reads.append(spec.key)

    monkeypatch.setattr(waiting_room, "gang_tree", counted)
    state = ClusterState()
    state.replace_nodes([node("n1", cpu="100000", pods="10000")])
    for i in range(200):
        state.apply_pod(pod(f"w{i}", group="big", cpu="10m"))
    binder = RecordingBinder()
    gate = PermitGate(state, Admission(3), binder, Metrics())
    state.add_pod_listener(gate.on_pod_change)
    spec = GroupSpec("default/big", 200)
    waits = []
    for i in range(200):
        waits.append(asyncio.create_task(gate.admit(state.pods[f"default/w{i}"], "n1", spec, 60)))
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*waits), 10)
    assert len(binder.bound) == 200
    assert len(reads) <= 3, f"the gang's tree was read {len(reads)} times for 200 arrivals"
