"""When the filter may name a gang member's node itself, and which nodes it may pick from.

Given more than one node, kube-scheduler runs every score plugin on each
and asks our prioritize verb too, one pod at a time; given one node it skips
scoring altogether (schedule_one.go: "only one node after predicate"). At
2,000 nodes that scoring and our second round trip were most of a gang
member's scheduling cycle, and the extender already knows which node it
ranks first (app/core/scoring.py NodeScorer.best: locality and binpack,
the profile's MostAllocated formula). So the filter answers with that one
node, unless the pod asks for something only kube-scheduler's scoring
weighs: a preferred node affinity, a preferred pod (anti-)affinity, or a
topology spread that may be broken (ScheduleAnyway). Nodes with a
PreferNoSchedule taint the pod does not tolerate are picked only when no
other node is offered. Everything required (selectors, required
affinities, DoNotSchedule spreading, taints that forbid) was already
checked by kube-scheduler's filters on the nodes it offers us.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.core.packing import placement_of
from app.core.records import NodeRecord

_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def soft_preference(pod_spec: Mapping[str, Any]) -> str | None:
    """What in the pod's spec only kube-scheduler's scoring weighs, or None if nothing.

    The answer is logged, so it names the field.
    """
    affinity = pod_spec.get("affinity") or {}
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        if (affinity.get(kind) or {}).get(_PREFERRED):
            return f"affinity.{kind}.{_PREFERRED}"
    for constraint in pod_spec.get("topologySpreadConstraints") or ():
        if isinstance(constraint, Mapping) and constraint.get("whenUnsatisfiable") == (
            "ScheduleAnyway"
        ):
            return "topologySpreadConstraints (whenUnsatisfiable: ScheduleAnyway)"
    return None


def without_disfavoured(
    names: Sequence[str], nodes: Mapping[str, NodeRecord], pod_spec: Mapping[str, Any]
) -> Sequence[str]:
    """`names` less the nodes with a PreferNoSchedule taint the pod does not tolerate.

    All of `names` when every one of them has such a taint: kube-scheduler's
    TaintToleration score would rank them by how many, and any of them is
    allowed.
    """
    # Most nodes have no taint at all: an empty tuple is the whole test for them.
    tainted = [
        name
        for name in names
        if (record := nodes.get(name)) is not None
        and record.taints
        and any(t.effect == "PreferNoSchedule" for t in record.taints)
    ]
    if not tainted:
        return names
    placement = placement_of(pod_spec)
    tolerations = placement.tolerations if placement is not None else ()
    disfavoured = {
        name
        for name in tainted
        if any(
            t.effect == "PreferNoSchedule" and not any(tol.tolerates(t) for tol in tolerations)
            for t in nodes[name].taints
        )
    }
    kept = [name for name in names if name not in disfavoured]
    return kept or names
