"""A gang admitted ahead in line holds its share of a shared device pool (issue 47).

A claim (app/runtime/claims.py) took its members' nodes' room off the bins,
but a pool published for many nodes is no one node's: every node it serves
showed it whole, so a gang decided after could be promised the same pooled
devices on another node, go into the permit gate and time out there. The
claim's share of each pool (drawn as its packing drew it) is now the pool's
no more until its members are bound (app/core/devices/shared.py).
"""

from __future__ import annotations

from typing import Any

from app.core.admission import FilterReason
from app.core.groups import GroupSpec
from tests.unit import test_devices as dra
from tests.unit.builders import podgroup
from tests.unit.test_arbiter import World


def _world() -> World:
    """n0 and n1 (rack r1) share a nodeSelector pool of 4; n2 has 4 devices of its own
    (8 in the cluster, so the whole-gang count of devices lets both gangs by)."""
    world = World()
    dra.rack_nodes(world.state, ("n0", "n1"), ())
    devices = world.state.devices
    devices.apply(dra.CLASSES, dra.device_class())
    devices.apply(dra.SLICES, dra.resource_slice("rack", selector=dra.RACK))
    devices.apply(dra.SLICES, dra.resource_slice("n2-gpus", "n2"))
    devices.apply(dra.TEMPLATES, dra.template("one", dra.requests_of(1)))
    return world


def _gang(world: World, name: str) -> GroupSpec:
    """3 members of 1 device each, that must run in the rack: 3 of the pool's 4."""
    world.state.apply_podgroup(podgroup(name, 3))
    for i in range(3):
        raw: Any = dra.gpu_pod(f"{name}-{i}", template_name="one", group=name, cpu="1")
        raw["spec"]["nodeSelector"] = {"rack": "r1"}
        world.state.apply_pod(raw)
    return GroupSpec(f"default/{name}", 3)


def test_two_gangs_needing_3_of_a_pool_of_4_are_not_both_promised_it() -> None:
    world = _world()
    a, b = _gang(world, "a"), _gang(world, "b")
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    (rack,) = {p for bin_ in world.state.room() for p in bin_.pools}
    assert rack.free == {dra.GPU: 1000}  # the claim's 3 are the pool's no more
    verdict = world.filter(b, "b-0")
    assert not verdict.admitted and verdict.reason == FilterReason.INSUFFICIENT_CAPACITY
    assert "default/b" not in world.arbiter.claims
    assert world.gate.waiting("default/b") == []
    assert verdict.message.startswith("gang default/b needs 3 more member(s) placed at once")
    # Its first member fits (the pool's last device), the second finds none.
    assert "but only 1 fit in the free capacity" in verdict.message, verdict.message
    assert verdict.message.endswith(f"short by 1 device(s) of class {dra.DRIVER}")
    # a's claim ends (its gang gone): the pool is whole again, and b is admitted.
    for i in range(3):
        world.state.delete_pod("default", f"a-{i}")
    world.state.delete_podgroup("default", "a")
    world.arbiter.ledger.end("default/a")
    (rack,) = {p for bin_ in world.state.room() for p in bin_.pools}
    assert rack.free == {dra.GPU: 4000}
    assert world.filter(b, "b-1").reason == FilterReason.CLAIMED


def test_a_member_bound_with_its_devices_allocated_is_counted_by_its_claim_not_twice() -> None:
    """Once a member's claim is allocated, the pool counts its devices as allocated; its
    gang's promise covers only the members still on their way."""
    world = _world()
    a = _gang(world, "a")
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    (rack,) = {p for bin_ in world.state.room() for p in bin_.pools}
    assert rack.free == {dra.GPU: 1000}
    claim = dra.claim("a-0-gpu", dra.requests_of(1))
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": dra.DRIVER, "pool": "rack", "device": "gpu-0"}
                ]
            }
        }
    }
    world.state.devices.apply(dra.CLAIMS, claim)
    member: Any = dra.gpu_pod("a-0", template_name="one", group="a", cpu="1", node="n0")
    member["spec"]["nodeSelector"] = {"rack": "r1"}
    member["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "a-0-gpu"}]
    world.state.apply_pod(member)
    world.state.room()
    assert rack.free == {dra.GPU: 1000}  # 1 allocated + 2 promised: still 3 taken
