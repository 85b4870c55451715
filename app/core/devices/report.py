"""What the cluster's DRA devices look like, for /debug/caches and the device metrics.

Pure: reads ClusterState. Per DeviceClass, how many devices the schedulable
nodes offer, how many the pods placed there take (bound, or held in the
permit gate), how many are free, and how many waiting gangs hold (members
waiting in the gate, what the line promised to admitted gangs' members not
placed yet, and what allocated claims hold for gangs waiting in line); per
pool, the generation counted and its devices; what could not be read (slices
with duplicate names, selectors counted by class alone).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from app.core.devices.counting import held_of
from app.core.resources import DEVICE_PREFIX, MISSING_PREFIX, Resources
from app.core.state import ClusterState


def _class_of(resource: str) -> str | None:
    """The class of a per-class device resource (not a selector digest, not a missing thing)."""
    if not resource.startswith(DEVICE_PREFIX) or resource.startswith(MISSING_PREFIX):
        return None
    device_class, _sep, digest = resource[len(DEVICE_PREFIX) :].partition("/")
    return None if digest else device_class


def device_counts(
    state: ClusterState,
    promised: Iterable[Mapping[str, int]] = (),
    waiting: Iterable[str] = (),
) -> dict[str, dict[str, int]]:
    """Class -> {allocatable, requested, free, held_waiting}, in whole devices.

    held_waiting: the devices of members waiting in the permit gate; `promised`,
    what the line holds for admitted gangs' members not placed yet
    (app/runtime/claims.py: each holder's remaining, per node); and the devices
    allocated claims hold for the unplaced members of the gangs `waiting` in line
    (group keys: a claim kube-scheduler allocated before the gang was turned away
    holds its devices until it is deallocated), each claim once.
    """
    counts: dict[str, dict[str, int]] = {}

    def bump(resource: str, field: str, amount: int) -> None:
        device_class = _class_of(resource)
        if device_class is not None:
            row = counts.setdefault(
                device_class, {"allocatable": 0, "requested": 0, "free": 0, "held_waiting": 0}
            )
            row[field] += amount // 1000

    for name, record in state.nodes.items():
        if record.unschedulable:
            continue
        for resource, amount in record.allocatable.items():
            bump(resource, "allocatable", amount)
        for resource, amount in state.requested_on(name).items():
            bump(resource, "requested", amount)
    for pod in state.pods.values():
        if pod.claims and pod.reserved_node and not pod.node_name:
            for resource, amount in pod.requests.items():
                bump(resource, "held_waiting", amount)
    for requests in promised:
        for resource, amount in requests.items():
            bump(resource, "held_waiting", amount)
    for requests in _held_in_line(state, waiting):
        for resource, amount in requests.items():
            bump(resource, "held_waiting", amount)
    for row in counts.values():
        row["free"] = max(0, row["allocatable"] - row["requested"])
    return dict(sorted(counts.items()))


def _held_in_line(state: ClusterState, waiting: Iterable[str]) -> Iterator[Resources]:
    """What the allocated claims of the unplaced members of gangs in line hold, each once."""
    model = state.devices.model
    seen: set[str] = set()
    for group_key in waiting:
        for pod in state.members(group_key):
            if pod.placed_node:  # in the gate (counted above) or bound (requested)
                continue
            for pod_claim in pod.claims:
                claim = model.claims.get(f"{pod.namespace}/{pod_claim.claim}")
                if claim is None or not claim.allocated or claim.key in seen:
                    continue
                seen.add(claim.key)
                users = (state.pods.get(k) for k in model.users.get(claim.key, ()))
                if not any(user is not None and user.placed_node for user in users):
                    yield held_of(model, claim)  # (a placed user counts it: gate or node)


def device_snapshot(state: ClusterState) -> dict[str, Any]:
    """/debug/caches' "devices": pools (newest generation), counts per class, problems."""
    model = state.devices.model
    pools: dict[str, dict[str, Any]] = {}
    for s in model.newest_slices():
        pool = pools.setdefault(
            f"{s.driver}/{s.pool}",
            {
                "generation": s.generation,
                "slices": 0,
                "resourceSliceCount": s.slice_count,
                "devices": 0,
                "node": s.node or ("all nodes" if s.all_nodes else "node selector"),
            },
        )
        pool["slices"] += 1
        pool["devices"] += len(s.devices)
    return {
        "pools": dict(sorted(pools.items())),
        "classes": device_counts(state),
        "claims": len(model.claims),
        "errors": sorted(s.error for s in model.slices.values() if s.error),
        "selectors_counted_by_class": dict(sorted(model.fallbacks.items())),
    }
