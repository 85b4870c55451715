"""Gangs made of groups through the filter verb: the real extender, arbiter and gate, in memory."""

from __future__ import annotations

import json
from typing import Any

from app.core.admission import FilterReason
from app.core.groups import (
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_COUNT_ANNOTATION,
    VOLCANO_API,
    VOLCANO_GROUP_ANNOTATIONS,
    VOLCANO_TASK_ANNOTATION,
)
from app.core.state import ClusterState
from app.core.topology.domains import HOSTNAME, ZONE
from app.core.topology.sources import (
    KUEUE_POD_INDEX,
    KUEUE_SLICE_CONSTRAINTS,
    KUEUE_SLICE_REQUIRED,
    KUEUE_SLICE_SIZE,
)
from app.web.wire import ExtenderArgs
from tests.unit.builders import node, pod
from tests.unit.fakes import ExtenderOnState

RACK = "example.com/rack"


class World:
    """Racks r0 and r1 of four 1-CPU nodes each (nodes r0-0 .. r1-3)."""

    def __init__(self, every_gang: bool = False, racks: int = 2, per_rack: int = 4) -> None:
        self.state = ClusterState()
        self.nodes = [f"r{r}-{n}" for r in range(racks) for n in range(per_rack)]
        raws = []
        for name in self.nodes:
            raw = node(name, cpu="1")
            raw["metadata"]["labels"][RACK] = name.split("-")[0]
            raws.append(raw)
        self.state.replace_nodes(raws)
        on = ExtenderOnState(
            self.state, (HOSTNAME, RACK, ZONE), every_gang=every_gang, pick_member_node=False
        )
        self.metrics, self.arbiter, self.extender = on.metrics, on.arbiter, on.extender

    def filter(self, raw: dict[str, Any]) -> dict[str, Any]:
        return self.extender.filter(ExtenderArgs(raw, list(self.nodes), None))


def kueue_member(i: int, count: int, annotations: dict[str, str]) -> dict[str, Any]:
    raw = pod(f"train-{i}", cpu="1", memory="100Mi")
    raw["metadata"]["labels"] |= {KUEUE_GROUP_LABEL: "train", KUEUE_POD_INDEX: str(i)}
    raw["metadata"]["annotations"] = {KUEUE_TOTAL_COUNT_ANNOTATION: str(count), **annotations}
    return raw


SLICES_OF_3 = {KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "3"}


def test_each_kueue_slice_is_held_to_its_own_rack_and_debug_shows_where() -> None:
    world = World()
    members = [kueue_member(i, 6, SLICES_OF_3) for i in range(6)]
    for raw in members:
        world.state.apply_pod(raw)
    racks: dict[int, set[str]] = {}
    for i, raw in enumerate(members):
        result = world.filter(raw)
        passed = result["NodeNames"]
        assert passed, result
        racks[i] = {name.split("-")[0] for name in passed}
        assert len(racks[i]) == 1
        outside = result["FailedAndUnresolvableNodes"]
        assert set(outside) == set(world.nodes) - set(passed)
        assert all("slice" not in m or "rack" in m for m in outside.values())
    assert racks[0] == racks[1] == racks[2]
    assert racks[3] == racks[4] == racks[5]
    assert racks[0] != racks[3]
    (claim,) = world.arbiter.snapshot()["claims"]
    assert [g["path"] for g in claim["subGroups"]] == ["rack-0", "rack-1"]
    assert {g["domain"]["value"] for g in claim["subGroups"]} == {"r0", "r1"}
    assert (
        "annotation kueue.x-k8s.io/podset-slice-required-topology"
        in (claim["subGroups"][0]["constraint"])
    )
    assert claim["subGroups"][0]["members"] == [f"default/train-{i}" for i in range(3)]
    assert claim["subGroups"][1]["minMember"] == 3


def test_no_rack_holding_a_slice_turns_every_member_away_naming_the_slice() -> None:
    world = World(per_rack=2)
    members = [kueue_member(i, 6, SLICES_OF_3) for i in range(6)]
    for raw in members:
        world.state.apply_pod(raw)
    result = world.filter(members[0])
    assert result["NodeNames"] == []
    (message,) = set(result["FailedAndUnresolvableNodes"].values())
    assert "gang kueue:default/train needs slice rack-" in message, message
    assert "whole in one rack" in message
    assert world.arbiter.claims == {}


def test_a_slice_larger_than_the_gang_holds_it_with_the_rule_named() -> None:
    world = World()
    annotations = {KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "8"}
    members = [kueue_member(i, 6, annotations) for i in range(6)]
    for raw in members:
        world.state.apply_pod(raw)
    result = world.filter(members[0])
    assert result["NodeNames"] == []
    (message,) = set(result["FailedAndUnresolvableNodes"].values())
    assert "the slice size must be at most the gang's size" in message
    assert world.metrics.filter_decisions.labels(FilterReason.BAD_GROUP)._value.get() == 1


def test_malformed_slice_json_turns_the_member_away_with_the_fix() -> None:
    world = World()
    raw = kueue_member(0, 6, {KUEUE_SLICE_CONSTRAINTS: '[{"topology": '})
    world.state.apply_pod(raw)
    result = world.filter(raw)
    assert result["NodeNames"] == []
    (message,) = set(result["FailedAndUnresolvableNodes"].values())
    assert "is not valid JSON" in message and "write a list like" in message


def test_nested_slices_from_the_json_list_land_in_their_racks() -> None:
    world = World(racks=4, per_rack=2)
    # Blocks: r0 and r1 in b0, r2 and r3 in b1.
    for record in world.state.nodes.values():
        record.labels["example.com/block"] = "b0" if record.name[1] in "01" else "b1"
    listed = json.dumps(
        [{"topology": "example.com/block", "size": 4}, {"topology": RACK, "size": 2}]
    )
    members = [kueue_member(i, 8, {KUEUE_SLICE_CONSTRAINTS: listed}) for i in range(8)]
    for raw in members:
        world.state.apply_pod(raw)
    seen: dict[int, str] = {}
    for i, raw in enumerate(members):
        passed = world.filter(raw)["NodeNames"]
        (rack,) = {name.split("-")[0] for name in passed}
        seen[i] = rack
    for pair in range(4):
        assert seen[2 * pair] == seen[2 * pair + 1]
    block = {"r0": "b0", "r1": "b0", "r2": "b1", "r3": "b1"}
    assert len({block[seen[i]] for i in range(4)}) == 1
    assert len({block[seen[i]] for i in range(4, 8)}) == 1


def volcano_member(name: str, task: str, cpu: str) -> dict[str, Any]:
    raw = pod(name, cpu=cpu, memory="100Mi")
    raw["metadata"]["annotations"] = {
        VOLCANO_GROUP_ANNOTATIONS[0]: "big",
        VOLCANO_TASK_ANNOTATION: task,
    }
    return raw


def test_a_role_that_fits_no_node_holds_the_gang_and_every_member_hears_the_role() -> None:
    world = World(every_gang=True)
    world.state.apply_podgroup(
        {
            "apiVersion": VOLCANO_API.api_version,
            "kind": VOLCANO_API.kind,
            "metadata": {"name": "big", "namespace": "default", "uid": "pg-big"},
            "spec": {"minMember": 3, "minTaskMember": {"head": 1, "worker": 2}},
        },
        VOLCANO_API.source,
    )
    members = [
        volcano_member("big-head", "head", "2"),
        volcano_member("big-w0", "worker", "1"),
        volcano_member("big-w1", "worker", "1"),
    ]
    for raw in members:
        world.state.apply_pod(raw)
    for raw in members:
        result = world.filter(raw)
        assert result["NodeNames"] == []
        (message,) = set(result["FailedAndUnresolvableNodes"].values())
        assert message == (
            "gang volcano:default/big waits: role head needs cpu 2, memory 100Mi on one node; "
            "the largest free is cpu 1, memory 8Gi"
        )
    assert world.arbiter.claims == {}


def test_each_volcano_sub_group_is_held_to_its_own_rack() -> None:
    world = World()
    policy = {
        "name": "worker",
        "subGroupSize": 3,
        "minSubGroups": 2,
        "matchLabelKeys": ["volcano.sh/partition-id"],
        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
    }
    world.state.apply_podgroup(
        {
            "apiVersion": VOLCANO_API.api_version,
            "kind": VOLCANO_API.kind,
            "metadata": {"name": "big", "namespace": "default", "uid": "pg-big"},
            "spec": {"minMember": 6, "subGroupPolicy": [policy]},
        },
        VOLCANO_API.source,
    )
    members = []
    for i in range(6):
        raw = volcano_member(f"big-{i}", "worker", "1")
        raw["metadata"]["labels"]["volcano.sh/partition-id"] = str(i // 3)
        members.append(raw)
        world.state.apply_pod(raw)
    seen = []
    for raw in members:
        passed = world.filter(raw)["NodeNames"]
        (rack,) = {name.split("-")[0] for name in passed}
        seen.append(rack)
    assert seen[0] == seen[1] == seen[2] != seen[3] == seen[4] == seen[5]
    (claim,) = world.arbiter.snapshot()["claims"]
    assert [g["path"] for g in claim["subGroups"]] == ["worker-0", "worker-1"]
    assert "network tier 1" in claim["subGroups"][0]["constraint"]
