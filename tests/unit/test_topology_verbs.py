"""Topology-aware gangs through the filter verb: the real extender, arbiter and gate, in memory."""

from __future__ import annotations

from typing import Any

from app.core.groups import SOURCE_VOLCANO, VOLCANO_GROUP_ANNOTATIONS
from app.core.state import ClusterState
from app.core.topology.domains import HOSTNAME, ZONE
from app.core.topology.sources import KUEUE_REQUIRED
from app.web.wire import ExtenderArgs
from tests.unit.builders import node, pod
from tests.unit.fakes import ExtenderOnState

RACK = "example.com/rack"
NODES = ("a1", "a2", "b1", "b2")


class World:
    """Racks a (a1, a2) and b (b1, b2) of two 4-CPU nodes; a1 runs a 2-CPU pod."""

    def __init__(self, every_gang: bool = True, pick_member_node: bool = False) -> None:
        """every_gang: --gang-feasibility. pick_member_node: --member-node-choice=extender.

        Off by default here: these tests are about the nodes a domain lets
        through, which the pick would narrow to one.
        """
        self.state = ClusterState()
        nodes = []
        for name in NODES:
            raw = node(name)
            raw["metadata"]["labels"][RACK] = name[0]
            nodes.append(raw)
        self.state.replace_nodes(nodes)
        self.state.apply_pod(pod("busy", cpu="2", node="a1", phase="Running"))
        on = ExtenderOnState(
            self.state,
            (HOSTNAME, RACK, ZONE),
            every_gang=every_gang,
            pick_member_node=pick_member_node,
        )
        self.metrics, self.arbiter, self.extender = on.metrics, on.arbiter, on.extender

    def member(self, name: str, node_name: str = "") -> dict[str, Any]:
        raw = pod(name, light=("train", "2"), cpu="2", node=node_name)
        raw["metadata"]["annotations"] = {KUEUE_REQUIRED: RACK}
        if node_name:
            raw["status"]["phase"] = "Running"
        return raw

    def filter(self, raw: dict[str, Any]) -> dict[str, Any]:
        return self.extender.filter(ExtenderArgs(raw, list(NODES), None))


def test_the_gang_is_held_to_the_fullest_rack_and_other_nodes_are_unresolvable() -> None:
    world = World()
    for i in range(2):
        world.state.apply_pod(world.member(f"train-{i}"))
    result = world.filter(world.member("train-0"))
    assert result["NodeNames"] == ["a1", "a2"]
    assert result["FailedNodes"] == {}
    assert result["FailedAndUnresolvableNodes"] == {
        name: (
            "gang default/train is placed in rack a, required by topology key example.com/rack "
            "(annotation kueue.x-k8s.io/podset-required-topology on the pod); this node is in "
            "rack b"
        )
        for name in ("b1", "b2")
    }
    # The second member is held to the same rack while the claim lives.
    assert world.filter(world.member("train-1"))["NodeNames"] == ["a1", "a2"]
    assert world.arbiter.snapshot()["claims"][0]["domain"] == {"level": RACK, "value": "a"}
    assert world.metrics.topology_placements.labels(RACK)._value.get() == 1


def test_a_member_is_given_the_fullest_node_of_its_rack_when_the_extender_picks() -> None:
    world = World(pick_member_node=True)
    for i in range(2):
        world.state.apply_pod(world.member(f"train-{i}"))
    result = world.filter(world.member("train-0"))
    # a1 already runs 2 of its 4 CPUs: binpack ranks it above a2; rack b stays unresolvable.
    assert result["NodeNames"] == ["a1"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"b1", "b2"}


def test_a_restarted_member_follows_its_bound_sibling_to_the_emptier_rack() -> None:
    world = World()
    world.state.apply_pod(world.member("train-0", node_name="b1"))
    world.state.apply_pod(world.member("train-1"))
    result = world.filter(world.member("train-1"))
    assert result["NodeNames"] == ["b1", "b2"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"a1", "a2"}


def test_a_gang_no_rack_can_hold_is_turned_away_everywhere_with_the_level_named() -> None:
    world = World()
    for i in range(2):
        raw = world.member(f"train-{i}")
        raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "5"
        world.state.apply_pod(raw)
    result = world.filter(raw)
    assert result["NodeNames"] == []
    messages = set(result["FailedAndUnresolvableNodes"].values())
    assert len(messages) == 1 and set(result["FailedAndUnresolvableNodes"]) == set(NODES)
    (message,) = messages
    assert message.startswith(
        "gang default/train needs its 2 missing member(s) (cpu 10, memory 2Gi, pods 2) in one "
        "rack (required by topology key example.com/rack"
    )
    assert "default/train" not in world.arbiter.claims


def test_a_gang_no_rack_can_hold_takes_no_room_from_the_gangs_behind_it() -> None:
    """Gang x (3 x 3 CPUs, required rack) fits the cluster (a2, b1, b2) but no rack: it waits
    in line without counting as holding that room, so gang y (2 x 2 CPUs) is admitted."""
    world = World()
    for i in range(3):
        raw = pod(f"x-{i}", light=("x", "3"), cpu="3")
        raw["metadata"]["annotations"] = {KUEUE_REQUIRED: RACK}
        raw["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"  # x is ahead in line
        world.state.apply_pod(raw)
    turned_away = world.filter(raw)
    assert turned_away["NodeNames"] == [] and "default/x" in world.arbiter.waiting
    for i in range(2):
        raw = pod(f"y-{i}", light=("y", "2"), cpu="2")
        raw["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
        world.state.apply_pod(raw)
    admitted = world.filter(raw)
    assert admitted["NodeNames"] == list(NODES)
    assert "default/y" in world.arbiter.claims


def test_without_gang_feasibility_a_topology_gang_is_still_placed_in_one_rack() -> None:
    """--gang-feasibility=false: a gang with a required rack is still placed as a whole in
    one rack (or turned away naming the level); a gang without one goes member by member."""
    world = World(every_gang=False)
    for i in range(2):
        world.state.apply_pod(world.member(f"train-{i}"))
    held = world.filter(world.member("train-0"))
    assert held["NodeNames"] == ["a1", "a2"] and "default/train" in world.arbiter.claims
    too_big = World(every_gang=False)
    for i in range(2):
        raw = too_big.member(f"train-{i}")
        raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "5"
        too_big.state.apply_pod(raw)
    refused = too_big.filter(raw)
    assert refused["NodeNames"] == []
    assert "in one rack (required by topology key" in next(
        iter(refused["FailedAndUnresolvableNodes"].values())
    )
    # The same 5-CPU gang without a constraint: no whole-gang check, every node passes on.
    plain = World(every_gang=False)
    for i in range(2):
        raw = pod(f"big-{i}", light=("big", "2"), cpu="5")
        plain.state.apply_pod(raw)
    assert plain.filter(raw)["NodeNames"] == list(NODES)
    assert not plain.arbiter.claims and not plain.arbiter.waiting


def test_a_volcano_gang_is_held_to_its_hypernode_with_full_node_objects_in_the_request() -> None:
    """nodeCacheCapable=false: the request's Node objects carry no HyperNode tier label;
    the filter reads the tier from its own records."""
    world = World()
    world.state.replace_hypernodes(
        [
            {
                "metadata": {"name": "leaf-x"},
                "spec": {
                    "tier": 1,
                    "members": [
                        {"type": "Node", "selector": {"regexMatch": {"pattern": "^(a2|b1)$"}}}
                    ],
                },
            }
        ]
    )
    world.state.apply_podgroup(
        {
            "metadata": {"namespace": "default", "name": "job", "uid": "pg-job"},
            "spec": {"minMember": 2, "networkTopology": {"mode": "hard"}},
        },
        SOURCE_VOLCANO,
    )
    members = []
    for i in range(2):
        raw = pod(f"job-{i}", cpu="2")
        raw["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "job"}
        world.state.apply_pod(raw)
        members.append(raw)
    nodes = [node(name) for name in NODES]
    result = world.extender.filter(ExtenderArgs(members[0], None, nodes))
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["a2", "b1"]
    assert result["FailedAndUnresolvableNodes"]["a1"].endswith(
        "this node is in no tier-1 hypernode"
    )
