"""DRA devices counted as resources (app/core/devices/: counting.py, book.py, records.py).

Against a ClusterState fed the API objects a driver and a user create, with
the real CEL engine (app/runtime/device_cel.py).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from app.core.contention import Gang, Holder
from app.core.devices.records import (
    claim_from,
    class_resource,
    pod_claims_of,
    selector_resource,
    slice_from,
)
from app.core.devices.report import device_counts, device_snapshot
from app.core.devices.shortfall import ShortfallMemo, device_shortfall, gang_device_shortfall
from app.core.packing import Demand
from app.core.packing_search import pack_thoroughly
from app.core.preemption.cheapest_victims import Evictable
from app.core.preemption.planner import plan
from app.core.queues import queue_from
from app.core.resources import format_resources
from app.core.state import ClusterState
from app.ops.device_metrics import DeviceCollector
from app.runtime.device_cel import CelEngine
from tests.unit.builders import node, pod, podgroup

DRIVER = "gpu.example.com"
GPU = class_resource(DRIVER)
SLICES, CLASSES, CLAIMS, TEMPLATES = (
    "resourceslices",
    "deviceclasses",
    "resourceclaims",
    "resourceclaimtemplates",
)


def device_class(name: str = DRIVER, extended: str = "", selector: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selectors": [{"cel": {"expression": selector or f'device.driver == "{DRIVER}"'}}]
    }
    if extended:
        spec["extendedResourceName"] = extended
    return {"metadata": {"name": name}, "spec": spec}


def resource_slice(
    name: str,
    node_name: str = "",
    *,
    memories: tuple[str, ...] = ("80Gi",) * 4,
    generation: int = 1,
    pool: str | None = None,
    all_nodes: bool = False,
    selector: dict[str, Any] | None = None,
    names: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    devices = [
        {
            "name": (names or tuple(f"gpu-{i}" for i in range(len(memories))))[i],
            "attributes": {"model": {"string": "a100"}, "index": {"int": i}},
            "capacity": {"memory": {"value": memory}},
        }
        for i, memory in enumerate(memories)
    ]
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {
            "name": pool or node_name or name,
            "generation": generation,
            "resourceSliceCount": 1,
        },
        "devices": devices,
    }
    if node_name:
        spec["nodeName"] = node_name
    if all_nodes:
        spec["allNodes"] = True
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def requests_of(count: int = 2, *, selector: str = "", mode: str = "", cls: str = DRIVER) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if mode:
        exactly["allocationMode"] = mode
        del exactly["count"]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def template(name: str, spec: Any, namespace: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec}}


def claim(name: str, spec: Any, allocated: int = 0, namespace: str = "default") -> dict[str, Any]:
    raw: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    if allocated:
        results = [
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": f"gpu-{i}"}
            for i in range(allocated)
        ]
        raw["status"] = {"allocation": {"devices": {"results": results}}}
    return raw


def gpu_pod(name: str, *, template_name: str = "", claim_name: str = "", **kwargs: Any) -> Any:
    raw = pod(name, **kwargs)
    entry: dict[str, Any] = {"name": "gpu"}
    if template_name:
        entry["resourceClaimTemplateName"] = template_name
    else:
        entry["resourceClaimName"] = claim_name
    raw["spec"]["resourceClaims"] = [entry]
    return raw


@pytest.fixture
def state() -> ClusterState:
    cluster = ClusterState(CelEngine())
    for name in ("n1", "n2", "n3"):
        cluster.apply_node(node(name))
    cluster.devices.apply(CLASSES, device_class())
    return cluster


def test_a_node_offers_the_devices_its_pool_publishes(state: ClusterState) -> None:
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    assert state.nodes["n1"].allocatable[GPU] == 4000
    assert GPU not in state.nodes["n2"].allocatable
    assert state.nodes["n1"].allocatable["cpu"] == 4000  # what the node advertises stays


def test_only_the_newest_generation_of_a_pool_counts(state: ClusterState) -> None:
    state.devices.apply(SLICES, resource_slice("old", "n1", generation=1, pool="p"))
    state.devices.apply(
        SLICES, resource_slice("new", "n1", generation=2, pool="p", memories=("80Gi",) * 2)
    )
    assert state.nodes["n1"].allocatable[GPU] == 2000
    state.devices.delete(SLICES, resource_slice("new", "n1", generation=2, pool="p"))
    assert state.nodes["n1"].allocatable[GPU] == 4000


def test_a_slice_with_duplicate_device_names_counts_each_once_and_says_so() -> None:
    record = slice_from(resource_slice("dup", "n1", names=("a", "a", "b", "c")))
    assert [d.name for d in record.devices] == ["a", "b", "c"]
    assert "duplicate device name 'a'" in record.error


def test_node_selector_and_all_nodes_pools_count_on_the_nodes_they_select(
    state: ClusterState,
) -> None:
    state.nodes["n2"].labels["rack"] = "r1"
    selector = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
        ]
    }
    state.devices.apply(SLICES, resource_slice("rack", selector=selector, memories=("80Gi",)))
    assert state.nodes["n2"].allocatable[GPU] == 1000
    assert GPU not in state.nodes["n1"].allocatable
    state.devices.apply(SLICES, resource_slice("every", all_nodes=True, memories=("80Gi",) * 2))
    assert state.nodes["n1"].allocatable[GPU] == 2000
    assert state.nodes["n2"].allocatable[GPU] == 3000


def test_a_pod_asks_what_its_template_asks_and_then_its_generated_claim(
    state: ClusterState,
) -> None:
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    state.apply_pod(gpu_pod("p", template_name="two"))
    assert state.pods["default/p"].requests[GPU] == 2000
    # The resourceclaim controller made its claim, allocated with 3 devices (exact now).
    state.devices.apply(CLAIMS, claim("p-gpu-x", requests_of(2), allocated=3))
    raw = gpu_pod("p", template_name="two")
    raw["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]
    state.apply_pod(raw)
    assert state.pods["default/p"].requests[GPU] == 3000


def test_a_shared_claim_counts_once_on_its_first_user(state: ClusterState) -> None:
    state.devices.apply(CLAIMS, claim("shared", requests_of(2)))
    state.apply_pod(gpu_pod("b", claim_name="shared"))
    assert state.pods["default/b"].requests[GPU] == 2000
    state.apply_pod(gpu_pod("a", claim_name="shared"))
    assert state.pods["default/a"].requests[GPU] == 2000
    assert GPU not in state.pods["default/b"].requests
    state.delete_pod("default", "a")
    assert state.pods["default/b"].requests[GPU] == 2000


def test_all_mode_asks_as_many_as_the_fullest_node_has(state: ClusterState) -> None:
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1", memories=("80Gi",) * 3))
    state.devices.apply(SLICES, resource_slice("n2-gpus", "n2", memories=("80Gi",) * 5))
    state.devices.apply(CLAIMS, claim("all", requests_of(mode="All")))
    state.apply_pod(gpu_pod("p", claim_name="all"))
    assert state.pods["default/p"].requests[GPU] == 5000


def test_first_available_takes_the_first_alternative_the_cluster_has_enough_of(
    state: ClusterState,
) -> None:
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(CLASSES, device_class("small.example.com", selector="false"))
    alternatives = [
        {"name": "big", "deviceClassName": DRIVER, "count": 8},
        {"name": "few", "deviceClassName": DRIVER, "count": 3},
    ]
    spec = {"devices": {"requests": [{"name": "gpu", "firstAvailable": alternatives}]}}
    state.devices.apply(CLAIMS, claim("fa", spec))
    state.apply_pod(gpu_pod("p", claim_name="fa"))
    assert state.pods["default/p"].requests[GPU] == 3000


def test_a_cel_selector_counts_only_the_devices_it_matches(state: ClusterState) -> None:
    state.devices.apply(
        SLICES, resource_slice("n1-gpus", "n1", memories=("80Gi", "16Gi", "40Gi", "8Gi"))
    )
    selector = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
    state.devices.apply(TEMPLATES, template("big", requests_of(2, selector=selector)))
    state.apply_pod(gpu_pod("p", template_name="big"))
    matching = selector_resource(DRIVER, (selector,))
    assert state.nodes["n1"].allocatable[GPU] == 4000
    assert state.nodes["n1"].allocatable[matching] == 2000
    assert state.pods["default/p"].requests == {
        **state.pods["default/p"].requests,
        GPU: 2000,
        matching: 2000,
    }


def test_a_selector_the_library_cannot_compile_counts_by_class_and_is_reported(
    state: ClusterState,
) -> None:
    """The API server refuses a selector that does not compile (the cluster test shows
    it): one that reaches us uses a CEL feature our library lacks, so it counts by class."""
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(TEMPLATES, template("odd", requests_of(2, selector="device.(")))
    state.apply_pod(gpu_pod("p", template_name="odd"))
    requests = state.pods["default/p"].requests
    assert [k for k in requests if k.startswith("devices/")] == [GPU]
    assert "does not compile: Failed to parse" in state.devices.model.fallbacks["device.("]


def test_a_selector_that_fails_on_a_device_counts_by_class_logged_and_in_the_metric(
    state: ClusterState, caplog: pytest.LogCaptureFixture
) -> None:
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    selector = 'device.attributes["other.example.com"].model == "x"'  # no such domain
    state.devices.apply(TEMPLATES, template("odd", requests_of(2, selector=selector)))
    state.apply_pod(gpu_pod("p", template_name="odd"))
    matching = selector_resource(DRIVER, (selector,))
    assert state.pods["default/p"].requests[matching] == 2000
    assert state.nodes["n1"].allocatable[matching] == 4000  # every device of the class
    why = state.devices.model.fallbacks[selector]
    assert "fails on a device (KeyError" in why, why
    assert "counted by class alone" in caplog.text
    registry = CollectorRegistry()
    registry.register(DeviceCollector(state))
    assert registry.get_sample_value("gang_extender_device_selectors_by_class") == 1


def test_missing_class_or_template_is_a_demand_no_node_meets_with_a_clear_message(
    state: ClusterState,
) -> None:
    state.apply_pod(gpu_pod("p", template_name="nowhere"))
    state.devices.apply(TEMPLATES, template("wrong", requests_of(1, cls="nope.example.com")))
    state.apply_pod(gpu_pod("q", template_name="wrong"))
    assert (
        format_resources(
            {k: v for k, v in state.pods["default/p"].requests.items() if k.startswith("devices/")}
        )
        == "ResourceClaimTemplate default/nowhere not found"
    )
    assert "DeviceClass nope.example.com not found" in format_resources(
        state.pods["default/q"].requests
    )


def test_an_extended_resource_backed_by_a_device_class_is_offered_by_its_nodes(
    state: ClusterState,
) -> None:
    state.devices.apply(CLASSES, device_class(extended="example.com/gpu"))
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    assert state.nodes["n1"].allocatable["example.com/gpu"] == 4000


def test_messages_name_devices_by_class() -> None:
    text = format_resources({"cpu": 1000, GPU: 12000, selector_resource(DRIVER, ("x",)): 12000})
    assert text == "cpu 1, 12 device(s) of class gpu.example.com"


def test_pod_claims_read_the_generated_names() -> None:
    spec = {
        "resourceClaims": [
            {"name": "a", "resourceClaimTemplateName": "t"},
            {"name": "b", "resourceClaimName": "c"},
        ]
    }
    status = {"resourceClaimStatuses": [{"name": "a", "resourceClaimName": "p-a-123"}]}
    claims = pod_claims_of(spec, status)
    assert [(c.entry, c.claim, c.template) for c in claims] == [
        ("a", "p-a-123", "t"),
        ("b", "c", ""),
    ]


def test_caches_and_metrics_show_pools_and_devices_free_and_held_in_the_gate(
    state: ClusterState,
) -> None:
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(
        SLICES, resource_slice("bad", "n2", names=("x", "x"), memories=("80Gi", "80Gi"))
    )
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    state.apply_pod(gpu_pod("bound", template_name="two", node="n1", phase="Running"))
    state.apply_pod(gpu_pod("held", template_name="two"))
    state.reserve("default/held", "n1")
    snapshot = device_snapshot(state)
    assert snapshot["pools"]["gpu.example.com/n1"] == {
        "generation": 1,
        "slices": 1,
        "resourceSliceCount": 1,
        "devices": 4,
        "node": "n1",
    }
    assert snapshot["classes"][DRIVER] == {
        "allocatable": 5,
        "requested": 4,
        "free": 1,
        "held_waiting": 2,
    }
    assert any("duplicate device name 'x'" in e for e in snapshot["errors"])
    registry = CollectorRegistry()
    registry.register(DeviceCollector(state))
    labels = {"device_class": DRIVER, "state": "held_waiting"}
    assert registry.get_sample_value("gang_extender_devices", labels) == 2
    # A gang the line admitted, its 3 members not placed yet, 1 device each on n2:
    # waiting gangs hold those too.
    promised = Holder("default/g", 0, 0.0, {"n2": {GPU: 3000, "cpu": 3000}})
    registry = CollectorRegistry()
    registry.register(DeviceCollector(state, lambda: [promised]))
    assert registry.get_sample_value("gang_extender_devices", labels) == 5


def test_a_claim_change_recounts_only_the_pods_naming_it(state: ClusterState) -> None:
    state.devices.apply(CLAIMS, claim("c1", requests_of(1)))
    state.devices.apply(CLAIMS, claim("c2", requests_of(1)))
    state.apply_pod(gpu_pod("p1", claim_name="c1"))
    state.apply_pod(gpu_pod("p2", claim_name="c2"))
    other = state.pods["default/p2"]
    state.devices.apply(CLAIMS, claim("c1", requests_of(3)))
    assert state.pods["default/p1"].requests[GPU] == 3000
    assert state.pods["default/p2"] is other


def test_a_queue_capability_names_device_classes_bare_or_as_resources() -> None:
    spec = queue_from(
        {
            "metadata": {"name": "gpus"},
            "spec": {
                "capability": {"gpu.example.com": 16, "devices/other.example.com": 2, "cpu": 8}
            },
        }
    )
    assert spec.capability == {GPU: 16000, "devices/other.example.com": 2000, "cpu": 8000}


def test_a_request_naming_no_class_is_reported_not_counted() -> None:
    spec = claim_from(claim("odd", {"devices": {"requests": [{"name": "gpu"}]}})).spec
    assert spec.requests == ()
    assert (
        spec.error
        == "ResourceClaim default/odd: request(s) gpu ask for no device class: not counted"
    )


def test_a_shared_claim_moves_to_another_user_when_its_first_one_finishes(
    state: ClusterState,
) -> None:
    state.devices.apply(CLAIMS, claim("shared", requests_of(2)))
    state.apply_pod(gpu_pod("a", claim_name="shared", node="n1", phase="Running"))
    state.apply_pod(gpu_pod("b", claim_name="shared", node="n1", phase="Running"))
    assert GPU not in state.pods["default/b"].requests
    state.apply_pod(gpu_pod("a", claim_name="shared", node="n1", phase="Succeeded"))
    assert state.pods["default/b"].requests[GPU] == 2000
    assert state.requested_on("n1")[GPU] == 2000


def test_an_unreadable_object_is_left_out_not_fatal(state: ClusterState) -> None:
    state.devices.apply(
        TEMPLATES, {"metadata": {"name": "bad"}, "spec": {"spec": {"devices": ["x"]}}}
    )
    state.apply_pod(gpu_pod("p", template_name="bad"))
    assert "ResourceClaimTemplate default/bad not found" in format_resources(
        state.pods["default/p"].requests
    )


def test_the_preemption_plan_frees_devices_with_the_fewest_victims(state: ClusterState) -> None:
    """n1's 4 devices are held by 2 pods (2 each), n2's by 4 (1 each): a gang of
    2 x 2 devices takes n1's, 2 victims rather than 4 (the requests carry the devices)."""
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(SLICES, resource_slice("n2-gpus", "n2"))
    state.devices.apply(TEMPLATES, template("one", requests_of(1)))
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    holders = [("pair-0", "n1", "two"), ("pair-1", "n1", "two")]
    holders += [(f"single-{i}", "n2", "one") for i in range(4)]
    for name, at, kind in holders:
        state.apply_pod(gpu_pod(name, template_name=kind, node=at, phase="Running"))
    state.apply_pod(gpu_pod("urgent-0", template_name="two"))
    need = state.pods["default/urgent-0"].requests
    bins = [b for b in state.room() if b.name in ("n1", "n2")]
    evictable = {
        at: [
            Evictable(
                (f"uid-{name}",),
                (f"default/{name}",),
                at,
                state.pods[f"default/{name}"].requests,
                0,
            )
            for name, node_name, _kind in holders
            if node_name == at
        ]
        for at in ("n1", "n2")
    }
    result = plan([Demand("m0", need), Demand("m1", need)], bins, evictable)
    assert result is not None
    assert sorted(k for v in result.victims for k in v.keys) == ["default/pair-0", "default/pair-1"]


def test_without_a_dra_watch_claims_are_not_counted_until_its_first_list() -> None:
    state = ClusterState(CelEngine())
    state.apply_node(node("n1"))
    state.apply_pod(gpu_pod("p", template_name="two"))
    assert not any(k.startswith("devices/") for k in state.pods["default/p"].requests)
    state.devices.replace(CLASSES, [device_class()])
    state.devices.replace(TEMPLATES, [template("two", requests_of(2))])
    assert state.pods["default/p"].requests[GPU] == 2000


BIG = 'device.capacity["gpu.example.com"].memory.compareTo(quantity("64Gi")) >= 0'


def _held_80gi(state: ClusterState) -> None:
    """A running pod on n1 holds gpu-1 (80Gi) through a claim that asked for any device."""
    held = claim("held", requests_of(1), allocated=2)
    held["status"]["allocation"]["devices"]["results"] = [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}
    ]
    state.devices.apply(CLAIMS, held)
    state.apply_pod(gpu_pod("runs", claim_name="held", node="n1", phase="Running"))


def _asks_64gi(state: ClusterState) -> str:
    """A pending pod asking 2 devices of at least 64Gi: its selector set's resource."""
    state.devices.apply(TEMPLATES, template("big", requests_of(2, selector=BIG)))
    state.apply_pod(gpu_pod("wants", template_name="big"))
    return selector_resource(DRIVER, (BIG,))


@pytest.mark.parametrize("held_first", [True, False])
def test_a_held_device_is_taken_from_every_selector_set_it_passes(
    state: ClusterState, held_first: bool
) -> None:
    """A claim that asked for any device and got an 80Gi one leaves one fewer >= 64Gi free.

    Whichever comes first, the allocation or the first request with the selector set.
    """
    state.devices.apply(
        SLICES, resource_slice("n1-gpus", "n1", memories=("40Gi", "80Gi", "80Gi", "40Gi"))
    )
    if held_first:
        _held_80gi(state)
        big = _asks_64gi(state)
    else:
        big = _asks_64gi(state)
        _held_80gi(state)
    assert state.nodes["n1"].allocatable[big] == 2000
    assert state.requested_on("n1")[big] == 1000  # one of the two big devices is held
    assert state.requested_on("n1")[GPU] == 1000
    # A 40Gi device held instead takes nothing from the big ones.
    moved = claim("held", requests_of(1), allocated=2)
    moved["status"]["allocation"]["devices"]["results"] = [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
    ]
    state.devices.apply(CLAIMS, moved)
    assert state.requested_on("n1").get(big, 0) == 0


# ---- overlapping selector sets: the counts fit exactly when the devices can be shared out

_PREDICATES = (
    'device.attributes["gpu.example.com"].a == 1',
    'device.attributes["gpu.example.com"].b == 1',
    'device.attributes["gpu.example.com"].a == 1 || device.attributes["gpu.example.com"].c == 1',
    'device.attributes["gpu.example.com"].b == 0',
)
_FLAGS = ("a", "b", "c")


def _assignable(devices: list[dict[str, int]], asks: list[tuple[int | None, int]]) -> bool:
    """Brute force: can each request get its count of distinct devices its selector passes?"""

    def passes(flags: dict[str, int], selector: int | None) -> bool:
        if selector is None:
            return True
        a, b, c = flags["a"], flags["b"], flags["c"]
        return [a == 1, b == 1, a == 1 or c == 1, b == 0][selector]

    def place(k: int, free: frozenset[int]) -> bool:
        if k == len(asks):
            return True
        selector, count = asks[k]
        options = [i for i in free if passes(devices[i], selector)]
        return any(
            place(k + 1, free - set(chosen)) for chosen in itertools.combinations(options, count)
        )

    return place(0, frozenset(range(len(devices))))


@settings(max_examples=300, deadline=None)
@given(
    devices=st.lists(
        st.fixed_dictionaries({f: st.integers(0, 1) for f in _FLAGS}), min_size=1, max_size=5
    ),
    asks=st.lists(
        st.tuples(st.none() | st.integers(0, len(_PREDICATES) - 1), st.integers(1, 2)),
        min_size=2,
        max_size=4,
    ),
)
@example(devices=[{"a": 1, "b": 1, "c": 0}, {"a": 0, "b": 0, "c": 0}], asks=[(0, 1), (1, 1)])
def test_overlapping_selectors_fit_exactly_when_the_devices_can_be_shared_out(
    devices: list[dict[str, int]], asks: list[tuple[int | None, int]]
) -> None:
    """Each pod asks through its own selector (or none); all on one node: the node's counts
    say the pods fit exactly when a brute-force search finds distinct devices for them."""
    state = ClusterState(CelEngine())
    state.apply_node(node("n1"))
    state.devices.apply(CLASSES, device_class())
    published = [
        {"name": f"d{i}", "attributes": {f: {"int": v} for f, v in flags.items()}}
        for i, flags in enumerate(devices)
    ]
    raw = resource_slice("n1-gpus", "n1", memories=())
    raw["spec"]["devices"] = published
    state.devices.apply(SLICES, raw)
    for k, (selector, count) in enumerate(asks):
        text = "" if selector is None else _PREDICATES[selector]
        state.devices.apply(TEMPLATES, template(f"t{k}", requests_of(count, selector=text)))
        state.apply_pod(gpu_pod(f"p{k}", template_name=f"t{k}"))
    asked: dict[str, int] = {}
    for record in state.pods.values():
        for name, amount in record.requests.items():
            if name.startswith("devices/"):
                asked[name] = asked.get(name, 0) + amount
    offered = state.nodes["n1"].allocatable
    fits = all(amount <= offered.get(name, 0) for name, amount in asked.items())
    assert fits == _assignable(devices, asks), (asked, offered)


# ---- the cluster's devices counted once: pools for many nodes, the gang's shortfall


def _gang(state: ClusterState, key: str, pods: list[str], need: int, priority: int = 0) -> Gang:
    demands = tuple(Demand(p, state.pods[p].requests) for p in pods)
    return Gang(key, priority, 0.0, demands, need)


def test_a_pool_for_many_nodes_counts_once_and_holds_a_gang_to_its_devices(
    state: ClusterState,
) -> None:
    """An allNodes pool of 4 shows on each of the 3 nodes (a pod on any may take all 4),
    but the cluster has 4: a gang of 3 x 2 is held, with the issue's message."""
    state.devices.apply(SLICES, resource_slice("shared", all_nodes=True))
    assert all(state.nodes[n].allocatable[GPU] == 4000 for n in ("n1", "n2", "n3"))
    assert state.devices.distinct.offer() == {GPU: 4000}
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    for i in range(3):
        state.apply_pod(gpu_pod(f"m{i}", template_name="two"))
    gang = _gang(state, "default/train", [f"default/m{i}" for i in range(3)], 3)
    message = gang_device_shortfall(gang, state.devices, list)
    assert (
        message
        == "gang default/train needs 6 devices of class gpu.example.com, 4 free in the cluster"
    )
    assert gang_device_shortfall(replace(gang, need=2), state.devices, list) is None
    # One member placed (on any node) takes 2 of the pool's 4 for the whole cluster.
    state.apply_pod(gpu_pod("m0", template_name="two", node="n3"))
    assert state.devices.distinct.free() == {GPU: 2000}
    rest = _gang(state, "default/train", ["default/m1", "default/m2"], 2)
    assert "needs 4 devices of class gpu.example.com, 2 free" in str(
        gang_device_shortfall(rest, state.devices, list)
    )
    state.apply_pod(gpu_pod("m0", template_name="two", node="n3", phase="Succeeded"))
    assert state.devices.distinct.free() == {GPU: 4000}  # a finished pod holds none


def test_a_node_selector_pool_counts_if_a_schedulable_node_may_use_it(state: ClusterState) -> None:
    selector = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
        ]
    }
    state.devices.apply(SLICES, resource_slice("rack", selector=selector))
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1", memories=("80Gi",)))
    assert state.devices.distinct.offer() == {GPU: 1000}  # no node in rack r1 yet
    raw = node("n2")
    raw["metadata"]["labels"]["rack"] = "r1"
    state.apply_node(raw)
    assert state.devices.distinct.offer() == {GPU: 5000}
    raw["spec"]["unschedulable"] = True
    state.apply_node(raw)
    assert state.devices.distinct.offer() == {GPU: 1000}


def test_devices_promised_to_admitted_gangs_are_not_free_unless_of_lower_priority(
    state: ClusterState,
) -> None:
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    for i in range(2):
        state.apply_pod(gpu_pod(f"m{i}", template_name="two"))
    gang = _gang(state, "default/b", ["default/m0", "default/m1"], 2, priority=5)
    holder = Holder("default/a", 5, 0.0, {"n1": {GPU: 4000}})
    assert "needs 4 devices of class gpu.example.com, 0 free in the cluster" in str(
        gang_device_shortfall(gang, state.devices, lambda: [holder])
    )
    lower = replace(holder, priority=1)
    assert gang_device_shortfall(gang, state.devices, lambda: [lower]) is None


def test_a_gang_asking_a_missing_class_is_held_with_its_name(state: ClusterState) -> None:
    state.devices.apply(TEMPLATES, template("wrong", requests_of(1, cls="nope.example.com")))
    state.apply_pod(gpu_pod("q", template_name="wrong"))
    gang = _gang(state, "default/g", ["default/q"], 1)
    assert gang_device_shortfall(gang, state.devices, list) == (
        "gang default/g is held: its members cannot be given devices: "
        "DeviceClass nope.example.com not found"
    )


# ---- a pool for many nodes in the bins a gang is packed into (app/core/devices/shared.py)


# A pool's nodeSelector: the nodes of rack r1.
RACK = {
    "nodeSelectorTerms": [
        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
    ]
}


def rack_nodes(cluster: ClusterState, racked: tuple[str, ...], others: tuple[str, ...]) -> None:
    """The nodes `racked` in rack r1 (labelled rack=r1), and `others` outside it."""
    for name in (*racked, *others):
        raw = node(name)
        if name in racked:
            raw["metadata"]["labels"]["rack"] = "r1"
        cluster.apply_node(raw)


def _rack_state() -> ClusterState:
    """n1 and n2 in rack r1 share its nodeSelector pool of 4; n3 is outside the rack."""
    cluster = ClusterState(CelEngine())
    rack_nodes(cluster, ("n1", "n2"), ("n3",))
    cluster.devices.apply(CLASSES, device_class())
    cluster.devices.apply(SLICES, resource_slice("rack", selector=RACK))
    cluster.devices.apply(TEMPLATES, template("three", requests_of(3)))
    return cluster


def _rack_claim(name: str, devices: int) -> dict[str, Any]:
    raw = claim(name, requests_of(devices))
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": "rack", "device": f"gpu-{i}"}
        for i in range(devices)
    ]
    raw["status"] = {"allocation": {"devices": {"results": results}}}
    return raw


def test_the_bins_of_the_nodes_a_pool_serves_share_it_so_a_gang_takes_it_once() -> None:
    state = _rack_state()
    bins = {b.name: b for b in state.room()}
    assert bins["n1"].free[GPU] == bins["n2"].free[GPU] == 4000
    assert bins["n1"].pools == bins["n2"].pools and len(bins["n1"].pools) == 1
    assert bins["n3"].pools == ()
    for i in range(2):
        state.apply_pod(gpu_pod(f"m{i}", template_name="three"))
    demands = [Demand(f"default/m{i}", state.pods[f"default/m{i}"].requests) for i in range(2)]
    room = state.room()
    # 3 + 3 of the rack's 4: each node alone would take a member.
    assert not pack_thoroughly(demands, room).fits
    assert pack_thoroughly(demands[:1], room).fits
    assert not pack_thoroughly(demands, state.allocatable_bins()).fits


def test_a_pool_s_devices_held_by_a_placed_pod_are_taken_from_it_for_every_node() -> None:
    """A pod on n1 holds 2 of the rack's 4: n2 (showing 4) may take 2, not 3."""
    state = _rack_state()
    state.devices.apply(CLAIMS, _rack_claim("held", 2))
    state.apply_pod(gpu_pod("holder", claim_name="held", node="n1"))
    bins = {b.name: b for b in state.room()}
    assert bins["n2"].free[GPU] == 4000 and bins["n1"].free[GPU] == 2000
    (rack,) = bins["n2"].pools
    assert rack.free == {GPU: 2000} and rack.used_on == {"n1": {GPU: 2000}}
    state.apply_pod(gpu_pod("m0", template_name="three"))
    demand = Demand("default/m0", state.pods["default/m0"].requests)
    assert not pack_thoroughly([demand], state.room()).fits
    assert pack_thoroughly([demand], state.allocatable_bins()).fits  # the empty cluster
    # The holder finishes: its claim is released (the driver deallocates it) and the
    # pool is whole again, for n2 as for n1.
    state.apply_pod(gpu_pod("holder", claim_name="held", node="n1", phase="Succeeded"))
    state.devices.apply(CLAIMS, claim("held", requests_of(2)))
    assert pack_thoroughly([demand], state.room()).fits


def test_a_gang_s_device_shortfall_is_kept_for_retries_until_the_devices_change(
    state: ClusterState,
) -> None:
    memo = ShortfallMemo()
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    for i in range(3):
        state.apply_pod(gpu_pod(f"m{i}", template_name="two"))
    gang = _gang(state, "default/train", [f"default/m{i}" for i in range(3)], 3)
    stamps = (state.group_stamp(gang.key), 7)
    first = memo.of(gang, state.devices, list, stamps)
    assert (
        first
        == "gang default/train needs 6 devices of class gpu.example.com, 4 free in the cluster"
    )
    assert memo.of(gang, state.devices, list, stamps) == first
    assert memo.computed == 1  # the retry reused it
    # More devices published: worked out again, and the gang now fits.
    state.devices.apply(SLICES, resource_slice("n2-gpus", "n2"))
    assert memo.of(gang, state.devices, list, stamps) is None
    assert memo.computed == 2
    # A device pod placed elsewhere takes devices: worked out again.
    state.devices.apply(TEMPLATES, template("four", requests_of(4)))
    state.apply_pod(gpu_pod("other", template_name="four", node="n2"))
    assert memo.of(gang, state.devices, list, stamps) == first
    assert memo.computed == 3
    # The arbiter's revision (a claim promised devices) or the gang's stamp moved.
    memo.of(gang, state.devices, list, (stamps[0], 8))
    memo.of(gang, state.devices, list, (stamps[0] + 1, 8))
    assert memo.computed == 5
    # A different gang under the same key (a member not delivered yet) is not the kept one.
    assert memo.of(replace(gang, need=2), state.devices, list, (stamps[0] + 1, 8)) is None
    assert memo.computed == 6


def test_a_shortfall_reads_in_the_issue_s_words_with_the_selectors_after() -> None:
    """ "gang <ns>/<name> needs N devices of class <class>, M free in the cluster" first,
    whichever count is short; what the selectors add comes after it."""
    big = selector_resource(DRIVER, ('device.capacity["x"].memory >= 40',))
    members = [Demand(f"m{i}", {GPU: 2000, big: 2000}) for i in range(3)]
    assert (
        device_shortfall("ml/train", members, 3, {GPU: 8000, big: 4000})
        == "gang ml/train needs 6 devices of class gpu.example.com, 4 free in the cluster "
        "(devices passing its requests' selectors)"
    )
    assert (
        device_shortfall("ml/train", members, 3, {GPU: 4000, big: 2000})
        == "gang ml/train needs 6 devices of class gpu.example.com, 4 free in the cluster; "
        "6 devices of class gpu.example.com passing its requests' selectors needed, 2 free"
    )
    assert device_shortfall("ml/train", members, 2, {GPU: 4000, big: 4000}) is None


def test_devices_allocated_claims_hold_for_gangs_waiting_in_line_are_held_waiting(
    state: ClusterState,
) -> None:
    """Gang "train" waits in line; kube-scheduler allocated 2 devices to its member m0's
    claim before the gang was turned away, and m1 shares that claim (counted once). m2's
    claim is not allocated: it holds nothing. A gang not in line is not counted."""
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.apply_podgroup(podgroup("train", 3))
    state.devices.apply(CLAIMS, claim("m0-gpu", requests_of(2), allocated=2))
    state.devices.apply(CLAIMS, claim("m2-gpu", requests_of(2)))
    state.apply_pod(gpu_pod("m0", claim_name="m0-gpu", group="train"))
    state.apply_pod(gpu_pod("m1", claim_name="m0-gpu", group="train"))
    state.apply_pod(gpu_pod("m2", claim_name="m2-gpu", group="train"))
    labels = {"device_class": DRIVER, "state": "held_waiting"}
    registry = CollectorRegistry()
    registry.register(DeviceCollector(state, list, lambda: ["default/train"]))
    assert registry.get_sample_value("gang_extender_devices", labels) == 2
    assert device_counts(state, (), ["default/other"])[DRIVER]["held_waiting"] == 0
    # Placed in the gate, m0 counts once, as a member waiting in the gate.
    state.reserve("default/m0", "n1")
    assert device_counts(state, (), ["default/train"])[DRIVER]["held_waiting"] == 2


def _room_on(state: ClusterState, name: str) -> dict[str, int]:
    return next(b.free for b in state.room() if b.name == name)


def test_a_device_taken_by_a_claim_is_not_free_to_its_extended_resource_nor_back() -> None:
    """n1's 4 devices back the class's extendedResourceName: a pod asking 2 by claim and
    one asking example.com/gpu: 2 take all 4; nothing more fits, by either name."""
    state = ClusterState(CelEngine())
    state.apply_node(node("n1"))
    state.devices.apply(CLASSES, device_class(extended="example.com/gpu"))
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    state.apply_pod(gpu_pod("by-claim", template_name="two", node="n1"))
    extended = pod("by-name", node="n1")
    extended["spec"]["containers"][0]["resources"]["requests"]["example.com/gpu"] = "2"
    state.apply_pod(extended)
    free = _room_on(state, "n1")
    assert free.get("example.com/gpu", 0) == 0  # 2 by claim, 2 by name: all 4
    state.apply_pod(gpu_pod("another", template_name="two"))
    another = Demand("default/another", state.pods["default/another"].requests)
    assert not pack_thoroughly([another], state.room()).fits
    # The claim pod's own container requests are kept beside its devices.
    assert state.pods["default/another"].requests["example.com/gpu"] == 2000
    # The claim pod goes: its 2 devices are free by either name again.
    state.delete_pod("default", "by-claim")
    assert _room_on(state, "n1")["example.com/gpu"] == 2000
    assert pack_thoroughly([another], state.room()).fits


def test_a_pod_asking_both_ways_adds_up_and_stays_so_when_recounted() -> None:
    state = ClusterState(CelEngine())
    state.apply_node(node("n1"))
    state.devices.apply(CLASSES, device_class(extended="example.com/gpu"))
    state.devices.apply(SLICES, resource_slice("n1-gpus", "n1"))
    state.devices.apply(TEMPLATES, template("two", requests_of(2)))
    both = gpu_pod("both", template_name="two")
    both["spec"]["containers"][0]["resources"]["requests"]["example.com/gpu"] = "1"
    state.apply_pod(both)
    assert state.pods["default/both"].requests["example.com/gpu"] == 3000
    for _ in range(2):  # the class changes: every device pod is counted anew
        state.devices.apply(CLASSES, device_class(extended="example.com/gpu"))
        assert state.pods["default/both"].requests["example.com/gpu"] == 3000
    state.devices.apply(CLASSES, device_class())  # no longer backs the name
    assert state.pods["default/both"].requests["example.com/gpu"] == 1000
    assert state.pods["default/both"].requests[GPU] == 2000
