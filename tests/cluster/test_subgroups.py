"""Gangs made of groups against the real kube-scheduler: slices in racks, roles named.

Each test brings its own fake nodes of 1 CPU, labelled with a rack and a
block (the session's own nodes are cordoned meanwhile); every member asks
for 1 CPU, so a rack of n nodes has room for n members.
"""

from __future__ import annotations

import functools
import json

import pytest

from app.core.groups import (
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_COUNT_ANNOTATION,
    VOLCANO_API,
    VOLCANO_GROUP_ANNOTATIONS,
    VOLCANO_TASK_ANNOTATION,
)
from app.core.topology.domains import HOSTNAME
from app.core.topology.sources import (
    KUEUE_POD_INDEX,
    KUEUE_REQUIRED,
    KUEUE_SLICE_CONSTRAINTS,
    KUEUE_SLICE_REQUIRED,
    KUEUE_SLICE_SIZE,
)
from hack.clusterkit import create_group, wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import (
    BLOCK,
    RACK,
    racks,
    slice_racks,
    stays_unbound,
    told,
    topology_placed,
)
from tests.cluster.session import Extender

PARTITION = "volcano.sh/partition-id"


def kueue_gang(
    kube: Kube, namespace: str, name: str, count: int, annotations: dict[str, str]
) -> None:
    """A Kueue plain pod group of `count` pods, ranked by the pod-group-pod-index label."""
    for i in range(count):
        kube.create_pod(
            namespace,
            f"{name}-{i}",
            cpu="1",
            labels={KUEUE_GROUP_LABEL: name, KUEUE_POD_INDEX: str(i)},
            annotations={KUEUE_TOTAL_COUNT_ANNOTATION: str(count), **annotations},
        )


def test_slices_of_three_on_racks_of_four_land_three_and_three(kube: Kube, namespace: str) -> None:
    with racks(kube, {"r0": ("b0", 4), "r1": ("b0", 4)}) as rack_of:
        kueue_gang(kube, namespace, "train", 6, {KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "3"})
        bound = kube.wait_bound(namespace, "train-", 6)
        first, second = slice_racks(bound, rack_of, "train-", 3)
        assert first != second, bound
        event = topology_placed(kube, namespace)
        assert f"rack-0 in rack {first}" in event and f"rack-1 in rack {second}" in event


@pytest.mark.parametrize(
    "layout",
    [
        # Block b1 has more room in all (9) than b0 (8), but no rack of 4.
        {"a0": ("b0", 4), "a1": ("b0", 4), "c0": ("b1", 3), "c1": ("b1", 3), "c2": ("b1", 3)},
        # Block b1 (8, none to spare) comes first fullest first, but no rack of 4.
        {
            "a0": ("b0", 4),
            "a1": ("b0", 4),
            "a2": ("b0", 1),
            "c0": ("b1", 3),
            "c1": ("b1", 3),
            "c2": ("b1", 2),
        },
    ],
    ids=["more-room-in-all", "tried-first"],
)
def test_slices_of_four_go_to_racks_inside_the_one_block_whose_racks_hold_them(
    kube: Kube, namespace: str, layout: dict[str, tuple[str, int]]
) -> None:
    with racks(kube, layout) as rack_of:
        annotations = {
            KUEUE_REQUIRED: BLOCK,
            KUEUE_SLICE_REQUIRED: RACK,
            KUEUE_SLICE_SIZE: "4",
        }
        kueue_gang(kube, namespace, "big", 8, annotations)
        bound = kube.wait_bound(namespace, "big-", 8)
        assert sorted(slice_racks(bound, rack_of, "big-", 4)) == ["a0", "a1"], bound


def test_nested_slices_from_the_json_list(kube: Kube, namespace: str) -> None:
    layout = {"a0": ("b0", 2), "a1": ("b0", 2), "c0": ("b1", 2), "c1": ("b1", 1)}
    with racks(kube, layout) as rack_of:
        listed = [{"topology": BLOCK, "size": 4}, {"topology": RACK, "size": 2}]
        kueue_gang(kube, namespace, "n", 4, {KUEUE_SLICE_CONSTRAINTS: json.dumps(listed)})
        bound = kube.wait_bound(namespace, "n-", 4)
        assert sorted(slice_racks(bound, rack_of, "n-", 2)) == ["a0", "a1"], bound


def test_a_slice_larger_than_the_gang_holds_it_with_the_rule_named(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        kueue_gang(kube, namespace, "odd", 3, {KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "4"})
        event = wait_for(
            functools.partial(told, kube, namespace, "slice size must be at most", "odd-0"),
            30,
            "the FailedScheduling message",
        )
        assert "has 3 pod(s) but its slices of rack are 4 pods each" in event
        stays_unbound(kube, namespace)


def test_a_role_that_fits_no_node_holds_the_gang_and_its_siblings_hear_the_role(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        create_group(
            kube.custom,
            VOLCANO_API,
            namespace,
            "big",
            {"minMember": 3, "queue": "default", "minTaskMember": {"head": 1, "worker": 2}},
        )
        for name, task, cpu in (("big-head", "head", "2"), ("big-w0", "worker", "1")):
            kube.create_pod(
                namespace,
                name,
                cpu=cpu,
                annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "big", VOLCANO_TASK_ANNOTATION: task},
            )
        kube.create_pod(
            namespace,
            "big-w1",
            cpu="1",
            labels={VOLCANO_TASK_ANNOTATION: "worker"},  # the label, as Volcano reads it too
            annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "big"},
        )
        for worker in ("big-w0", "big-w1"):
            kube.wait_for_event(
                namespace,
                worker,
                f"gang volcano:{namespace}/big waits: role head needs cpu 2",
                "the largest free is cpu 1",
                what=f"{worker}'s FailedScheduling naming role head",
            )
        stays_unbound(kube, namespace)


def test_volcano_sub_groups_of_three_on_racks_of_four_land_three_and_three(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    """subGroupPolicy with its own networkTopology (hard, tier 1 = the rack, the first
    configured level above the node): each partition of 3 in one rack."""
    previous = extender.extra_args
    with racks(kube, {"r0": ("b0", 4), "r1": ("b0", 4)}) as rack_of:
        try:
            extender.restart(*previous, "--topology-levels", f"{HOSTNAME},{RACK},{BLOCK}")
            policy = {
                "name": "worker",
                "subGroupSize": 3,
                "minSubGroups": 2,
                "labelSelector": {"matchLabels": {VOLCANO_TASK_ANNOTATION: "worker"}},
                "matchLabelKeys": [PARTITION],
                "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
            }
            create_group(
                kube.custom,
                VOLCANO_API,
                namespace,
                "job",
                {"minMember": 6, "queue": "default", "subGroupPolicy": [policy]},
            )
            for i in range(6):
                kube.create_pod(
                    namespace,
                    f"job-{i}",
                    cpu="1",
                    labels={VOLCANO_TASK_ANNOTATION: "worker", PARTITION: str(i // 3)},
                    annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "job"},
                )
            bound = kube.wait_bound(namespace, "job-", 6)
            first, second = slice_racks(bound, rack_of, "job-", 3)
            assert first != second, bound
            event = topology_placed(kube, namespace)
            assert f"worker-0 in rack {first}" in event and f"worker-1 in rack {second}" in event
        finally:
            extender.restart(*previous)
