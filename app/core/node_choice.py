"""When the filter may name a gang member's node itself, and which nodes it may pick from.

Given more than one node, kube-scheduler runs every score plugin on each
and asks our prioritize verb too, one pod at a time; given one node it skips
scoring altogether (schedule_one.go: "only one node after predicate"). At
2,000 nodes that scoring and our second round trip were most of a gang
member's scheduling cycle, and the extender already knows which node it
ranks first (app/core/scoring.py NodeScorer.best: locality and binpack,
the profile's MostAllocated formula). So the filter answers with that one
node, unless the pod asks for something only kube-scheduler's scoring
weighs: a preferred node affinity, a preferred pod (anti-)affinity, a
topology spread that may be broken (ScheduleAnyway), or the spreading
kube-scheduler gives by default to the pods of a ReplicaSet, a
ReplicationController or a StatefulSet. Nodes with a
PreferNoSchedule taint the pod does not tolerate are picked only when no
other node is offered. Everything required (selectors, required
affinities, DoNotSchedule spreading, taints that forbid) was already
checked by kube-scheduler's filters on the nodes it offers us.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.core.placement import Placement, Taint, placement_of
from app.core.records import NodeRecord
from app.core.state import ClusterState

_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


# kube-scheduler spreads the pods of these owners over hosts and zones by
# default (PodTopologySpread's system defaults, whenUnsatisfiable
# ScheduleAnyway): a Deployment gang packed on one node by our pick would
# leave no node whole for the next gang, where kube-scheduler would not.
_SPREAD_BY_DEFAULT = frozenset({"ReplicaSet", "ReplicationController", "StatefulSet"})


def soft_preference(
    pod_spec: Mapping[str, Any], meta: Mapping[str, Any] | None = None
) -> str | None:
    """What only kube-scheduler's scoring weighs for this pod, or None if nothing.

    `meta`: the pod's metadata, for its owner. The answer names the field.
    """
    owners = (meta or {}).get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, Mapping) and owner.get("kind") in _SPREAD_BY_DEFAULT:
            return f"owned by a {owner['kind']} (kube-scheduler's default spreading)"
    affinity = pod_spec.get("affinity")
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        terms = affinity.get(kind) if isinstance(affinity, Mapping) else None
        if isinstance(terms, Mapping) and terms.get(_PREFERRED):
            return f"affinity.{kind}.{_PREFERRED}"
    spread = pod_spec.get("topologySpreadConstraints")
    for constraint in spread if isinstance(spread, list) else ():
        if isinstance(constraint, Mapping) and constraint.get("whenUnsatisfiable") == (
            "ScheduleAnyway"
        ):
            return "topologySpreadConstraints (whenUnsatisfiable: ScheduleAnyway)"
    return None


SoftTaints = Mapping[str, tuple[Taint, ...]]
"""Node name -> its PreferNoSchedule taints, for the nodes that have any."""


def soft_taints_of(nodes: Mapping[str, NodeRecord]) -> dict[str, tuple[Taint, ...]]:
    """The PreferNoSchedule taints of `nodes` (those without any left out)."""
    return {name: soft for name, record in nodes.items() if (soft := _soft(record))}


class SoftTaintedNodes:
    """The cluster's nodes with a PreferNoSchedule taint, kept from one filter call to the next.

    Looking at the taints of every offered node for every member was 4% of
    the extender's CPU at 2,000 nodes, and such taints are rare: this redoes
    only the nodes the state's change log reports changed.
    """

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._seen = 0
        self._taints: dict[str, tuple[Taint, ...]] = {}

    def current(self) -> SoftTaints:
        self._seen, changed = self._state.nodes_changed_since(self._seen)
        nodes = self._state.nodes
        if changed is None:
            self._taints = soft_taints_of(nodes)
            return self._taints
        for name in changed:
            record = nodes.get(name)
            soft = _soft(record) if record is not None else ()
            if soft:
                self._taints[name] = soft
            else:
                self._taints.pop(name, None)
        return self._taints


def _soft(record: NodeRecord) -> tuple[Taint, ...]:
    return (
        tuple(t for t in record.taints if t.effect == "PreferNoSchedule") if record.taints else ()
    )


def without_disfavoured(
    names: Sequence[str], soft_taints: SoftTaints, pod_spec: Mapping[str, Any]
) -> Sequence[str]:
    """`names` less the nodes with a PreferNoSchedule taint the pod does not tolerate.

    All of `names` when every one of them has such a taint: kube-scheduler's
    TaintToleration score would rank them by how many, and any of them is
    allowed.
    """
    if not soft_taints:
        return names
    placement = placement_of(pod_spec) or Placement()
    disfavoured = {
        name
        for name, taints in soft_taints.items()
        if not all(placement.tolerates(t) for t in taints)
    }
    if not disfavoured:
        return names
    kept = [name for name in names if name not in disfavoured]
    return kept or names
