"""Topology-aware gangs against the real kube-scheduler: one rack, block or zone per gang.

16 fake nodes of 2 CPUs in 2 zones x 2 blocks x 2 racks x 2 nodes; the
session's own nodes are cordoned meanwhile, and the extender runs with the
levels hostname, rack, block, zone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from app.core.groups import (
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_COUNT_ANNOTATION,
    LIGHT_MIN_AVAILABLE_LABEL,
    LIGHT_NAME_LABEL,
    NATIVE_API,
    VOLCANO_API,
    VOLCANO_GROUP_ANNOTATIONS,
    XK8S_API,
    GroupApi,
)
from app.core.topology import hypernode
from app.core.topology.domains import HOSTNAME, ZONE
from app.core.topology.sources import KUEUE_PREFERRED, KUEUE_REQUIRED
from hack.clusterkit import create_group, wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import BLOCK, RACK, create_labelled_nodes, told
from tests.cluster.session import Extender

LEVELS = f"{HOSTNAME},{RACK},{BLOCK},{ZONE}"
LOW, HIGH = "topology-test-low", "topology-test-high"


def node_name(z: int, b: int, r: int, n: int) -> str:
    return f"topo-z{z}-b{b}-r{r}-n{n}"


def labels_of(node: str) -> dict[str, str]:
    """topo-z0-b1-r0-n1 -> its rack z0b1r0, block z0b1 and zone z0."""
    _, z, b, r, _ = node.split("-")
    return {RACK: f"{z}{b}{r}", BLOCK: f"{z}{b}", ZONE: z}


def domains(bound: dict[str, str], level: str) -> set[str]:
    return {labels_of(node)[level] for node in bound.values()}


@pytest.fixture(scope="module")
def racks(kube: Kube, extender: Extender) -> Iterator[list[str]]:
    """The 16 labelled nodes (the session's cordoned), and the extender with the levels."""
    previous = extender.extra_args
    names = [
        node_name(z, b, r, n)
        for z in range(2)
        for b in range(2)
        for r in range(2)
        for n in range(2)
    ]
    with kube.nodes_of_its_own() as created:
        try:
            create_labelled_nodes(kube, created, {name: labels_of(name) for name in names}, "2")
            extender.restart(*previous, "--topology-levels", LEVELS)
            kube.ensure_priority_class(LOW, 100)
            kube.ensure_priority_class(HIGH, 1000)
            yield created
        finally:
            extender.restart(*previous)


def pin(kube: Kube, namespace: str, name: str, node: str, cpu: str, priority: str) -> None:
    """A running pod placed by hand (as a kubelet would run it), not by the scheduler."""
    body = kube.pod_body(name, cpu=cpu, priority_class=priority)
    body["spec"]["nodeName"] = node
    kube.core.create_namespaced_pod(namespace, body)


def x_k8s_gang(
    kube: Kube, namespace: str, name: str, size: int, cpu: str, annotations: dict[str, str]
) -> None:
    create_group(kube.custom, XK8S_API, namespace, name, {"minMember": size}, annotations)
    for i in range(size):
        kube.create_pod(namespace, f"{name}-{i}", group=name, cpu=cpu)


def placed_condition(kube: Kube, api: GroupApi, namespace: str, name: str) -> dict[str, Any] | None:
    """The PodGroup's TopologyPlaced condition, once gang-extender wrote it."""
    status = kube.group_object(api, namespace, name).get("status") or {}
    return next(
        (c for c in status.get("conditions") or () if c.get("type") == "TopologyPlaced"), None
    )


def test_required_rack_gang_lands_in_one_rack(
    kube: Kube, namespace: str, racks: list[str], extender: Extender
) -> None:
    x_k8s_gang(kube, namespace, "train", 4, "1", {KUEUE_REQUIRED: RACK})
    bound = kube.wait_bound(namespace, "train-", 4)
    (rack,) = domains(bound, RACK)
    event = wait_for(
        functools.partial(told, kube, namespace, "TopologyPlaced"), 30, "the TopologyPlaced event"
    )
    assert f"gang {namespace}/train is placed in rack {rack}" in event
    assert extender.sample("gang_extender_topology_placements_total", level=RACK) >= 1
    condition = wait_for(
        functools.partial(placed_condition, kube, XK8S_API, namespace, "train"),
        30,
        "the PodGroup's TopologyPlaced condition",
    )
    assert condition["status"] == "True" and condition["reason"] == "InOneDomain", condition
    assert f"placed in rack {rack} (rack = node label {RACK})" in condition["message"]


def test_without_gang_feasibility_required_rack_is_still_honoured(
    kube: Kube, namespace: str, racks: list[str], extender: Extender
) -> None:
    """--gang-feasibility=false: a gang with a required rack is still placed as a whole in
    one rack, and one no rack can hold stays pending with nothing bound."""
    extender.restart(*extender.extra_args, "--gang-feasibility", "false")
    try:
        x_k8s_gang(kube, namespace, "train", 4, "1", {KUEUE_REQUIRED: RACK})
        bound = kube.wait_bound(namespace, "train-", 4)
        assert len(domains(bound, RACK)) == 1, bound
        x_k8s_gang(kube, namespace, "wide", 5, "1", {KUEUE_REQUIRED: RACK})
        wait_for(
            functools.partial(told, kube, namespace, f"gang {namespace}/wide needs its 5"),
            30,
            "the wide gang's FailedScheduling message",
        )
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert not [p for p in kube.bound(namespace) if p.startswith("wide-")]
            time.sleep(0.3)
    finally:
        extender.restart(*extender.extra_args[:-2])


def test_gang_no_rack_can_hold_stays_pending_with_the_message(
    kube: Kube, namespace: str, racks: list[str]
) -> None:
    # 5 x 1 CPU: a rack has 4.
    x_k8s_gang(kube, namespace, "wide", 5, "1", {KUEUE_REQUIRED: RACK})
    event = wait_for(
        functools.partial(told, kube, namespace, "in one rack (required by topology key"),
        30,
        "the FailedScheduling message",
    )
    assert f"gang {namespace}/wide needs its 5 missing member(s)" in event
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert not kube.bound(namespace)
        time.sleep(0.3)


def test_preferred_rack_falls_back_to_block_then_zone(
    kube: Kube, namespace: str, racks: list[str]
) -> None:
    """Kueue's preferred annotation on the pods of label-only groups."""

    def gang(name: str, size: int) -> None:
        for i in range(size):
            kube.create_pod(
                namespace,
                f"{name}-{i}",
                cpu="1",
                labels={LIGHT_NAME_LABEL: name, LIGHT_MIN_AVAILABLE_LABEL: str(size)},
                annotations={KUEUE_PREFERRED: RACK},
            )

    gang("six", 6)  # no rack (4 CPUs) holds 6: one block (8)
    six = kube.wait_bound(namespace, "six-", 6)
    assert len(domains(six, BLOCK)) == 1 and len(domains(six, RACK)) > 1, six
    gang("twelve", 12)  # no block holds 12: one zone (16), the one without "six"
    twelve = kube.wait_bound(namespace, "twelve-", 12)
    assert len(domains(twelve, ZONE)) == 1 and len(domains(twelve, BLOCK)) > 1, twelve
    assert domains(twelve, ZONE) != domains(six, ZONE)


def test_half_full_rack_takes_the_gang_that_fits_leaving_empty_racks_whole(
    kube: Kube, namespace: str, racks: list[str]
) -> None:
    half = node_name(1, 1, 0, 0), node_name(1, 1, 0, 1)
    for i, node in enumerate(half):
        pin(kube, namespace, f"busy-{i}", node, "1", LOW)
    wait_for(lambda: len(kube.bound(namespace)) == 2, 30, "the busy pods")
    x_k8s_gang(kube, namespace, "small", 2, "1", {KUEUE_REQUIRED: RACK})
    small = kube.wait_bound(namespace, "small-", 2)
    assert domains(small, RACK) == {"z1b1r0"}, small
    x_k8s_gang(kube, namespace, "large", 4, "1", {KUEUE_REQUIRED: RACK})
    large = kube.wait_bound(namespace, "large-", 4)
    (rack,) = domains(large, RACK)
    assert rack != "z1b1r0"


def test_native_podgroup_topology_is_honoured(kube: Kube, namespace: str, racks: list[str]) -> None:
    create_group(
        kube.custom,
        NATIVE_API,
        namespace,
        "ring",
        {
            "schedulingPolicy": {"gang": {"minCount": 4}},
            "schedulingConstraints": {"topology": [{"key": RACK}]},
        },
    )
    for i in range(4):
        kube.create_pod(namespace, f"ring-{i}", scheduling_group="ring", cpu="1")
    bound = kube.wait_bound(namespace, "ring-", 4)
    assert len(domains(bound, RACK)) == 1, bound
    assert wait_for(
        functools.partial(told, kube, namespace, f"gang native:{namespace}/ring is placed in rack"),
        30,
        "the TopologyPlaced event",
    )


@pytest.mark.parametrize(("mode", "size", "level"), [("hard", 4, RACK), ("soft", 6, BLOCK)])
def test_volcano_network_topology_is_honoured(
    kube: Kube, namespace: str, racks: list[str], mode: str, size: int, level: str
) -> None:
    """Tier 1 is the rack (the first level above the node); soft falls back to the block."""
    create_group(
        kube.custom,
        VOLCANO_API,
        namespace,
        "job",
        {
            "minMember": size,
            "queue": "default",
            "networkTopology": {"mode": mode, "highestTierAllowed": 1},
        },
    )
    for i in range(size):
        kube.create_pod(
            namespace, f"job-{i}", cpu="1", annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "job"}
        )
    bound = kube.wait_bound(namespace, "job-", size)
    assert len(domains(bound, level)) == 1, bound
    if mode == "hard":
        return
    # Hard mode with tier 1 refuses what soft mode placed in a block.
    create_group(
        kube.custom,
        VOLCANO_API,
        namespace,
        "hard",
        {"minMember": 6, "queue": "default", "networkTopology": {"mode": "hard"}},
    )
    for i in range(6):
        kube.create_pod(
            namespace, f"hard-{i}", cpu="1", annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "hard"}
        )
    wait_for(
        functools.partial(told, kube, namespace, f"gang volcano:{namespace}/hard needs its 6"),
        30,
        "the hard gang's FailedScheduling message",
    )
    assert not [p for p in kube.bound(namespace) if p.startswith("hard-")]


def test_high_priority_gang_preempts_inside_one_rack_with_fewest_victims(
    kube: Kube, namespace: str, racks: list[str]
) -> None:
    """Every node is full. Across racks, 2 evictions would do (two nodes each running one
    2-CPU pod, in different racks); inside one rack the fewest is 3, in rack z0b1r1 only."""
    cheap_elsewhere = {node_name(0, 0, 0, 0), node_name(1, 0, 0, 0)}
    dear = {node_name(0, 0, 0, 1), node_name(1, 0, 0, 1)}  # their rack partners: 3 pods
    target = node_name(0, 1, 1, 0), node_name(0, 1, 1, 1)
    expected_victims: set[str] = set()
    count = 0
    for node in racks:
        if node in cheap_elsewhere or node == target[0]:
            shape = ["2"]
        elif node in dear:
            shape = ["1", "500m", "500m"]
        else:
            shape = ["1", "1"]
        for cpu in shape:
            name = f"low-{count}"
            count += 1
            pin(kube, namespace, name, node, cpu, LOW)
            if node in target:
                expected_victims.add(name)
    wait_for(lambda: len(kube.bound(namespace)) == count, 60, "the low pods")
    create_group(
        kube.custom, XK8S_API, namespace, "urgent", {"minMember": 2}, {KUEUE_REQUIRED: RACK}
    )
    for i in range(2):
        kube.create_pod(namespace, f"urgent-{i}", group="urgent", cpu="2", priority_class=HIGH)
    bound = kube.wait_bound(namespace, "urgent-", 2)
    assert set(bound.values()) == set(target), bound
    low = {p.metadata.name for p in kube.pods(namespace) if p.metadata.name.startswith("low-")}
    live = {
        p.metadata.name
        for p in kube.pods(namespace)
        if p.metadata.name.startswith("low-") and not p.metadata.deletion_timestamp
    }
    assert {f"low-{i}" for i in range(count)} - live == expected_victims, low
    planned = wait_for(
        functools.partial(told, kube, namespace, "PreemptionPlanned"), 30, "the plan's event"
    )
    assert "in rack z0b1r1" in planned and "3 eviction(s)" in planned


def test_kueue_plain_pod_group_is_all_or_nothing_in_one_rack(
    kube: Kube, namespace: str, racks: list[str]
) -> None:
    """Kueue's plain pod groups as a source, with the required topology on the pods."""

    def member(i: int) -> None:
        kube.create_pod(
            namespace,
            f"kq-{i}",
            cpu="1",
            labels={KUEUE_GROUP_LABEL: "kq"},
            annotations={KUEUE_TOTAL_COUNT_ANNOTATION: "4", KUEUE_REQUIRED: RACK},
        )

    for i in range(3):
        member(i)
    wait_for(
        functools.partial(told, kube, namespace, "cannot find enough sibling pods"),
        30,
        "the sibling message",
    )
    assert not kube.bound(namespace)
    member(3)
    bound = kube.wait_bound(namespace, "kq-", 4)
    assert len(domains(bound, RACK)) == 1, bound


def test_a_member_created_later_follows_its_bound_siblings_rack(
    kube: Kube, namespace: str, racks: list[str]
) -> None:
    """Rack z0b0r0 has 1 CPU free; the gang takes the first empty rack, z0b0r1. A member
    recreated later needs 1 CPU: both racks have exactly that, and the name would pick
    z0b0r0, but its siblings run in z0b0r1."""
    for i, cpu in enumerate(("2", "1")):
        pin(kube, namespace, f"busy-{i}", node_name(0, 0, 0, i), cpu, LOW)
    wait_for(lambda: len(kube.bound(namespace)) == 2, 30, "the busy pods")
    x_k8s_gang(kube, namespace, "train", 4, "1", {KUEUE_REQUIRED: RACK})
    bound = kube.wait_bound(namespace, "train-", 4)
    assert domains(bound, RACK) == {"z0b0r1"}, bound
    kube.core.delete_namespaced_pod("train-0", namespace, grace_period_seconds=0)
    wait_for(lambda: "train-0" not in kube.bound(namespace), 30, "train-0 gone")
    kube.create_pod(namespace, "train-4", group="train", cpu="1")
    again = kube.wait_bound(namespace, "train-", 4)
    assert domains(again, RACK) == {"z0b0r1"}, again


# ---- Volcano HyperNodes ------------------------------------------------------------------

# Three nodes that no rack label groups (two of rack z0b0r0, one of z0b0r1), by exact name.
WIDE_LEAF = [node_name(0, 0, 0, 0), node_name(0, 0, 0, 1), node_name(0, 0, 1, 0)]


def hypernode_body(name: str, tier: int, tier_name: str, members: list[Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{hypernode.API_GROUP}/{hypernode.API_VERSION}",
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": {"tier": tier, "tierName": tier_name, "members": members},
    }


def extender_hypernodes(extender: Extender) -> dict[str, int]:
    with urllib.request.urlopen(f"{extender.url}/debug/caches", timeout=10) as response:
        cached: dict[str, int] = json.loads(response.read())["hypernodes"]
        return cached


@pytest.fixture
def hypernodes(kube: Kube, racks: list[str], extender: Extender) -> Iterator[dict[str, int]]:
    """A tier-1 leaf over WIDE_LEAF (exact names), one over rack z1b1r1 (node labels), and
    a tier-2 spine over both (regex on hypernode names). Deleted afterwards: the other
    tests' Volcano tiers are the rack labels."""
    bodies = [
        hypernode_body(
            "leaf-wide",
            1,
            "leaf",
            [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in WIDE_LEAF],
        ),
        hypernode_body(
            "leaf-z1b1r1",
            1,
            "leaf",
            [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {RACK: "z1b1r1"}}}}],
        ),
        hypernode_body(
            "spine",
            2,
            "spine",
            [{"type": "HyperNode", "selector": {"regexMatch": {"pattern": "^leaf-"}}}],
        ),
    ]
    api = (hypernode.API_GROUP, hypernode.API_VERSION, hypernode.PLURAL)
    expected = {"leaf-wide": 1, "leaf-z1b1r1": 1, "spine": 2}
    try:
        for body in bodies:
            kube.custom.create_cluster_custom_object(*api, body)
        wait_for(lambda: extender_hypernodes(extender) == expected, 30, "the extender's HyperNodes")
        yield expected
    finally:
        for body in bodies:
            with contextlib.suppress(ApiException):
                kube.custom.delete_cluster_custom_object(*api, body["metadata"]["name"])
        wait_for(lambda: extender_hypernodes(extender) == {}, 30, "the HyperNodes gone")


def volcano_gang(
    kube: Kube, namespace: str, name: str, size: int, topology: dict[str, Any]
) -> None:
    create_group(
        kube.custom,
        VOLCANO_API,
        namespace,
        name,
        {"minMember": size, "queue": "default", "networkTopology": topology},
    )
    for i in range(size):
        kube.create_pod(
            namespace, f"{name}-{i}", cpu="1", annotations={VOLCANO_GROUP_ANNOTATIONS[0]: name}
        )


def test_volcano_hard_gang_is_placed_inside_one_tier_1_hypernode(
    kube: Kube, namespace: str, hypernodes: dict[str, int]
) -> None:
    """5 x 1 CPU: no rack (4 CPUs) holds it, the 3-node leaf (6 CPUs) does. A 5-member gang
    asking for tier `leaf` by name then finds no leaf with room (1 + 4 CPUs left) and
    stays pending, with nothing bound, though the spine would hold it."""
    volcano_gang(kube, namespace, "wide", 5, {"mode": "hard", "highestTierAllowed": 1})
    bound = kube.wait_bound(namespace, "wide-", 5)
    assert set(bound.values()) <= set(WIDE_LEAF), bound
    event = wait_for(
        functools.partial(told, kube, namespace, "TopologyPlaced"), 30, "the TopologyPlaced event"
    )
    assert f"gang volcano:{namespace}/wide is placed in tier-1 hypernode leaf-wide" in event
    condition = wait_for(
        functools.partial(placed_condition, kube, VOLCANO_API, namespace, "wide"),
        30,
        "the Volcano PodGroup's TopologyPlaced condition",
    )
    assert condition["status"] == "True", condition
    assert (
        "tier-1 hypernode leaf-wide (tier-1 hypernode = HyperNode tier 1)" in condition["message"]
    )
    volcano_gang(kube, namespace, "next", 5, {"mode": "hard", "highestTierName": "leaf"})
    message = wait_for(
        functools.partial(told, kube, namespace, f"gang volcano:{namespace}/next needs its 5"),
        30,
        "the pending gang's FailedScheduling message",
    )
    assert "in one tier-1 hypernode" in message and "stays pending" in message, message
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert not [p for p in kube.bound(namespace) if p.startswith("next-")]
        time.sleep(0.3)
