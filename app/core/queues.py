"""Queues: teams share the cluster by weight (Volcano's proportion, enqueue, reclaim). Pure.

A queue is Volcano's `scheduling.volcano.sh/v1beta1` Queue: a weight, an
optional capability (a ceiling), a guarantee (a floor kept for it), whether
other queues may reclaim from it, and Open/Closed. A gang belongs to one queue:
a Volcano PodGroup's `spec.queue`, else the annotation
`scheduling.volcano.sh/queue-name` on its group object or its pods, else
"default". With no Queue objects at all nothing here is consulted.

- **Deserved share** (`deserved_shares`): the capacity the queues share is
  split by weight among the queues, each capped by its capability and by what
  it asks for (allocated plus waiting), never below its guarantee; what a
  capped queue leaves is split again among the others (water-filling), per
  resource, as Volcano's proportion plugin does.
- **Enqueue** (`enqueue`): a queue below its deserved share may admit a gang
  that takes it up to deserved x overcommit (gangs come whole, so the last one
  may overshoot a little); a queue at or above its share admits more only
  while no other queue below its share has a gang waiting that it could admit
  (work conserving). Never beyond the capability, nor into the other
  queues' guarantees. A Closed queue admits nothing new.
- **Order inside a queue** (`dominant_share`): priority, then the job's
  dominant resource share (DRF: the gang that holds less goes first), then age.
- **Reclaim** (`choose_victims`, app/core/reclaim.py): for a gang of a queue below its share that
  does not fit, whole gangs of reclaimable queues above their share, lowest
  priority and most recently created first, as few as make room by the gang's
  own fits test (its required topology level: room freed in a rack it cannot
  use is no room), tried over all of them and per domain it may need.

Resources are milli-units (app/core/resources.py); "pods" slots are no share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.resources import (
    DEVICE_PREFIX,
    MEMBER_RESOURCE,
    PREEMPTOR_RESOURCE,
    QuantityError,
    Resources,
    format_resources,
    parse_resource_list,
)


def _parse(raw: Mapping[str, Any] | None) -> Resources:
    """A queue's resource list; a bare DeviceClass name ("gpu.example.com": 16, a dotted name
    with no "/", which no Kubernetes resource has) means its DRA devices, `devices/<class>`."""
    return {
        f"{DEVICE_PREFIX}{name}" if "." in name and "/" not in name else name: amount
        for name, amount in parse_resource_list(raw).items()
    }


QUEUE_GROUP = "scheduling.volcano.sh"
QUEUE_VERSION = "v1beta1"
QUEUE_PLURAL = "queues"
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
DEFAULT_QUEUE = "default"
# Water-filling rounds: each hands out what the capped queues left, so a
# handful suffices; the bound only guards against integer crumbs.
_ROUNDS = 64
_NO_SHARE = frozenset({"pods", MEMBER_RESOURCE, PREEMPTOR_RESOURCE})


class QueueState(StrEnum):
    """Volcano's status.state values; only Open admits new gangs."""

    OPEN = "Open"
    CLOSED = "Closed"
    CLOSING = "Closing"


class QueueSpecError(ValueError):
    """A Queue object we cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    weight: int = 1
    # None: no ceiling.
    capability: Resources | None = None
    guarantee: Resources = field(default_factory=dict)
    reclaimable: bool = True
    state: str = QueueState.OPEN

    @property
    def open(self) -> bool:
        return self.state in (QueueState.OPEN, "")


def queue_from(raw: Mapping[str, Any]) -> QueueSpec:
    """A Queue object as a QueueSpec (defaults as Volcano's: weight 1, reclaimable)."""
    name = str((raw.get("metadata") or {}).get("name") or "")
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    weight = spec.get("weight", 1)
    if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
        raise QueueSpecError(f"Queue {name}: spec.weight must be an integer >= 0")
    try:
        capability = _parse(spec.get("capability")) if spec.get("capability") else None
        guarantee = _parse((spec.get("guarantee") or {}).get("resource"))
    except QuantityError as err:
        raise QueueSpecError(f"Queue {name}: {err}") from None
    reclaimable = spec.get("reclaimable")
    return QueueSpec(
        name=name,
        weight=weight,
        capability=capability,
        guarantee=guarantee,
        reclaimable=reclaimable is not False,
        state=str(status.get("state") or QueueState.OPEN),
    )


def dims(capacity: Mapping[str, int]) -> list[str]:
    """The resources shares are counted in: the cluster's, less pod slots."""
    return sorted(r for r in capacity if r not in _NO_SHARE)


def dominant_share(resources: Mapping[str, int], capacity: Mapping[str, int]) -> float:
    """DRF: the largest fraction of any one resource of the cluster that `resources` take."""
    return max(
        (
            amount / capacity[r]
            for r, amount in resources.items()
            if capacity.get(r) and r not in _NO_SHARE
        ),
        default=0.0,
    )


def deserved_shares(
    queues: Mapping[str, QueueSpec],
    requests: Mapping[str, Mapping[str, int]],
    capacity: Mapping[str, int],
) -> dict[str, Resources]:
    """Each queue's deserved share of `capacity` (Volcano's proportion, water-filling).

    `requests`: per queue, what it holds plus what its waiting gangs ask for.
    A queue's ceiling is its capability and the capacity less the other
    queues' guarantees; its floor its guarantee.
    """
    names = dims(capacity)
    total_guarantee = {r: sum(q.guarantee.get(r, 0) for q in queues.values()) for r in names}
    ceiling: dict[str, dict[str, int]] = {}
    for name, queue in queues.items():
        real = {
            r: capacity.get(r, 0) - total_guarantee[r] + queue.guarantee.get(r, 0) for r in names
        }
        if queue.capability is not None:
            for r, cap in queue.capability.items():
                if r in real:
                    real[r] = min(real[r], cap)
        ceiling[name] = real
    deserved: dict[str, dict[str, int]] = {name: dict.fromkeys(names, 0) for name in queues}
    remaining = {r: capacity.get(r, 0) for r in names}
    met: set[str] = set()
    for _ in range(_ROUNDS):
        active = [n for n in sorted(queues) if n not in met]
        total_weight = sum(queues[n].weight for n in active)
        if not total_weight:
            break
        before = dict(remaining)
        portions = _portions(before, [(n, queues[n].weight) for n in active], total_weight)
        for name in active:
            queue, request = queues[name], requests.get(name, {})
            old = deserved[name]
            new = {}
            for r in names:
                amount = old[r] + portions[name][r]
                amount = min(amount, ceiling[name][r], request.get(r, 0))
                new[r] = max(amount, queue.guarantee.get(r, 0))
            if all(new[r] >= min(request.get(r, 0), ceiling[name][r]) for r in names):
                met.add(name)  # it cannot grow in any resource: the rest is for the others
            for r in names:
                remaining[r] -= new[r] - old[r]
            deserved[name] = new
        if remaining == before or all(v <= 0 for v in remaining.values()):
            break
    return deserved


def _portions(
    remaining: Mapping[str, int], weights: Sequence[tuple[str, int]], total_weight: int
) -> dict[str, dict[str, int]]:
    """`remaining` split by weight, the integer crumbs to the weightiest: nothing is lost."""
    out: dict[str, dict[str, int]] = {}
    for name, weight in weights:
        out[name] = {r: max(v, 0) * weight // total_weight for r, v in remaining.items()}
    heaviest = max(weights, key=lambda w: w[1])[0]
    for r, v in remaining.items():
        out[heaviest][r] += max(v, 0) - sum(p[r] for p in out.values())
    return out


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue at one moment: what it holds, deserves, and its first waiting gang."""

    spec: QueueSpec
    allocated: Resources
    deserved: Resources
    # The request of the gang it would admit first (None: nothing waits).
    head: Resources | None = None
    waiting: int = 0

    def below_share(self) -> bool:
        """Below its deserved share in every resource it deserves some of.

        Not "in any": where the cluster has plenty (memory, often) a queue
        deserves all it asks for, and holds less of it whenever a gang waits;
        the resource it is short of by its weight is what decides.
        """
        deserved = [(r, v) for r, v in self.deserved.items() if v > 0]
        return bool(deserved) and all(self.allocated.get(r, 0) < v for r, v in deserved)

    def describe(self) -> str:
        held = format_resources({r: v for r, v in self.allocated.items() if r in self.deserved})
        return (
            f"queue {self.spec.name} (weight {self.spec.weight}) holds {held or 'nothing'} "
            f"of its deserved {format_resources(self.deserved) or 'nothing'}"
        )


def _within(amounts: Mapping[str, int], limit: Mapping[str, int], factor: float = 1.0) -> bool:
    return all(amounts.get(r, 0) <= v * factor for r, v in limit.items())


def _plus(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for r, v in b.items():
        out[r] = out.get(r, 0) + v
    return out


def ceiling(name: str, views: Mapping[str, QueueView], capacity: Mapping[str, int]) -> Resources:
    """The most queue `name` may hold: its capability, and the capacity less the
    other queues' guarantees (Volcano's realCapability: a guarantee is kept
    for its queue whether it uses it or not)."""
    spec = views[name].spec
    top = {r: capacity.get(r, 0) for r in dims(capacity)}
    for other, view in views.items():
        if other == name:
            continue
        for r, floor in view.spec.guarantee.items():
            if r in top:
                top[r] -= floor
    if spec.capability is not None:
        for r, cap in spec.capability.items():
            top[r] = min(top.get(r, cap), cap)
    return top


def starving(view: QueueView, factor: float) -> bool:
    """Below its share with a waiting gang it could admit: others give way to it."""
    return (
        view.head is not None
        and view.spec.open
        and view.below_share()
        and _within(_plus(view.allocated, view.head), view.deserved, factor)
    )


def enqueue(
    name: str,
    request: Mapping[str, int],
    views: Mapping[str, QueueView],
    capacity: Mapping[str, int],
    factor: float,
) -> str | None:
    """None when queue `name` may admit a gang asking `request`; else why it waits.

    The module docstring states the rule; the message is what
    `kubectl describe pod` shows on the gang's pods.
    """
    view = views[name]
    after = _plus(view.allocated, {r: v for r, v in request.items() if r not in _NO_SHARE})
    if not view.spec.open:
        return (
            f"queue {name} is {view.spec.state}: it admits no new gang; "
            f"the gang waits until the queue is Open"
        )
    top = ceiling(name, views, capacity)
    over = {r: v for r, v in top.items() if after.get(r, 0) > v}
    if over:
        why = "its capability" if view.spec.capability is not None else "the cluster"
        return (
            f"{view.describe()}; with this gang ({format_resources(_visible(request))}) it "
            f"would exceed {format_resources(over)} ({why}, less other queues' "
            f"guarantees); the gang waits until the queue's gangs finish"
        )
    if view.below_share() and _within(after, view.deserved, factor):
        return None
    hungry = sorted(
        (v for n, v in views.items() if n != name and starving(v, factor)),
        key=lambda v: v.spec.name,
    )
    if not hungry:
        return None
    others = "; ".join(f"{v.describe()} with {v.waiting} gang(s) waiting" for v in hungry)
    return (
        f"{view.describe()} and this gang ({format_resources(_visible(request))}) would "
        f"take it beyond that, while a queue below its share waits: {others}; "
        f"the gang is admitted once its queue is below its share or no queue below "
        f"its share waits"
    )


def _visible(resources: Mapping[str, int]) -> Resources:
    return {r: v for r, v in resources.items() if v and r not in _NO_SHARE}


@dataclass(frozen=True, slots=True)
class Running:
    """A gang holding nodes now (every placed member), a possible reclaim victim."""

    key: str
    queue: str
    priority: int
    created: float
    # Requests of its placed members per node.
    held: Mapping[str, Mapping[str, int]]
    total: Mapping[str, int]
    # Its placed members' pod keys: the devices their claims hold of shared pools come back
    # when they go (app/core/shared_pools.py freed_by).
    pods: frozenset[str] = frozenset()
