"""GPU gangs through Dynamic Resource Allocation (issue 47), end to end.

The tests publish devices the way a DRA driver does (a DeviceClass, one
ResourceSlice per node with its pool, generation and devices); no driver or
kubelet is needed for kube-scheduler's DynamicResources plugin to allocate
the claims, and kube-controller-manager's resourceclaim controller makes each
pod's claim from its ResourceClaimTemplate. Every assertion is on what the
API server shows: bindings, the claims' allocations, events.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from local_cluster.podsim import EXIT_AFTER_ANNOTATION

from app.core.groups import VOLCANO_GROUP_ANNOTATIONS, XK8S_API
from app.core.topology.domains import HOSTNAME
from app.core.topology.sources import KUEUE_REQUIRED
from hack.clusterkit import create_group, wait_for
from tests.cluster.kube import HIGH, LOW, Kube
from tests.cluster.session import Extender
from tests.soak.components import pid_of

GROUP, VERSION = "resource.k8s.io", "v1"
DEVICES_PER_NODE = 4
RACK = "example.com/rack"


class Devices:
    """One test's DeviceClass and ResourceSlices (cluster-wide objects, deleted afterwards)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        # A driver (and class) of the test's own: cluster-wide names must not meet.
        self.driver = f"gpu.{namespace}.example.com"
        self.device_class = self.driver
        self.slices: list[str] = []

    def create_class(self) -> None:
        self.kube.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "deviceclasses",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "DeviceClass",
                "metadata": {"name": self.device_class},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{self.driver}"'}}]
                },
            },
        )

    def publish(self, node: str, count: int = DEVICES_PER_NODE, memory: str = "80Gi") -> None:
        """The node's pool as a driver publishes it: one slice, generation 1."""
        name = f"{node}-{self.namespace}"[:63]
        devices = [
            {
                "name": f"gpu-{i}",
                "attributes": {"model": {"string": "test-gpu"}, "index": {"int": i}},
                "capacity": {"memory": {"value": memory}},
            }
            for i in range(count)
        ]
        self.kube.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "resourceslices",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": self.driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            },
        )
        self.slices.append(name)

    def publish_shared(
        self,
        name: str,
        count: int,
        labels: dict[str, str] | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """A pool every node may use (allNodes), or those with `labels` (nodeSelector), as
        a driver of network-attached devices (each with `attributes`, if given)."""
        slice_name = f"{name}-{self.namespace}"[:63]
        described = {"attributes": attributes} if attributes else {}
        serves: dict[str, Any] = {"allNodes": True}
        if labels:
            terms = [{"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]
            serves = {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": terms}]}}
        self.kube.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "resourceslices",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name},
                "spec": {
                    "driver": self.driver,
                    **serves,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"shared-{i}", **described} for i in range(count)],
                },
            },
        )
        self.slices.append(slice_name)

    def template(self, name: str, count: int, selector: str | None = None) -> None:
        exactly: dict[str, Any] = {"deviceClassName": self.device_class, "count": count}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        self.kube.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "resourceclaimtemplates",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
            },
        )

    def pod(
        self,
        name: str,
        group: str | None,
        template: str,
        exit_after: float | None = None,
        *,
        volcano: bool = False,
        priority_class: str | None = None,
        node: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        body = self.kube.pod_body(
            name,
            group=None if volcano else group,
            annotations={VOLCANO_GROUP_ANNOTATIONS[0]: group} if volcano and group else None,
            cpu="100m",
            priority_class=priority_class,
        )
        if node is not None:
            body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        if labels is not None:
            body["spec"]["nodeSelector"] = labels
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        if exit_after is not None:
            body["metadata"].setdefault("annotations", {})[EXIT_AFTER_ANNOTATION] = (
                f"{exit_after:g}"
            )
        self.kube.core.create_namespaced_pod(self.namespace, body)

    def claims(self) -> list[dict[str, Any]]:
        listed = self.kube.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "resourceclaims"
        )
        return list(listed.get("items") or [])

    def allocated(self, prefix: str) -> list[tuple[str, str]]:
        """(pool, device) of every device allocated to the claims of pods named prefix*."""
        out = []
        for claim in self.claims():
            owners = (claim.get("metadata") or {}).get("ownerReferences") or []
            if not any(o.get("name", "").startswith(prefix) for o in owners):
                continue
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                out.append((result["pool"], result["device"]))
        return out

    def delete(self) -> None:
        for name in self.slices:
            _delete(
                lambda n=name: self.kube.custom.delete_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", n
                )
            )
        _delete(
            lambda: self.kube.custom.delete_cluster_custom_object(
                GROUP, VERSION, "deviceclasses", self.device_class
            )
        )


def _delete(call: Any) -> None:
    try:
        call()
    except ApiException as err:
        if err.status != 404:
            raise


@pytest.fixture
def gpu_nodes(kube: Kube, namespace: str) -> Iterator[tuple[Devices, list[str]]]:
    """Four nodes of the test's own, two of them publishing four devices each (8 in all)."""
    devices = Devices(kube, namespace)
    devices.create_class()
    with kube.nodes_of_its_own() as created:
        for i in range(4):
            name = f"dra-{i}"
            kube.create_node(name, cpu="8")
            created.append(name)
        for name in created[:2]:
            devices.publish(name)
        try:
            yield devices, created
        finally:
            kube.delete_pods_now(namespace)
            devices.delete()


def _bound(kube: Kube, namespace: str, prefix: str) -> set[str]:
    return {n for n in kube.bound(namespace) if n.startswith(prefix)}


def test_two_device_gangs_created_interleaved_one_runs_whole_the_other_after_it(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]]
) -> None:
    """3 pods x 2 devices each, twice, on 8 devices: never both partly."""
    devices, _nodes = gpu_nodes
    devices.template("two-gpus", 2)
    for gang in ("a", "b"):
        kube.create_podgroup(namespace, gang, 3)
    for i in range(3):
        for gang in ("a", "b"):
            devices.pod(f"{gang}-{i}", gang, "two-gpus", exit_after=10)

    def one_whole() -> str | None:
        for gang in ("a", "b"):
            if len(_bound(kube, namespace, f"{gang}-")) == 3:
                return gang
        return None

    winner = wait_for(one_whole, 40, "one device gang fully bound")
    loser = "b" if winner == "a" else "a"
    # While the winner runs, the loser has nothing bound and no device allocated.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert not _bound(kube, namespace, f"{loser}-"), "the second gang bound partly"
        assert not devices.allocated(f"{loser}-"), "the second gang holds devices"
        time.sleep(0.5)
    assert len(devices.allocated(f"{winner}-")) == 6
    # The winner's pods end (exit-after); the loser then runs whole.
    wait_for(
        lambda: len(_bound(kube, namespace, f"{loser}-")) == 3,
        90,
        "the second device gang bound whole after the first ended",
    )
    assert len(devices.allocated(f"{loser}-")) == 6


def test_a_gang_asking_more_devices_than_exist_holds_none_and_a_smaller_one_runs_at_once(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    devices, nodes = gpu_nodes
    devices.template("two-gpus", 2)

    # What the extender sees: the two pools, 8 devices of the class, all free.
    def caches() -> Any:
        with urllib.request.urlopen(f"{extender.url}/debug/caches", timeout=5) as response:
            seen = json.loads(response.read())["devices"]
        row = seen["classes"].get(devices.device_class) or {}
        return row.get("free") == 8 and seen

    seen = wait_for(caches, 10, "the extender's caches showing the 8 devices")
    for node in nodes[:2]:
        assert seen["pools"][f"{devices.driver}/{node}"]["devices"] == DEVICES_PER_NODE
    assert seen["classes"][devices.device_class]["free"] == 8
    labels = {"device_class": devices.device_class}
    assert extender.sample("gang_extender_devices", **labels, state="free") == 8
    kube.create_podgroup(namespace, "big", 5)
    for i in range(5):
        devices.pod(f"big-{i}", "big", "two-gpus")
    message = wait_for(
        lambda: next(
            (
                e
                for i in range(5)
                for e in kube.events(namespace, f"big-{i}")
                if f"devices of class {devices.device_class}" in e
            ),
            None,
        ),
        30,
        "the big gang told which devices it lacks",
    )
    # The words: the class, what the gang needs, what the cluster has free.
    assert (
        f"gang {namespace}/big needs 10 devices of class {devices.device_class}, "
        "8 free in the cluster"
    ) in message, message

    time.sleep(3)
    kube.create_podgroup(namespace, "small", 2)
    created = time.monotonic()
    for i in range(2):
        devices.pod(f"small-{i}", "small", "two-gpus")
    # The big gang holds nothing meanwhile: no member waits in the gate with devices.
    while len(_bound(kube, namespace, "small-")) < 2:
        assert not devices.allocated("big-"), "the big gang holds devices"
        assert not _bound(kube, namespace, "big-")
        assert time.monotonic() - created < 30, "the small gang did not run"
        time.sleep(0.3)
    elapsed = time.monotonic() - created
    assert len(devices.allocated("small-")) == 4
    assert not _bound(kube, namespace, "big-")
    print(f"\nsmall device gang bound {elapsed:.1f}s after its pods were created")


def test_a_cel_selector_counts_only_the_devices_it_matches(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]]
) -> None:
    """Node dra-2 publishes 4 devices of 16Gi: 12 devices, 8 of them with 40Gi or more."""
    devices, nodes = gpu_nodes
    devices.publish(nodes[2], memory="16Gi")
    selector = f'device.capacity["{devices.driver}"].memory.compareTo(quantity("40Gi")) >= 0'
    devices.template("big-memory", 2, selector)
    # 5 x 2 = 10 matching devices wanted, 8 match (12 exist): refused, nothing held.
    kube.create_podgroup(namespace, "wide", 5)
    for i in range(5):
        devices.pod(f"wide-{i}", "wide", "big-memory")
    wait_for(
        lambda: any(
            f"needs 10 devices of class {devices.device_class}, 8 free in the cluster "
            "(devices passing its requests' selectors)" in e
            for i in range(5)
            for e in kube.events(namespace, f"wide-{i}")
        ),
        30,
        "the gang told it lacks matching devices",
    )
    assert not devices.allocated("wide-")
    assert not _bound(kube, namespace, "wide-")
    for i in range(5):
        kube.core.delete_namespaced_pod(f"wide-{i}", namespace, grace_period_seconds=0)
    # 4 x 2 = 8: fits, and only on the 80Gi devices.
    kube.create_podgroup(namespace, "fits", 4)
    for i in range(4):
        devices.pod(f"fits-{i}", "fits", "big-memory")
    wait_for(
        lambda: len(_bound(kube, namespace, "fits-")) == 4, 40, "the matching gang bound whole"
    )
    pools = {pool for pool, _device in devices.allocated("fits-")}
    assert pools == set(nodes[:2]), pools
    assert len(devices.allocated("fits-")) == 8


def test_a_queue_device_capability_holds(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]]
) -> None:
    """A queue capped at 4 devices of the class (named bare, as a capability reads best):
    of two gangs of 2 x 2 devices on 8 devices, one runs, the other waits for it."""
    devices, _nodes = gpu_nodes
    queue = f"gpus-{namespace}"[:63]
    kube.create_queue(queue, capability={devices.device_class: "4"})
    try:
        devices.template("two-gpus", 2)
        for gang in ("first", "second"):
            kube.create_volcano_podgroup(namespace, gang, 2, queue=queue)
        for gang, exit_after in (("first", 8.0), ("second", None)):
            for i in range(2):
                devices.pod(f"{gang}-{i}", gang, "two-gpus", exit_after, volcano=True)
            if gang == "first":
                wait_for(
                    lambda: len(_bound(kube, namespace, "first-")) == 2, 40, "the first gang bound"
                )
        wait_for(
            lambda: any(
                "capability" in e and f"device(s) of class {devices.device_class}" in e
                for i in range(2)
                for e in kube.events(namespace, f"second-{i}")
            ),
            30,
            "the second gang told the queue's device capability holds it",
        )
        assert not _bound(kube, namespace, "second-")
        assert not devices.allocated("second-")
        wait_for(
            lambda: len(_bound(kube, namespace, "second-")) == 2,
            60,
            "the second gang bound once the first ended",
        )
    finally:
        kube.delete_pods_now(namespace)
        kube.delete_queue(queue)


def test_an_extended_resource_backed_by_a_device_class_counts_its_devices(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]]
) -> None:
    """DeviceClass extendedResourceName (GA in 1.37): pods asking `<name>: 2` take the
    class's devices; no node advertises the name, the 8 devices are all there is."""
    devices, _nodes = gpu_nodes
    resource = f"{devices.driver}/gpu"
    kube.custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "deviceclasses",
        devices.device_class,
        {"spec": {"extendedResourceName": resource}},
    )

    def create(gang: str, members: int) -> None:
        kube.create_podgroup(namespace, gang, members)
        for i in range(members):
            body = kube.pod_body(f"{gang}-{i}", group=gang, cpu="100m")
            body["spec"]["containers"][0]["resources"]["limits"] = {resource: "2"}
            body["spec"]["containers"][0]["resources"]["requests"][resource] = "2"
            kube.core.create_namespaced_pod(namespace, body)

    create("big", 5)
    message = wait_for(
        lambda: next(
            (e for i in range(5) for e in kube.events(namespace, f"big-{i}") if "short by" in e),
            None,
        ),
        30,
        "the big gang told what it lacks",
    )
    assert f"short by {resource} 2" in message, message
    create("small", 2)
    wait_for(lambda: len(_bound(kube, namespace, "small-")) == 2, 40, "the small gang bound")
    assert not _bound(kube, namespace, "big-")


@pytest.mark.usefixtures("priorities")
def test_a_high_priority_device_gang_evicts_the_fewest_device_holders(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]]
) -> None:
    """dra-0's 4 devices are held by 2 pods (2 each), dra-1's by 4 (1 each): a gang of
    2 x 2 devices needs one node's worth, and takes dra-0's (2 victims, not 4).

    kube-scheduler starts no preemption for a pod short of devices (its
    DynamicResources plugin says UnschedulableAndUnresolvable): the extender
    does (app/runtime/preemption/unasked.py)."""
    devices, nodes = gpu_nodes
    devices.template("one-gpu", 1)
    devices.template("two-gpus", 2)
    for i in range(2):
        devices.pod(f"pair-{i}", None, "two-gpus", priority_class=LOW, node=nodes[0])
    for i in range(4):
        devices.pod(f"single-{i}", None, "one-gpu", priority_class=LOW, node=nodes[1])
    before = wait_for(
        lambda: len(kube.bound(namespace)) == 6 and kube.bound(namespace),
        40,
        "the low-priority device holders bound",
    )
    kube.create_podgroup(namespace, "urgent", 2, timeout=60)
    for i in range(2):
        devices.pod(f"urgent-{i}", "urgent", "two-gpus", priority_class=HIGH)
    after = wait_for(
        lambda: len(_bound(kube, namespace, "urgent-")) == 2 and kube.bound(namespace),
        90,
        "the high-priority device gang bound whole",
    )
    evicted = set(before) - set(after)
    assert evicted == {"pair-0", "pair-1"}, (evicted, before, after)
    assert {after["urgent-0"], after["urgent-1"]} == {nodes[0]}
    assert len(devices.allocated("urgent-")) == 4


def test_bad_device_input_holds_the_gang_with_a_clear_message(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]]
) -> None:
    """A gang one of whose members names a missing DeviceClass: kube-scheduler turns
    that member away itself ("device class ... does not exist"), and the extender holds
    its sibling, which could get a device, with a message naming what is missing;
    nothing of the gang is bound or allocated (never a 500: every call is answered).
    A selector that does not compile is refused by the API server."""
    devices, _nodes = gpu_nodes
    missing = f"missing.{namespace}.example.com"
    devices.template("one-gpu", 1)
    exactly = {"deviceClassName": missing, "count": 1}
    kube.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "no-class"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
        },
    )
    kube.create_podgroup(namespace, "lost", 2)
    devices.pod("lost-0", "lost", "one-gpu")
    devices.pod("lost-1", "lost", "no-class")
    wanted = (
        f"gang {namespace}/lost is held: its members cannot be given devices: "
        f"DeviceClass {missing} not found"
    )
    wait_for(
        lambda: any(wanted in e for e in kube.events(namespace, "lost-0")),
        30,
        "the member that could get a device told its sibling's class is missing",
    )
    wait_for(
        lambda: any(f"{missing} does not exist" in e for e in kube.events(namespace, "lost-1")),
        30,
        "kube-scheduler's own word on the member naming the missing class",
    )
    assert not _bound(kube, namespace, "lost-")
    assert not devices.allocated("lost-")
    # A selector that does not compile never reaches a gang: the API server compiles it
    # when the template is created and refuses it, saying where (the extender's own
    # library counts any selector it cannot compile by class: app/core/devices/selectors.py).
    with pytest.raises(ApiException) as refused:
        devices.template("bad-selector", 1, "device.(")
    assert refused.value.status == 422
    assert "cel.expression" in str(refused.value.body)
    assert "compilation failed" in str(refused.value.body)


def test_a_device_gang_required_in_one_rack_goes_to_the_rack_with_its_devices(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    """Racks A (dra-0: 4 devices, dra-2: 2) and B (dra-1: 4, dra-3: 4): a gang of
    2 x 3 devices required in one rack fits by CPU in either, and A has the 6 devices
    in all (the fullest rack that may hold it, tried first), but only dra-0 has 3 of
    them: the gang fits by devices only in B, and runs whole there."""
    devices, nodes = gpu_nodes
    devices.publish(nodes[2], count=2)
    devices.publish(nodes[3])
    for i, node in enumerate(nodes):
        kube.label_node(node, {RACK: "a" if i % 2 == 0 else "b"})
    previous = extender.extra_args
    extender.restart(*previous, "--topology-levels", f"{HOSTNAME},{RACK}")
    try:
        devices.template("three-gpus", 3)
        create_group(
            kube.custom, XK8S_API, namespace, "racked", {"minMember": 2}, {KUEUE_REQUIRED: RACK}
        )
        for i in range(2):
            devices.pod(f"racked-{i}", "racked", "three-gpus")
        bound = wait_for(
            lambda: (b := _bound_on(kube, namespace, "racked-")) and len(b) == 2 and b,
            60,
            "the device gang bound whole in one rack",
        )
        assert set(bound.values()) == {nodes[1], nodes[3]}, bound
        assert {pool for pool, _device in devices.allocated("racked-")} == {nodes[1], nodes[3]}
    finally:
        kube.delete_pods_now(namespace)
        extender.restart(*previous)


def _bound_on(kube: Kube, namespace: str, prefix: str) -> dict[str, str]:
    return {p: n for p, n in kube.bound(namespace).items() if p.startswith(prefix)}


def _pool_in_caches(extender: Extender, devices: Devices, name: str) -> Any:
    """The pool as the extender's /debug/caches shows it, once it does."""

    def seen() -> Any:
        with urllib.request.urlopen(f"{extender.url}/debug/caches", timeout=5) as response:
            pools = json.loads(response.read())["devices"]["pools"]
        return pools.get(f"{devices.driver}/{name}")

    return wait_for(seen, 10, f"the extender's caches showing the pool {name}")


def test_a_pool_for_all_nodes_counts_once_for_the_gang(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    """dra-0 and dra-1 have 4 devices each, and a pool of 4 serves all nodes: 12 devices,
    though each of the 4 nodes is offered the pool's 4 (24 summed). A gang of 4 x 4 (16)
    is held, told the cluster has 12, and holds none of them."""
    devices, _nodes = gpu_nodes
    devices.publish_shared("fabric", 4)

    pool = _pool_in_caches(extender, devices, "fabric")
    assert pool["node"] == "all nodes" and pool["devices"] == 4, pool
    devices.template("four-gpus", 4)
    kube.create_podgroup(namespace, "wide", 4)
    for i in range(4):
        devices.pod(f"wide-{i}", "wide", "four-gpus")
    wanted = (
        f"gang {namespace}/wide needs 16 devices of class {devices.device_class}, "
        "12 free in the cluster"
    )
    wait_for(
        lambda: any(wanted in e for i in range(4) for e in kube.events(namespace, f"wide-{i}")),
        30,
        "the gang told the cluster's devices, the shared pool counted once",
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert not devices.allocated("wide-"), "the gang holds devices"
        assert not _bound(kube, namespace, "wide-")
        time.sleep(0.5)


def test_a_gang_on_two_nodes_sharing_a_pool_is_not_promised_it_twice(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    """dra-2 and dra-3 (rack r1) share a nodeSelector pool of 4; dra-0 and dra-1 have 4
    each of their own (12 in the cluster). A gang of 2 x 3 devices that must run in r1
    fits the cluster's count, and each r1 node shows the pool's 4, but the pool has 4:
    not admitted, holds nothing, and told the devices it lacks there. A gang of
    2 x 2 in r1 runs whole, one member on each node or both on one."""
    devices, nodes = gpu_nodes
    rack = {RACK: "r1"}
    for node in nodes[2:]:
        kube.label_node(node, {RACK: "r1"})
    devices.publish_shared("rack-r1", 4, rack)

    pool = _pool_in_caches(extender, devices, "rack-r1")
    assert pool["node"] == "node selector" and pool["devices"] == 4, pool
    devices.template("three-gpus", 3)
    kube.create_podgroup(namespace, "wide", 2)
    for i in range(2):
        devices.pod(f"wide-{i}", "wide", "three-gpus", labels=rack)
    wanted = f"short by 2 device(s) of class {devices.device_class}"
    message = wait_for(
        lambda: next(
            (e for i in range(2) for e in kube.events(namespace, f"wide-{i}") if wanted in e),
            None,
        ),
        30,
        "the gang told the rack's pool lacks 2 devices",
    )
    assert f"gang {namespace}/wide needs 2 more member(s) placed at once" in message, message
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert not devices.allocated("wide-"), "the gang holds devices of the pool"
        assert not _bound(kube, namespace, "wide-")
        time.sleep(0.5)
    kube.delete_pods_now(namespace)
    devices.template("two-gpus", 2)
    kube.create_podgroup(namespace, "fits", 2)
    for i in range(2):
        devices.pod(f"fits-{i}", "fits", "two-gpus", labels=rack)
    bound = wait_for(
        lambda: (b := _bound_on(kube, namespace, "fits-")) and len(b) == 2 and b,
        60,
        "the gang of 2 x 2 bound whole in the rack",
    )
    assert set(bound.values()) <= set(nodes[2:]), bound
    assert {pool for pool, _device in devices.allocated("fits-")} == {"rack-r1"}


def test_a_member_on_a_node_served_by_two_pools_leaves_the_pool_its_sibling_needs(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    """Pool a (1 device) serves dra-2 and dra-3 (rack r1); pool b (2 devices) serves dra-2
    alone. A gang of two: x on dra-2 asks 2 devices of b's (a selector on their fabric), y
    on dra-3 asks 1 device, which only a can give. Both pools serve dra-2, and a fixed
    order (a first) drew x's devices of the class from a, left y none and held the gang for
    good; drawn as a flow, x's come from b and the gang runs whole, each on its pool."""
    devices, nodes = gpu_nodes
    for node in nodes[2:]:
        kube.label_node(node, {RACK: "r1"})
    kube.label_node(nodes[2], {"example.com/fabric-b": "yes"})
    devices.publish_shared("a", 1, {RACK: "r1"}, {"fabric": {"string": "a"}})
    devices.publish_shared("b", 2, {"example.com/fabric-b": "yes"}, {"fabric": {"string": "b"}})
    _pool_in_caches(extender, devices, "a")
    _pool_in_caches(extender, devices, "b")
    devices.template("two-of-b", 2, f'device.attributes["{devices.driver}"].fabric == "b"')
    devices.template("one-gpu", 1)
    kube.create_podgroup(namespace, "pair", 2)
    devices.pod("pair-x", "pair", "two-of-b", node=nodes[2])
    devices.pod("pair-y", "pair", "one-gpu", node=nodes[3])
    bound = wait_for(
        lambda: (b := _bound_on(kube, namespace, "pair-")) and len(b) == 2 and b,
        60,
        "the gang bound whole, each member on a pool of its node",
    )
    assert bound == {"pair-x": nodes[2], "pair-y": nodes[3]}, bound
    assert sorted(pool for pool, _device in devices.allocated("pair-x")) == ["b", "b"]
    assert [pool for pool, _device in devices.allocated("pair-y")] == ["a"]


@pytest.mark.usefixtures("priorities")
def test_a_device_gang_evicts_the_fewest_holders_of_a_shared_pool_it_needs(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    """dra-2 and dra-3 (rack r1) share a nodeSelector pool of 6 (network-attached devices),
    held 2 each by three low-priority pods; dra-0's own 4 are held by a low-priority pod
    the gang cannot use. A high-priority gang of 2 x 2 that must run in r1 needs 4 of the
    pool's devices: two of its holders go (not three, and not the bystander), and the
    gang runs whole on the pool.

    Each node shows the whole pool: read node by node, a plan saw it free on the node its
    holders were not on and evicted nobody, and the gang waited for ever."""
    devices, nodes = gpu_nodes
    rack = {RACK: "r1"}
    for node in nodes[2:]:
        kube.label_node(node, {RACK: "r1"})
    devices.publish_shared("rack-r1", 6, rack)
    _pool_in_caches(extender, devices, "rack-r1")
    devices.template("two-gpus", 2)
    devices.template("four-gpus", 4)
    devices.pod("bystander", None, "four-gpus", priority_class=LOW, node=nodes[0])
    for i in range(3):
        devices.pod(f"holder-{i}", None, "two-gpus", priority_class=LOW, labels=rack)
    before = wait_for(
        lambda: len(kube.bound(namespace)) == 4 and kube.bound(namespace),
        40,
        "the low-priority device holders bound",
    )
    assert {pool for pool, _device in devices.allocated("holder-")} == {"rack-r1"}
    assert len(devices.allocated("holder-")) == 6
    kube.create_podgroup(namespace, "urgent", 2, timeout=60)
    for i in range(2):
        devices.pod(f"urgent-{i}", "urgent", "two-gpus", priority_class=HIGH, labels=rack)
    after = wait_for(
        lambda: len(_bound(kube, namespace, "urgent-")) == 2 and kube.bound(namespace),
        90,
        "the high-priority device gang bound whole on the shared pool",
    )
    evicted = set(before) - set(after)
    assert len(evicted) == 2 and evicted < {f"holder-{i}" for i in range(3)}, (evicted, after)
    assert "bystander" in after
    assert {after["urgent-0"], after["urgent-1"]} <= set(nodes[2:]), after
    assert {pool for pool, _device in devices.allocated("urgent-")} == {"rack-r1"}
    assert len(devices.allocated("urgent-")) == 4


def _rack_pool_for_two_gangs(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> dict[str, str]:
    """dra-2 and dra-3 in rack r1 with a pool of 4 devices for the rack, a template of one
    device, PodGroups a and b of 3; returns the rack's node selector."""
    devices, nodes = gpu_nodes
    rack = {RACK: "r1"}
    for node in nodes[2:]:
        kube.label_node(node, {RACK: "r1"})
    devices.publish_shared("rack-r1", 4, rack)
    _pool_in_caches(extender, devices, "rack-r1")
    devices.template("one-gpu", 1)
    for gang in ("a", "b"):
        kube.create_podgroup(namespace, gang, 3)
    return rack


def test_two_gangs_needing_most_of_a_shared_pool_are_not_both_promised_it(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    """dra-2 and dra-3 (rack r1) share a nodeSelector pool of 4 (12 devices in the cluster,
    so the whole-gang count lets both by). Two gangs of 3 x 1 device that must run in r1,
    members created interleaved: the first admitted holds its 3 of the pool, the second is
    told the device it lacks and holds nothing (never admitted to wait in the gate for
    devices the first has), and runs whole once the first ends."""
    devices, _nodes = gpu_nodes
    rack = _rack_pool_for_two_gangs(kube, namespace, gpu_nodes, extender)
    for i in range(3):
        for gang in ("a", "b"):
            devices.pod(f"{gang}-{i}", gang, "one-gpu", exit_after=15, labels=rack)

    def one_whole() -> str | None:
        for gang in ("a", "b"):
            if len(_bound(kube, namespace, f"{gang}-")) == 3:
                return gang
        return None

    winner = wait_for(one_whole, 40, "one gang bound whole on the shared pool")
    loser = "b" if winner == "a" else "a"
    assert {pool for pool, _device in devices.allocated(f"{winner}-")} == {"rack-r1"}
    wanted = f"short by 1 device(s) of class {devices.device_class}"
    message = wait_for(
        lambda: next(
            (e for i in range(3) for e in kube.events(namespace, f"{loser}-{i}") if wanted in e),
            None,
        ),
        20,
        "the second gang told the device the pool lacks",
    )
    assert f"gang {namespace}/{loser} needs 3 more member(s) placed at once" in message, message
    # While the first runs (its pods end 15 s after they start), the second holds nothing.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert not _bound(kube, namespace, f"{loser}-"), "the second gang bound partly"
        assert not devices.allocated(f"{loser}-"), "the second gang holds devices"
        time.sleep(0.5)
    wait_for(
        lambda: len(_bound(kube, namespace, f"{loser}-")) == 3,
        60,
        "the second gang bound whole after the first ended",
    )
    assert {pool for pool, _device in devices.allocated(f"{loser}-")} == {"rack-r1"}


@contextlib.contextmanager
def _controller_manager_paused() -> Iterator[None]:
    """kube-controller-manager stopped (SIGSTOP) until the block ends: its resourceclaim
    controller frees the claims of ended pods late, as on a loaded machine."""
    pid = pid_of("kube-controller-manager")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_gang_waiting_for_a_shared_pool_runs_once_the_ended_pods_claims_are_freed(
    kube: Kube, namespace: str, gpu_nodes: tuple[Devices, list[str]], extender: Extender
) -> None:
    """Found under load (issue 49): the first gang's pods ended, the line was looked at at
    once, but their claims still held the pool (kube-controller-manager frees them after the
    pods end, here seconds later). When it did, no pod changed and the second gang, turned
    away for want of those devices, was never tried again. (The pool has 4 devices, the
    first gang takes 3: kube-scheduler lets each member of the second by, we hold it.)"""
    devices, _nodes = gpu_nodes
    rack = _rack_pool_for_two_gangs(kube, namespace, gpu_nodes, extender)
    for i in range(3):
        devices.pod(f"a-{i}", "a", "one-gpu", exit_after=12, labels=rack)
    wait_for(lambda: len(_bound(kube, namespace, "a-")) == 3, 40, "the first gang bound whole")
    for i in range(3):
        devices.pod(f"b-{i}", "b", "one-gpu", labels=rack)
    wanted = f"short by 1 device(s) of class {devices.device_class}"
    wait_for(
        lambda: any(wanted in e for i in range(3) for e in kube.events(namespace, f"b-{i}")),
        20,
        "the second gang told the pool has 1 of its 3 devices",
    )
    with _controller_manager_paused():

        def ended() -> bool:
            phases = {p.metadata.name: p.status.phase for p in kube.pods(namespace)}
            return all(phases.get(f"a-{i}") == "Succeeded" for i in range(3))

        wait_for(ended, 40, "the first gang's pods ended")
        # The pods' end was looked at: still short, their claims hold the pool.
        time.sleep(3)
        assert len(devices.allocated("a-")) == 3
        assert not _bound(kube, namespace, "b-"), "the second gang bound on devices held"
    wait_for(
        lambda: len(_bound(kube, namespace, "b-")) == 3,
        30,
        "the second gang bound whole once the claims were freed",
    )
