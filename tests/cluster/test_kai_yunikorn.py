"""KAI's v2alpha2 PodGroup and YuniKorn's task groups against the real kube-scheduler.

Each test brings its own fake nodes of 1 CPU labelled with a rack (the
session's own nodes are cordoned meanwhile); every member asks for 1 CPU,
so a rack of n nodes has room for n members. The KAI PodGroup's CRD is
tests/cluster/crds/scheduling.run.ai_podgroups.yaml.
"""

from __future__ import annotations

import json

from app.core.groups import (
    KAI_API,
)
from app.core.kai import (
    KAI_GROUP_ANNOTATION,
    KAI_SUBGROUP_LABEL,
)
from app.core.yunikorn import TASK_GROUP_NAME_ANNOTATION, TASK_GROUPS_ANNOTATION
from hack.clusterkit import create_group
from tests.cluster.kube import Kube
from tests.cluster.racks import RACK, one_rack, racks, stays_unbound, topology_placed


def in_rack() -> dict[str, str]:
    return {"topology": "cluster-topology", "requiredTopologyLevel": RACK}


def kai_pods(kube: Kube, namespace: str, group: str, sub_groups: dict[str, int]) -> None:
    """`count` pods per sub-group, named <group>-<sub-group>-<i>."""
    for sub_group, count in sub_groups.items():
        for i in range(count):
            kube.create_pod(
                namespace,
                f"{group}-{sub_group}-{i}",
                cpu="1",
                labels={KAI_SUBGROUP_LABEL: sub_group},
                annotations={KAI_GROUP_ANNOTATION: group},
            )


def test_kai_sub_groups_each_required_in_a_rack_land_each_whole_in_one(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4), "r1": ("b0", 4)}) as rack_of:
        create_group(
            kube.custom,
            KAI_API,
            namespace,
            "infer",
            {
                "minMember": 6,
                "queue": "team-a",
                "subGroups": [
                    {"name": "a", "minMember": 3, "topologyConstraint": in_rack()},
                    {"name": "b", "minMember": 3, "topologyConstraint": in_rack()},
                ],
            },
        )
        kai_pods(kube, namespace, "infer", {"a": 3, "b": 3})
        bound = kube.wait_bound(namespace, "infer-", 6)
        # Each sub-group in one rack (one_rack fails if one straddles two).
        first = one_rack(bound, rack_of, (f"infer-a-{i}" for i in range(3)))
        second = one_rack(bound, rack_of, (f"infer-b-{i}" for i in range(3)))
        assert first != second, bound
        event = topology_placed(kube, namespace)
        assert f"a in rack {first}" in event and f"b in rack {second}" in event


def test_a_kai_pod_naming_an_unknown_sub_group_holds_the_gang_with_the_name(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        create_group(
            kube.custom,
            KAI_API,
            namespace,
            "bad",
            {"minMember": 2, "subGroups": [{"name": "a", "minMember": 2}]},
        )
        kai_pods(kube, namespace, "bad", {"a": 1, "typo": 1})
        kube.wait_for_event(
            namespace,
            "bad-a-0",
            f"gang kai:{namespace}/bad: member {namespace}/bad-typo-0 names sub-group 'typo'",
            "which the PodGroup does not declare",
            what="the FailedScheduling naming the unknown sub-group",
        )
        stays_unbound(kube, namespace)


def test_a_kai_podgroup_with_a_parent_cycle_holds_its_pods(kube: Kube, namespace: str) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        create_group(
            kube.custom,
            KAI_API,
            namespace,
            "loop",
            {"subGroups": [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}]},
        )
        kai_pods(kube, namespace, "loop", {"a": 1})
        kube.wait_for_event(
            namespace,
            "loop-a-0",
            f"PodGroup kai:{namespace}/loop: spec.subGroups parents form a cycle",
            what="the FailedScheduling naming the cycle",
        )
        stays_unbound(kube, namespace)


def task_group_pods(
    kube: Kube, namespace: str, app: str, roles: dict[str, tuple[int, str]], groups: str
) -> None:
    """Per task group (count, cpu): its pods; the first pod carries the task groups."""
    first = True
    for role, (count, cpu) in roles.items():
        for i in range(count):
            annotations = {TASK_GROUP_NAME_ANNOTATION: role}
            if first:
                annotations[TASK_GROUPS_ANNOTATION] = groups
                first = False
            kube.create_pod(
                namespace,
                f"{app}-{role}-{i}",
                cpu=cpu,
                labels={"applicationId": app},
                annotations=annotations,
            )


def test_a_yunikorn_task_group_that_fits_no_node_holds_the_gang_and_names_the_role(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        groups = [
            {"name": "driver", "minMember": 1, "minResource": {"cpu": "2"}},
            {"name": "executor", "minMember": 2, "minResource": {"cpu": "1"}},
        ]
        task_group_pods(
            kube,
            namespace,
            "etl",
            {"driver": (1, "2"), "executor": (2, "1")},
            json.dumps(groups),
        )
        for executor in ("etl-executor-0", "etl-executor-1"):
            kube.wait_for_event(
                namespace,
                executor,
                f"gang yunikorn:{namespace}/etl waits: role driver needs cpu 2",
                "the largest free is cpu 1",
                what=f"{executor}'s FailedScheduling naming role driver",
            )
        stays_unbound(kube, namespace)


def test_a_yunikorn_gang_lands_whole_once_every_task_group_has_its_minimum(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        groups = [
            {"name": "driver", "minMember": 1, "minResource": {"cpu": "1"}},
            {"name": "executor", "minMember": 2, "minResource": {"cpu": "1"}},
        ]
        task_group_pods(
            kube, namespace, "job", {"driver": (1, "1"), "executor": (2, "1")}, json.dumps(groups)
        )
        kube.wait_bound(namespace, "job-", 3)


def test_malformed_task_groups_hold_the_gang_with_the_rule(kube: Kube, namespace: str) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        task_group_pods(kube, namespace, "broken", {"driver": (1, "1"), "executor": (1, "1")}, "[{")
        for member in ("broken-driver-0", "broken-executor-0"):
            kube.wait_for_event(
                namespace,
                member,
                f"gang yunikorn:{namespace}/broken: annotation {TASK_GROUPS_ANNOTATION} is not "
                "valid JSON",
                what=f"{member}'s FailedScheduling naming the malformed annotation",
            )
        stays_unbound(kube, namespace)
