"""Devices the watches tell of late: a gang's last member before our pod watch has it, and
devices a claim gives back well after its pod ended (issue 49, found under load).

Against the arbiter and a ClusterState fed the API objects a driver, a user and
kube-controller-manager create.
"""

from __future__ import annotations

from typing import Any

from app.core.admission import FilterReason
from app.core.devices.records import selector_resource
from app.core.groups import GroupRef, GroupSpec
from app.core.state import ClusterState
from app.runtime.device_cel import CelEngine
from app.runtime.line import Candidate
from tests.unit import test_devices as dra
from tests.unit.builders import node, podgroup
from tests.unit.test_arbiter import Touches, World, settled


def _gpu_gang(world: World, name: str, members: int, template: str, *, skip: int = -1) -> None:
    world.state.apply_podgroup(podgroup(name, members))
    for i in range(members):
        if i != skip:
            raw = dra.gpu_pod(f"{name}-{i}", template_name=template, group=name, cpu="100m")
            world.state.apply_pod(raw)


def _allocated(name: str, pool: str, devices: int) -> dict[str, Any]:
    """A claim as kube-scheduler leaves it allocated (its pod ended, the controller not yet
    through with it)."""
    raw = dra.claim(name, dra.requests_of(devices))
    results = [
        {"request": "gpu", "driver": dra.DRIVER, "pool": pool, "device": f"gpu-{i}"}
        for i in range(devices)
    ]
    raw["status"] = {"allocation": {"devices": {"results": results}}}
    return raw


async def test_a_member_our_watch_has_not_delivered_counts_its_devices() -> None:
    """The sequence of a CI failure under load: a gang of 5 x 2 devices on a cluster of 8.
    The filter met the fifth member before our watch delivered it and counted it by its
    containers alone: 8 devices for 5 members fit, the gang was admitted, and its members
    took devices in kube-scheduler while they waited in the gate for one that never fits."""
    world = World()
    devices = world.state.devices
    devices.apply(dra.CLASSES, dra.device_class())
    for n in ("n0", "n1"):
        devices.apply(dra.SLICES, dra.resource_slice(f"{n}-gpus", n))
    devices.apply(dra.TEMPLATES, dra.template("two", dra.requests_of(2)))
    _gpu_gang(world, "big", 5, "two", skip=4)
    unseen = dra.gpu_pod("big-4", template_name="two", group="big", cpu="100m")
    assert "default/big-4" not in world.state.pods
    verdict = world.arbiter.admit(
        GroupSpec("default/big", 5),
        GroupRef("default", "big"),
        Candidate("default/big-4", unseen["metadata"]["uid"], 0, unseen["spec"]),
    )
    assert verdict.reason == FilterReason.INSUFFICIENT_CAPACITY, verdict
    assert verdict.message.startswith(
        "gang default/big needs 10 devices of class gpu.example.com, 8 free in the cluster"
    ), verdict.message
    assert world.arbiter.claims == {}


def test_unseen_requests_name_a_missing_template_and_count_a_new_selector_on_the_nodes() -> None:
    state = ClusterState(CelEngine())
    state.apply_node(node("n1"))
    devices = state.devices
    devices.apply(dra.CLASSES, dra.device_class())
    memories = ("80Gi", "16Gi", "40Gi", "8Gi")
    devices.apply(dra.SLICES, dra.resource_slice("n1-gpus", "n1", memories=memories))
    spec = dra.gpu_pod("p", template_name="absent", cpu="1")["spec"]
    requests = devices.unseen_requests("default", "default/p", spec)
    assert requests["cpu"] == 1000
    assert any("ResourceClaimTemplate default/absent not found" in r for r in requests)
    # A selector no pod in our watch asked for yet: the nodes count it from then on, as
    # when a delivered pod asks it first (else they would offer none of it for good).
    selector = f'device.capacity["{dra.DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
    devices.apply(dra.TEMPLATES, dra.template("big", dra.requests_of(2, selector=selector)))
    spec = dra.gpu_pod("q", template_name="big")["spec"]
    matching = selector_resource(dra.DRIVER, (selector,))
    assert devices.unseen_requests("default", "default/q", spec)[matching] == 2000
    assert state.nodes["n1"].allocatable[matching] == 2000


async def test_devices_a_claim_gives_back_late_wake_the_gang_waiting_for_them() -> None:
    """Found under load: a gang's pods ended, the line was looked at at once, but their
    claims still held the shared pool (kube-controller-manager clears them later); when it
    did, no pod changed, nothing looked at the line again, and the gang waiting for those
    devices sat in kube-scheduler's queue for good."""
    touches = Touches()
    world = World(touches=touches)
    devices = world.state.devices
    devices.apply(dra.CLASSES, dra.device_class())
    devices.apply(dra.SLICES, dra.resource_slice("shared", pool="shared", all_nodes=True))
    devices.apply(dra.CLAIMS, _allocated("ended-0", "shared", 3))
    devices.apply(dra.TEMPLATES, dra.template("one", dra.requests_of(1)))
    _gpu_gang(world, "b", 3, "one")
    spec = GroupSpec("default/b", 3)
    for member in ("b-0", "b-1", "b-2"):  # kube-scheduler tried each; each was turned away
        verdict = world.filter(spec, member)
        assert verdict.reason == FilterReason.INSUFFICIENT_CAPACITY, verdict
    assert "short by 2 device(s)" in verdict.message, verdict.message
    await settled(world)
    touches.pods.clear()  # the wake-ups of the members' creation
    for member in ("b-0", "b-1", "b-2"):  # kube-scheduler retried them: turned away again
        assert world.filter(spec, member).reason == FilterReason.INSUFFICIENT_CAPACITY
    # kube-controller-manager clears the allocation: the pool is whole again.
    devices.apply(dra.CLAIMS, dra.claim("ended-0", dra.requests_of(3)))
    await settled(world)
    assert sorted(touches.pods) == ["b-0", "b-1", "b-2"]
    assert world.filter(spec, "b-0").reason == FilterReason.CLAIMED


def test_only_devices_given_back_tell_the_node_listeners() -> None:
    state = ClusterState()
    told: list[int] = []
    state.add_node_listener(lambda: told.append(1))
    devices = state.devices
    devices.apply(dra.CLASSES, dra.device_class())
    devices.apply(dra.CLAIMS, dra.claim("c", dra.requests_of(2)))
    devices.apply(dra.CLAIMS, dra.claim("c", dra.requests_of(2), allocated=2))
    assert told == []  # allocated: nothing given back
    devices.apply(dra.CLAIMS, dra.claim("c", dra.requests_of(2), allocated=2))
    assert told == []
    devices.apply(dra.CLAIMS, dra.claim("c", dra.requests_of(2), allocated=1))
    assert told == [1]  # one device given back
    devices.delete(dra.CLAIMS, dra.claim("c", dra.requests_of(2), allocated=1))
    assert told == [1, 1]  # deleted while allocated
    devices.delete(dra.CLAIMS, dra.claim("d", dra.requests_of(2)))
    assert told == [1, 1]
