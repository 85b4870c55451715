"""The TopologyPlaced condition: the domain and level a scheduled gang is in, on its PodGroup."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.metrics import Metrics
from app.core.groups import SOURCE_XK8S
from app.core.state import ClusterState
from app.core.status import (
    RUNNING,
    GroupStatus,
    TopologyPlacement,
    VolcanoShape,
    XK8sShape,
    status_patch,
)
from app.core.topology.domains import HOSTNAME, ZONE
from app.core.topology.sources import KUEUE_REQUIRED
from app.ops.status_reconciler import PodGroupStatus, StatusSettings
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock
from tests.unit.test_status import MemoryStatusApi, podgroup_object, settle

RACK = "example.com/rack"
NOW = "2026-01-01T00:00:09Z"
PLACED = TopologyPlacement(True, "gang default/g is placed in rack r1 (...)")


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.parametrize("shape", [XK8sShape(), VolcanoShape()])
def test_a_scheduled_gang_shows_its_domain_next_to_scheduled(shape: Any) -> None:
    status = GroupStatus(RUNNING, scheduled=3, running=3, topology=PLACED)
    rendered = conditions(shape.render(status, {}, NOW))
    assert rendered["TopologyPlaced"] == {
        "type": "TopologyPlaced",
        "status": "True",
        "reason": "InOneDomain",
        "message": PLACED.message,
        "lastTransitionTime": NOW,
    }
    assert rendered.keys() == {"Scheduled", "TopologyPlaced"}
    # Written once; the same placement later patches nothing.
    current = podgroup_object(shape.render(status, {}, NOW))
    assert status_patch(current, status, shape, now="2026-01-01T00:01:00Z") is None
    # A gang without a constraint has no such condition.
    plain = conditions(shape.render(GroupStatus(RUNNING, scheduled=3, running=3), {}, NOW))
    assert "TopologyPlaced" not in plain


def rack_node(name: str, rack: str) -> dict[str, Any]:
    raw = node(name)
    raw["metadata"]["labels"].update({RACK: rack, ZONE: "z0"})
    return raw


async def test_the_reconciler_writes_the_rack_the_bound_members_share() -> None:
    state = ClusterState()
    state.replace_nodes([rack_node("a1", "r1"), rack_node("a2", "r1"), rack_node("b1", "r2")])
    group = podgroup("g", 2)
    group["metadata"]["annotations"] = {KUEUE_REQUIRED: RACK}
    state.apply_podgroup(group)
    api = MemoryStatusApi(podgroup_object())
    clock = Clock()
    writer = PodGroupStatus(
        state,
        {SOURCE_XK8S: api},
        Metrics(),
        clock=clock,
        settings=StatusSettings(levels=(HOSTNAME, RACK, ZONE)),
    )
    state.add_pod_listener(writer.on_pod_change)
    state.apply_pod(pod("p0", group="g", node="a1", phase="Running"))
    await settle(writer)
    assert api.obj is not None
    assert "TopologyPlaced" not in conditions(api.obj["status"])  # not scheduled yet
    state.apply_pod(pod("p1", group="g", node="a2", phase="Running"))
    clock.now += 2  # past the minimum interval between writes
    await settle(writer)
    placed = conditions(api.obj["status"])["TopologyPlaced"]
    assert placed["status"] == "True" and placed["reason"] == "InOneDomain"
    assert placed["message"] == (
        "gang default/g is placed in rack r1 (rack = node label example.com/rack), required "
        f"by topology key {RACK} (annotation {KUEUE_REQUIRED} on the PodGroup)"
    )
