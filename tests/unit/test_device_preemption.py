"""Preemption for gangs short of DRA devices (app/runtime/preemption/devices.py).

kube-scheduler starts none for them; the extender asks the gang's plan of the
one owner of preemption and deletes the victims it names.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.base.metrics import Metrics
from app.core.admission import Admission
from app.core.observer import NullObserver
from app.core.preemption.victims import VictimPolicy
from app.core.state import ClusterState
from app.runtime.device_cel import CelEngine
from app.runtime.preemption import devices as device_preemption
from app.runtime.preemption.devices import DRA_UNSCHEDULABLE, DevicePreemption
from app.runtime.preemption.plans import PreemptionPlans
from tests.unit.builders import node, podgroup
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


def cluster() -> tuple[ClusterState, DevicePreemption, Deleted]:
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
    preemption = DevicePreemption(
        state, Admission(3), plans, deleted, NullObserver(), VictimPolicy.PROTECT
    )
    state.add_pod_listener(preemption.on_pod_change)
    return state, preemption, deleted


def test_a_gang_short_of_devices_evicts_the_fewest_lower_priority_holders(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(device_preemption, "SETTLE_SECONDS", 0)
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
    monkeypatch.setattr(device_preemption, "SETTLE_SECONDS", 0)
    state, preemption, deleted = cluster()

    async def run() -> None:
        state.apply_pod(waiting("urgent-0"))  # one of minMember 2
        await preemption.drain()
        state.apply_pod(waiting("urgent-1", "0/4 nodes are available: 4 Insufficient cpu."))
        await preemption.drain()

    asyncio.run(run())
    assert deleted.pods == []
    assert preemption.victims("default/urgent") != []  # once whole, it would preempt
