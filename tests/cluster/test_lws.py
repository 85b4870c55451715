"""LeaderWorkerSet replicas as gangs against the real kube-scheduler (--lws-gangs on).

No LWS controller runs: the pods are created with exactly the labels and
annotations LWS's controller and pod webhook put on a replica's leader and
workers (kubernetes-sigs/lws api/leaderworkerset/v1). Each test brings its
own 1-CPU nodes in racks (tests/cluster/racks.py racks()); every
pod asks for 1 CPU.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from app.core.lws import (
    LWS_EXCLUSIVE_ANNOTATION,
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    LWS_SIZE_ANNOTATION,
    LWS_SUBGROUP_EXCLUSIVE_ANNOTATION,
    LWS_SUBGROUP_INDEX_LABEL,
    LWS_SUBGROUP_SIZE_ANNOTATION,
)
from app.core.marking import is_marked, member_expression
from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import BLOCK, RACK, one_rack, racks, stays_unbound
from tests.cluster.session import GANG_ONLY, Extender

WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"


def member_condition(kube: Kube, expression: str) -> None:
    """The gang-member matchCondition of the session's webhook and its policy (deploy/webhook.yaml),
    as the chart renders it with groupSources.lws on or off."""
    api: Any = k8s.AdmissionregistrationV1Api(kube.client)
    op = [
        {"op": "replace", "path": "/webhooks/0/matchConditions/0/expression", "value": expression}
    ]
    api.patch_mutating_webhook_configuration("gang-extender", op)
    op = [{"op": "replace", "path": "/spec/matchConditions/0/expression", "value": expression}]
    api.patch_validating_admission_policy("gang-extender-member-mark", op)


@pytest.fixture
def lws_on(extender: Extender, kube: Kube, namespace: str) -> Iterator[None]:
    """The extender with the LWS source on; in gang-only mode the webhook and its policy then
    take LWS pods as members (the chart's groupSources.lws on), checked on a probe pod."""
    previous = extender.extra_args
    extender.restart(*previous, "--lws-gangs", "on")
    if GANG_ONLY:
        member_condition(kube, member_expression(member_labels=(LWS_NAME_LABEL,))["isMember"])
    try:
        if GANG_ONLY:

            def probe_marked() -> bool:
                kube.create_pod(namespace, "probe", labels={LWS_NAME_LABEL: "probe"})
                pod = kube.core.read_namespaced_pod("probe", namespace)
                kube.core.delete_namespaced_pod("probe", namespace, grace_period_seconds=0)
                wait_for(
                    lambda: "probe" not in {p.metadata.name for p in kube.pods(namespace)},
                    30,
                    "the probe pod gone",
                )
                client: Any = kube.client
                return is_marked(client.sanitize_for_serialization(pod))

            wait_for(probe_marked, 30, "the webhook marking LWS pods")
        yield
    finally:
        if GANG_ONLY:
            member_condition(kube, member_expression()["isMember"])
        extender.restart(*previous)


def lws_pod(
    kube: Kube,
    namespace: str,
    name: str,
    index: int,
    worker: int,
    size: int | str,
    annotations: dict[str, str] | None = None,
    subgroup: int | None = None,
) -> None:
    """Leader (worker 0, named <set>-<index>) or worker (<set>-<index>-<worker>) of a replica."""
    labels = {
        LWS_NAME_LABEL: name,
        LWS_GROUP_INDEX_LABEL: str(index),
        WORKER_INDEX: str(worker),
        "leaderworkerset.sigs.k8s.io/group-key": f"{name}{index}key",
    }
    if subgroup is not None:
        labels[LWS_SUBGROUP_INDEX_LABEL] = str(subgroup)
    pod_annotations = {LWS_SIZE_ANNOTATION: str(size), **(annotations or {})}
    if worker:
        pod_annotations["leaderworkerset.sigs.k8s.io/leader-name"] = f"{name}-{index}"
    pod_name = f"{name}-{index}" if worker == 0 else f"{name}-{index}-{worker}"
    kube.create_pod(namespace, pod_name, cpu="1", labels=labels, annotations=pod_annotations)


@pytest.mark.usefixtures("lws_on")
def test_a_leaderworkerset_shaped_pair_of_groups_each_land_whole(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 3), "r1": ("b0", 3)}):
        for worker in range(3):
            lws_pod(kube, namespace, "infer", 0, worker, 3)
        for worker in range(2):  # replica 1 one worker short
            lws_pod(kube, namespace, "infer", 1, worker, 3)
        bound = kube.wait_bound(namespace, "infer-0", 3)
        assert sorted(bound) == ["infer-0", "infer-0-1", "infer-0-2"]
        stays = [p for p in kube.bound(namespace) if p.startswith("infer-1")]
        assert stays == [], "replica 1 bound below its size"
        lws_pod(kube, namespace, "infer", 1, 2, 3)
        assert sorted(kube.wait_bound(namespace, "infer-1", 3)) == [
            "infer-1",
            "infer-1-1",
            "infer-1-2",
        ]


@pytest.mark.usefixtures("lws_on")
def test_an_exclusive_topology_replica_lands_in_one_rack(kube: Kube, namespace: str) -> None:
    """Racks of 2 and 3 free: the replica of 3 (exclusive-topology: the rack) takes r1 whole."""
    with racks(kube, {"r0": ("b0", 2), "r1": ("b0", 3)}) as rack_of:
        for worker in range(3):
            lws_pod(kube, namespace, "ex", 0, worker, 3, {LWS_EXCLUSIVE_ANNOTATION: RACK})
        bound = kube.wait_bound(namespace, "ex-0", 3)
        assert {rack_of[node] for node in bound.values()} == {"r1"}, bound


@pytest.mark.usefixtures("lws_on")
def test_lws_sub_groups_each_land_in_one_rack_inside_the_replicas_block(
    kube: Kube, namespace: str
) -> None:
    """Size 4 in sub-groups of 2: block b0 has racks of 3 and 1 (4 free, no 2 + 2), b1 racks of
    2 and 2: the replica goes to b1, each sub-group whole in one rack."""
    layout = {"a0": ("b0", 3), "a1": ("b0", 1), "c0": ("b1", 2), "c1": ("b1", 2)}
    with racks(kube, layout) as rack_of:
        annotations = {
            LWS_EXCLUSIVE_ANNOTATION: BLOCK,
            LWS_SUBGROUP_SIZE_ANNOTATION: "2",
            LWS_SUBGROUP_EXCLUSIVE_ANNOTATION: RACK,
        }
        for worker in range(4):
            lws_pod(kube, namespace, "sg", 0, worker, 4, annotations, subgroup=worker // 2)
        bound = kube.wait_bound(namespace, "sg-0", 4)
        first = one_rack(bound, rack_of, ("sg-0", "sg-0-1"))
        second = one_rack(bound, rack_of, ("sg-0-2", "sg-0-3"))
        assert {first, second} == {"c0", "c1"}, bound
        # No TopologyPlaced check here: with exclusive-topology the leader may be admitted
        # alone before our watch has delivered it (app/core/lws.py), and an objectless gang's
        # Events go to the members our cache knows as pending, so it may have none.


@pytest.mark.usefixtures("lws_on")
def test_a_size_that_is_not_a_number_holds_the_replica_with_the_fix(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 2)}):
        for worker in range(2):
            lws_pod(kube, namespace, "bad", 0, worker, "two")
        kube.wait_for_event(
            namespace,
            "bad-0",
            f"annotation {LWS_SIZE_ANNOTATION} must be a whole number >= 1, got 'two'",
            what="the FailedScheduling message naming the size annotation",
        )
        stays_unbound(kube, namespace)


def lws_exact_pod(
    kube: Kube, namespace: str, index: int, worker: int, size: int, rack: str | None = None
) -> None:
    """A replica's pod with exactly the metadata and spec LWS gives it under exclusive-topology:
    the leader (worker 0) with the pod webhook's affinity to its own group-key and
    anti-affinity to every other on the rack; a worker, created by LWS's controller only once
    the leader has a node, with a nodeSelector on the leader's rack (pod_controller.go)."""
    leader = f"exact-{index}"
    group_key = hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest()
    labels = {
        LWS_NAME_LABEL: "exact",
        LWS_GROUP_INDEX_LABEL: str(index),
        WORKER_INDEX: str(worker),
        GROUP_KEY: group_key,
        "leaderworkerset.sigs.k8s.io/template-revision-hash": "5d8f6c7b9",
    }
    annotations = {LWS_SIZE_ANNOTATION: str(size), LWS_EXCLUSIVE_ANNOTATION: RACK}
    name = leader if worker == 0 else f"{leader}-{worker}"
    body = kube.pod_body(name, cpu="1", labels=labels, annotations=annotations)
    if worker == 0:
        own = {"key": GROUP_KEY, "operator": "In", "values": [group_key]}
        others = [
            {"key": GROUP_KEY, "operator": "Exists"},
            {"key": GROUP_KEY, "operator": "NotIn", "values": [group_key]},
        ]
        body["spec"]["affinity"] = {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchExpressions": [own]}, "topologyKey": RACK}
                ]
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchExpressions": others}, "topologyKey": RACK}
                ]
            },
        }
    else:
        body["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/leader-name"] = leader
        assert rack is not None
        body["spec"]["nodeSelector"] = {RACK: rack}
    kube.core.create_namespaced_pod(namespace, body)


def replica_as_lws_creates_it(
    kube: Kube, namespace: str, index: int, size: int, rack_of: dict[str, str]
) -> str:
    """The leader alone, then (once it is bound) its workers on its rack; the replica's rack."""
    lws_exact_pod(kube, namespace, index, 0, size)
    leader = f"exact-{index}"
    node = kube.wait_bound(namespace, leader, 1)[leader]
    for worker in range(1, size):
        lws_exact_pod(kube, namespace, index, worker, size, rack_of[node])
    bound = kube.wait_bound(namespace, f"{leader}-", size - 1)
    assert {rack_of[n] for n in bound.values()} == {rack_of[node]}, bound
    return rack_of[node]


def extender_knows(extender: Extender, nodes: list[str]) -> None:
    """Until the extender's caches hold `nodes` (each node is created, then labelled: every
    node's label but the last one's is in by then)."""

    def known() -> bool:
        with urllib.request.urlopen(f"{extender.url}/debug/caches", timeout=5) as response:
            return set(nodes) <= set(json.loads(response.read())["nodes"])

    wait_for(known, 30, f"the extender knowing nodes {nodes}")


@pytest.mark.usefixtures("lws_on")
def test_exclusive_replicas_as_lws_creates_them_each_get_a_rack_of_their_own_with_room(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    """LWS creates an exclusive replica's workers only once its leader is bound, so the leader
    starts alone. Racks of 1, 4 and 5 free nodes, replicas of 2: the first leader goes to r1
    (the fullest with room for both, not r0, fullest of all, where its worker would never
    fit); the second to r2, not r1 though r1 still has room for 2: kube-scheduler's
    anti-affinity (set by LWS's webhook) would refuse it there."""
    # r0 last: once the extender knows its node, it knows r1's and r2's racks whole (a
    # partial r2 would look like the fullest rack).
    with racks(kube, {"r2": ("b0", 5), "r1": ("b0", 4), "r0": ("b0", 1)}) as rack_of:
        extender_knows(extender, list(rack_of))
        assert replica_as_lws_creates_it(kube, namespace, 0, 2, rack_of) == "r1"
        assert replica_as_lws_creates_it(kube, namespace, 1, 2, rack_of) == "r2"
        # A third finds no rack of its own with room for 2 (r0 lacks it, r1 and r2 are
        # taken): the leader stays pending with the reason.
        lws_exact_pod(kube, namespace, 2, 0, 2)
        kube.wait_for_event(
            namespace,
            "exact-2",
            f"gang lws:{namespace}/exact-2 needs one rack ({RACK}) of its own with room for "
            "all its 2 member(s)",
            "2 rack(s) hold another group, 1 lack the room",
            what="the leader's FailedScheduling naming the rack it lacks",
        )
        assert "exact-2" not in kube.bound(namespace)
