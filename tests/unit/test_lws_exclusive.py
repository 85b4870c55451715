"""LeaderWorkerSet exclusive-topology: the leader placed alone, in a domain of its own with room
for the whole replica (LWS creates the workers only once the leader has a node)."""

from __future__ import annotations

from typing import Any

from app.core.group_rules import spec_from_labels
from app.core.groups import ALL_SOURCES, SOURCE_LWS, group_ref_of_pod
from app.core.lws import (
    LWS_EXCLUSIVE_ANNOTATION,
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    LWS_SIZE_ANNOTATION,
    LWS_SUBGROUP_EXCLUSIVE_ANNOTATION,
    LWS_SUBGROUP_SIZE_ANNOTATION,
)
from app.core.packing import Bin, Demand
from app.core.state import ClusterState
from app.core.topology.domains import HOSTNAME, TopologyConstraint
from app.core.topology.exclusive import exclusive_room
from app.core.topology.subgroups import GangShape, Member, tree_of
from app.web.wire import ExtenderArgs
from tests.unit.builders import node, pod
from tests.unit.fakes import ExtenderOnState
from tests.unit.test_lws import BLOCK, lws_meta, racks, racks_placed

RACK = "example.com/rack"
WITH_LWS = ALL_SOURCES | {SOURCE_LWS}
CPU = {"cpu": 1000, "pods": 1000}


def lws_pod(index: int, worker: int = 0, *, size: int = 3, node_name: str = "") -> dict[str, Any]:
    """A replica's pod as LWS's controller and pod webhook leave it (1 CPU)."""
    raw = pod(f"infer-{index}" + (f"-{worker}" if worker else ""), cpu="1", node=node_name)
    raw["metadata"]["labels"] = {
        LWS_NAME_LABEL: "infer",
        LWS_GROUP_INDEX_LABEL: str(index),
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
    }
    raw["metadata"]["annotations"] = {
        LWS_SIZE_ANNOTATION: str(size),
        LWS_EXCLUSIVE_ANNOTATION: RACK,
    }
    if node_name:
        raw["status"]["phase"] = "Running"
    return raw


def test_an_exclusive_replica_starts_its_leader_alone_and_counts_its_size() -> None:
    ref = group_ref_of_pod("default", lws_pod(0)["metadata"], {}, WITH_LWS)
    assert ref is not None
    spec = spec_from_labels(ref, lambda key: [])
    assert (spec.min_member, spec.exclusive_size) == (1, 3)
    plain = lws_pod(0)["metadata"]
    del plain["annotations"][LWS_EXCLUSIVE_ANNOTATION]
    ref = group_ref_of_pod("default", plain, {}, WITH_LWS)
    assert ref is not None
    spec = spec_from_labels(ref, lambda key: [])
    assert (spec.min_member, spec.exclusive_size) == (3, 0)


def bins(free: dict[str, int]) -> list[Bin]:
    return [
        Bin(f"{rack}{i}", dict(CPU), {RACK: rack})
        for rack, count in free.items()
        for i in range(count)
    ]


def test_only_domains_of_its_own_with_room_for_the_whole_replica_are_left() -> None:
    leader = (Demand("default/infer-0", dict(CPU)),)
    nodes, why = exclusive_room("g", leader, 3, RACK, bins({"a": 1, "b": 3, "c": 4}), {"b"})
    assert {n.name for n in nodes} == {"c0", "c1", "c2", "c3"} and why == ""
    nodes, why = exclusive_room("g", leader, 3, RACK, bins({"a": 1, "b": 3}), {"b"})
    assert nodes == []
    assert why == (
        "gang g needs one rack (example.com/rack) of its own with room for all its 3 member(s), "
        "those not created yet counted like the first: 1 rack(s) hold another group, 1 lack "
        "the room; it stays pending, nothing is reserved"
    )


class World:
    """Racks a (1 node), b (3 nodes), c (4 nodes) of 1 CPU each, the LWS source on."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.state.sources = WITH_LWS
        nodes = []
        for rack, count in {"a": 1, "b": 3, "c": 4}.items():
            for i in range(count):
                raw = node(f"{rack}{i}", cpu="1")
                raw["metadata"]["labels"][RACK] = rack
                nodes.append(raw)
        self.names = [n["metadata"]["name"] for n in nodes]
        self.state.replace_nodes(nodes)
        on = ExtenderOnState(self.state, (HOSTNAME, RACK), every_gang=True)
        self.extender = on.extender

    def filter(self, raw: dict[str, Any]) -> dict[str, Any]:
        self.state.apply_pod(raw)
        return self.extender.filter(ExtenderArgs(raw, self.names, None))


def test_the_leader_goes_where_its_workers_fit_not_to_the_fullest_rack() -> None:
    world = World()
    result = world.filter(lws_pod(0))
    assert set(result["NodeNames"]) == {"b0", "b1", "b2"}, result


def test_a_rack_holding_another_replica_is_barred_even_with_room() -> None:
    """Replica 0 runs in c (1 of its 4 nodes): c has room for 3 more, but kube-scheduler's
    anti-affinity would refuse replica 1's leader there; b is left, then nothing."""
    world = World()
    world.state.apply_pod(lws_pod(0, node_name="c0"))
    result = world.filter(lws_pod(1))
    assert set(result["NodeNames"]) == {"b0", "b1", "b2"}, result
    world.state.apply_pod(lws_pod(1, node_name="b0"))
    refused = world.filter(lws_pod(2))
    assert refused["NodeNames"] == [], refused
    message = next(iter(refused["FailedAndUnresolvableNodes"].values()))
    assert "needs one rack (example.com/rack) of its own with room for all its 3" in message
    assert "2 rack(s) hold another group, 1 lack the room" in message


def test_sub_groups_each_need_a_domain_of_their_own_inside() -> None:
    """Size 4 in sub-groups of 2 (leader and worker 1, workers 2 and 3): block x has racks of
    3 and 1 (room for 4, not for 2 + 2 apart), block y racks of 2 and 2."""
    free = [
        Bin(f"{rack}{i}", dict(CPU), {RACK: rack, "example.com/block": block})
        for rack, block, count in (("a", "x", 3), ("b", "x", 1), ("c", "y", 2), ("d", "y", 2))
        for i in range(count)
    ]
    leader = (Demand("default/infer-0", dict(CPU)),)
    nodes, _ = exclusive_room("g", leader, 4, "example.com/block", free, (), (2, RACK))
    assert {n.labels[RACK] for n in nodes} == {"c", "d"}
    # Size 5 in sub-groups of 2: the leader is the extra one of the first (3, then 2), which
    # neither block holds; a block z of racks of 3 and 2 does.
    nodes, why = exclusive_room("g", leader, 5, "example.com/block", free, (), (2, RACK))
    assert nodes == [] and "each sub-group of 2 in a rack of its own" in why
    assert "0 block(s) hold another group, 2 lack the room" in why
    free += [
        Bin(f"{rack}{i}", dict(CPU), {RACK: rack, "example.com/block": "z"})
        for rack, count in (("e", 3), ("f", 2))
        for i in range(count)
    ]
    nodes, _ = exclusive_room("g", leader, 5, "example.com/block", free, (), (2, RACK))
    assert {n.labels[RACK] for n in nodes} == {"e", "f"}


def test_sub_groups_of_subgroup_exclusive_topology_never_share_a_rack() -> None:
    """Racks a (4 free) and e (5) in one block: fullest first would put both sub-groups of 2
    in a; LWS's sub-group anti-affinity would refuse the second there, so it goes to e."""
    annotations = {
        LWS_SUBGROUP_SIZE_ANNOTATION: "2",
        LWS_SUBGROUP_EXCLUSIVE_ANNOTATION: RACK,
    }
    metas = [lws_meta(worker=w, annotations=annotations, subgroup=w // 2) for w in range(4)]
    ref = group_ref_of_pod("ml", metas[0], {}, WITH_LWS)
    assert ref is not None
    spec = spec_from_labels(ref, lambda key: [])
    members = [Member(f"ml/{m['name']}", labels=m["labels"]) for m in metas]  # type: ignore[arg-type]
    tree = tree_of(spec.key, GangShape(policies=spec.sub_group_policy), 4, members)
    assert tree is not None and all(g.exclusive for g in tree.groups)
    bins = racks({"a": 4, "e": 5}, {"a": "x", "e": "x"})
    block = TopologyConstraint(BLOCK, True)
    _, where = racks_placed(spec.key, [m.key for m in members], tree, block, bins)
    assert where["ml/infer-0-0"] == where["ml/infer-0-1"] == "a"
    assert where["ml/infer-0-2"] == where["ml/infer-0-3"] == "e"


def test_a_replica_of_another_namespace_bars_nothing() -> None:
    """LWS's anti-affinity term names no namespaces: only the pod's own are weighed."""
    world = World()
    world.state.apply_pod(lws_pod(0, node_name="b0"))  # bars rack b
    elsewhere = lws_pod(0, node_name="c0")
    elsewhere["metadata"]["namespace"] = "other"
    world.state.apply_pod(elsewhere)  # bars nothing for the namespace default
    result = world.filter(lws_pod(1))
    assert set(result["NodeNames"]) == {"c0", "c1", "c2", "c3"}, result
