"""Topology constraints as each group source declares them. Pure.

- native PodGroup: `spec.schedulingConstraints.topology[0].key` (required);
- Volcano PodGroup: `spec.networkTopology` (`mode: hard|soft`,
  `highestTierAllowed` or `highestTierName`), resolved against HyperNode
  tiers or the configured levels by app/core/topology.levels_to_try;
- Kueue's annotations `kueue.x-k8s.io/podset-required-topology` /
  `podset-preferred-topology` on the PodGroup (any source) or on the pods.

app/core/topology/domains.py places a gang given its constraint; this module only reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.core.topology.domains import TopologyConstraint, TopologyError

KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
# Volcano's networkTopology as annotations (on a Job's pods): mode hard|soft, highest tier N.
VOLCANO_MODE = "volcano.sh/network-topology-mode"
VOLCANO_HIGHEST_TIER = "volcano.sh/network-topology-highest-tier"


def constraint_from_annotations(
    annotations: Mapping[str, Any] | None, where: str
) -> TopologyConstraint | None:
    """Kueue's podset required/preferred topology annotations (required wins when both),
    else Volcano's network-topology annotations."""
    if not annotations:
        return None
    if KUEUE_REQUIRED not in annotations and KUEUE_PREFERRED not in annotations:
        return _volcano_annotations(annotations, where)
    for name, required in ((KUEUE_REQUIRED, True), (KUEUE_PREFERRED, False)):
        value = annotations.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
            raise TopologyError(
                f"annotation {name}={value!r:.80} on the {where} must be a node label key "
                "(e.g. topology.kubernetes.io/zone)"
            )
        return TopologyConstraint(value, required, origin=f"annotation {name} on the {where}")
    return None


def _volcano_annotations(annotations: Mapping[str, Any], where: str) -> TopologyConstraint | None:
    """volcano.sh/network-topology-mode (default hard) and -highest-tier (default 1)."""
    mode, tier = annotations.get(VOLCANO_MODE), annotations.get(VOLCANO_HIGHEST_TIER)
    if mode is None and tier is None:
        return None
    mode = mode or "hard"
    if mode not in ("hard", "soft"):
        raise TopologyError(
            f"annotation {VOLCANO_MODE}={mode!r:.40} on the {where} must be hard or soft"
        )
    text = "1" if tier is None else str(tier)
    if not text.isdigit() or int(text) < 1:
        raise TopologyError(
            f"annotation {VOLCANO_HIGHEST_TIER}={tier!r:.40} on the {where} must be an integer >= 1"
        )
    return TopologyConstraint(
        "",
        mode == "hard",
        tier=int(text),
        origin=f"annotations {VOLCANO_MODE}={mode}, {VOLCANO_HIGHEST_TIER}={text} on the {where}",
    )


def constraint_from_native(spec: Mapping[str, Any]) -> TopologyConstraint | None:
    """scheduling.k8s.io PodGroup: spec.schedulingConstraints.topology[].key (at most one)."""
    constraints = spec.get("schedulingConstraints")
    if not isinstance(constraints, Mapping):
        return None
    topology = constraints.get("topology")
    if not topology:
        return None
    if not isinstance(topology, list) or len(topology) != 1 or not isinstance(topology[0], Mapping):
        raise TopologyError(
            "spec.schedulingConstraints.topology must list exactly one {key: <node label>}"
        )
    key = topology[0].get("key")
    if not isinstance(key, str) or not key:
        raise TopologyError("spec.schedulingConstraints.topology[0].key must be a node label key")
    return TopologyConstraint(key, True, origin="PodGroup spec.schedulingConstraints.topology")


def constraint_from_volcano(spec: Mapping[str, Any]) -> TopologyConstraint | None:
    """Volcano PodGroup: spec.networkTopology {mode, highestTierAllowed | highestTierName}."""
    raw = spec.get("networkTopology")
    if not raw:
        return None
    if not isinstance(raw, Mapping):
        raise TopologyError("spec.networkTopology must be an object (mode, highestTierAllowed)")
    mode = raw.get("mode") or "hard"
    if mode not in ("hard", "soft"):
        raise TopologyError(f"spec.networkTopology.mode must be hard or soft, got {mode!r:.40}")
    name = raw.get("highestTierName")
    if name is not None:
        if "highestTierAllowed" in raw:
            raise TopologyError(
                "spec.networkTopology sets both highestTierAllowed and highestTierName: set one"
            )
        if not isinstance(name, str) or not name:
            raise TopologyError("spec.networkTopology.highestTierName must be a tier name")
        return TopologyConstraint(
            "",
            mode == "hard",
            tier_name=name,
            origin=f"PodGroup spec.networkTopology mode {mode}, highestTierName {name}",
        )
    tier = raw.get("highestTierAllowed", 1)
    if not isinstance(tier, int) or isinstance(tier, bool) or tier < 1:
        raise TopologyError(
            f"spec.networkTopology.highestTierAllowed must be an integer >= 1, got {tier!r:.40}"
        )
    return TopologyConstraint(
        "",
        mode == "hard",
        tier=tier,
        origin=f"PodGroup spec.networkTopology mode {mode}, highestTierAllowed {tier}",
    )


def constraint_of(
    own: TopologyConstraint | None,
    member_constraints: Iterable[tuple[str, TopologyConstraint | None]],
    pod: TopologyConstraint | None = None,
) -> TopologyConstraint | None:
    """A gang's constraint: its group object's (`own`), else its members' annotations.

    member_constraints: (pod key, its annotations' constraint); the first pod
    by name that has one decides, so every member agrees.
    """
    if own is not None:
        return own
    for _, constraint in sorted(
        ((k, c) for k, c in member_constraints if c is not None), key=lambda kc: kc[0]
    ):
        return constraint
    return pod
