"""Preemption gives a shared device pool back what its victims hold (issue 47).

A pool published for many nodes (ResourceSlice nodeSelector) shows in full on
every node it serves: read node by node, a plan saw it free wherever its
holders were not, evicted nobody, and the gang waited for ever. The plan now
draws its members on the pools as a packing does, with the pools given back
what its victims' claims hold (app/core/preemption/pool_victims.py), and
evicts the fewest further holders for what is still short.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.core.packing import Bin, Demand
from app.core.preemption.cheapest_victims import Evictable
from app.core.preemption.planner import plan
from app.core.preemption.pool_victims import PoolVictims, pool_shortfall, pooled
from app.core.shared_pools import PoolHold, SharedPool, credited, freed_by
from app.core.state import ClusterState
from app.runtime.device_cel import CelEngine
from app.runtime.preemption import unasked as unasked_preemption
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.preemption.room import PreemptionRoom
from app.runtime.preemption.unasked import DRA_UNSCHEDULABLE, UnaskedPreemption
from tests.unit.builders import podgroup
from tests.unit.test_devices import (
    CLAIMS,
    CLASSES,
    DRIVER,
    GPU,
    RACK,
    SLICES,
    TEMPLATES,
    claim,
    device_class,
    gpu_pod,
    rack_nodes,
    requests_of,
    resource_slice,
    template,
)
from tests.unit.test_unasked_preemption import Deleted, unasked_over

# ---- the pools given back (app/core/shared_pools.py) ----------------------------------------


def _pool(free: int, offer: int = 4) -> SharedPool:
    return SharedPool("gpu/rack", {GPU: offer * 1000}, {GPU: free * 1000}, {"n1": {GPU: 0}})


def test_a_claim_is_given_back_once_and_only_when_every_pod_using_it_goes() -> None:
    rack = _pool(0)
    rack.used_on["n1"] = {GPU: 4000}
    shared = PoolHold(rack, {GPU: 2000}, frozenset({"ns/a", "ns/b"}), "n1")
    own = PoolHold(rack, {GPU: 2000}, frozenset({"ns/c"}), "n1")
    bins = [Bin("n1", {GPU: 0}, pools=(rack,)), Bin("n2", {GPU: 4000}, pools=(rack,))]
    assert freed_by([shared, own], {"ns/a"}) == []
    assert freed_by([shared, own], {"ns/a", "ns/c"}) == [own]
    given = credited(bins, freed_by([shared, own], {"ns/a", "ns/b", "ns/c"}))
    (copy,) = {p for b in given for p in b.pools}
    assert copy is not rack and copy.free == {GPU: 4000} and copy.used_on["n1"] == {GPU: 0}
    # The room's pool stays as it was (it is the state's, shared by every bin).
    assert rack.free == {GPU: 0} and rack.used_on["n1"] == {GPU: 4000}
    assert credited(bins, []) == bins


def _unit(key: str, node: str, priority: int = 100) -> Evictable:
    return Evictable((f"uid-{key}",), (key,), node, {"cpu": 100}, priority)


def test_the_plan_evicts_the_fewest_holders_of_the_pool_wherever_they_run() -> None:
    """n1, n2 share a pool of 6, held 2 each by h0, h1 (on n1) and h2 (on n3, which the
    pool also serves but the gang may not use). A gang of 2 x 2 needs 4 of them."""
    rack = SharedPool("gpu/rack", {GPU: 6000}, {GPU: 0}, {"n1": {GPU: 4000}, "n3": {GPU: 2000}})
    holds = [
        PoolHold(rack, {GPU: 2000}, frozenset({"h0"}), "n1"),
        PoolHold(rack, {GPU: 2000}, frozenset({"h1"}), "n1"),
        PoolHold(rack, {GPU: 2000}, frozenset({"h2"}), "n3"),
    ]
    bins = [
        Bin("n1", {"cpu": 4000, GPU: 2000}, pools=(rack,)),
        Bin("n2", {"cpu": 4000, GPU: 6000}, pools=(rack,)),
    ]
    units = {"n1": [_unit("h0", "n1"), _unit("h1", "n1")], "n3": [_unit("h2", "n3", 50)]}
    demands = [Demand(f"m{i}", {"cpu": 1000, GPU: 2000}) for i in range(2)]
    # Node by node the pool looks free on n2: no eviction, and the members would wait.
    plain = plan(demands, bins, {})
    assert plain is not None and plain.victims == []
    requests = {d.key: d.requests for d in demands}
    assert pool_shortfall(plain, requests, bins, PoolVictims(holds))[0] == {GPU: 4000}
    found = pooled(plan, PoolVictims(holds, units))(demands, bins, {}, None)
    assert found is not None
    # Two evictions, the lowest priority first (h2 on n3, where no member goes).
    evicted = {k for v in found.victims for k in v.keys}
    assert len(evicted) == 2 and "h2" in evicted, evicted
    assert found.cost.evictions == 2
    assert pool_shortfall(found, requests, bins, PoolVictims(holds))[0] == {}
    # Nobody may go: no plan.
    assert pooled(plan, PoolVictims(holds))(demands, bins, {}, None) is None


# ---- through the state and the extender's own preemption ------------------------------------


def _low(name: str, at: str, claim_name: str, priority: int = 100) -> Any:
    raw = gpu_pod(name, claim_name=claim_name, node=at, phase="Running")
    raw["spec"]["priority"] = priority
    return raw


def _allocated(name: str, pool: str, devices: range) -> dict[str, Any]:
    raw = claim(name, requests_of(len(devices)))
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": f"gpu-{i}"} for i in devices
    ]
    raw["status"] = {"allocation": {"devices": {"results": results}}}
    return raw


def _waiting(name: str) -> Any:
    raw = gpu_pod(name, template_name="two", group="urgent")
    raw["spec"]["priority"] = 1000
    raw["spec"]["nodeSelector"] = {"rack": "r1"}
    message = f"0/3 nodes are available: 3 {DRA_UNSCHEDULABLE}."
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return raw


def _cluster() -> tuple[ClusterState, UnaskedPreemption, Deleted, PreemptionPlans]:
    """n1 and n2 (rack r1) share a nodeSelector pool of 6, held 2 each by three pods of
    priority 100 (two on n1, one on n2); n3 (no rack) has 4 devices of its own, all held
    by a pod of priority 10, the cheapest victim there is, whose devices the gang cannot
    use."""
    state = ClusterState(CelEngine())
    rack_nodes(state, ("n1", "n2"), ("n3",))
    state.devices.apply(CLASSES, device_class())
    state.devices.apply(SLICES, resource_slice("rack", memories=("80Gi",) * 6, selector=RACK))
    state.devices.apply(SLICES, resource_slice("n3-gpus", "n3"))
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    for i, at in enumerate(("n1", "n1", "n2")):
        state.devices.apply(CLAIMS, _allocated(f"held-{i}", "rack", range(2 * i, 2 * i + 2)))
        state.apply_pod(_low(f"holder-{i}", at, f"held-{i}"))
    state.devices.apply(CLAIMS, _allocated("own", "n3", range(4)))
    state.apply_pod(_low("bystander", "n3", "own", priority=10))
    state.apply_podgroup(podgroup("urgent", 2))
    preemption, deleted, plans = unasked_over(state)
    return state, preemption, deleted, plans


def _run(state: ClusterState, preemption: UnaskedPreemption) -> None:
    async def run() -> None:
        for i in range(2):
            state.apply_pod(_waiting(f"urgent-{i}"))
        await preemption.drain()

    asyncio.run(run())


def test_a_device_gang_evicts_the_fewest_holders_of_the_shared_pool_it_needs(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, deleted, plans = _cluster()
    (rack,) = {p for b in state.room() for p in b.pools}
    assert rack.free.get(GPU, 0) == 0
    _run(state, preemption)
    # 4 of the pool's devices for 2 x 2: two of its three holders; not the bystander.
    assert len(deleted.pods) == 2, deleted.pods
    assert set(deleted.pods) < {f"default/holder-{i}" for i in range(3)}
    made = plans.plans["default/urgent"]
    assert made.evictions == 2 and "default/bystander" not in {k for k, _ in made.victims.values()}
    assert "for a shared device pool" in made.describe(), made.describe()
    # Asked again while the plan lives, nobody more is deleted.
    assert preemption.victims("default/urgent") == []


def test_the_preemption_room_gives_the_pool_back_what_leaving_pods_hold() -> None:
    state, _preemption, _deleted, plans = _cluster()
    room = PreemptionRoom(state, plans._book)
    (rack,) = {p for b in room.bins("default/urgent", 1000) for p in b.pools}
    assert rack.free.get(GPU, 0) == 0
    raw = _low("holder-2", "n2", "held-2")
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state.apply_pod(raw)
    (rack,) = {p for b in room.bins("default/urgent", 1000) for p in b.pools}
    assert rack.free == {GPU: 2000} and rack.used_on["n2"] == {GPU: 0}
    # The state's own pool is left as it was: the line counts the claim until it goes.
    (shared,) = {p for b in state.room() for p in b.pools}
    assert shared.free.get(GPU, 0) == 0


def test_a_claim_a_pod_of_higher_priority_also_uses_is_not_freed(monkeypatch: Any) -> None:
    """Every holder's claim is shared with a pod the gang may not evict: nothing frees the
    pool, so nothing is evicted (the bystander least of all)."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, deleted, _plans = _cluster()
    for i in range(3):
        state.apply_pod(_low(f"keeper-{i}", "n2", f"held-{i}", priority=5000))
    _run(state, preemption)
    assert deleted.pods == []
