"""Topology constraints as each group source declares them. Pure.

- native PodGroup: `spec.schedulingConstraints.topology[0].key` (required);
- Volcano PodGroup: `spec.networkTopology` (`mode: hard|soft`,
  `highestTierAllowed` or `highestTierName`), resolved against HyperNode
  tiers or the configured levels by app/core/topology.levels_to_try;
- Kueue's annotations `kueue.x-k8s.io/podset-required-topology` /
  `podset-preferred-topology` on the PodGroup (any source) or on the pods;
- Kueue's podset slices (`podset-slice-required-topology` with
  `podset-slice-size`, or the JSON list `podset-slice-required-topology-constraints`)
  and a member's rank (its index label), for gangs made of groups.

app/core/topology/domains.py places a gang given its constraint, app/core/topology/tree.py
one made of groups; this module only reads them.
"""

from __future__ import annotations

import json
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


# ---- Kueue podset slices (app/core/topology/tree.py places them) -----------------------

KUEUE_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
KUEUE_SLICE_CONSTRAINTS = "kueue.x-k8s.io/podset-slice-required-topology-constraints"
# A pod's rank among its gang's pods, which decides its slice (Kueue's podIndexLabel): the
# first of these labels the pod carries, after the label its pod-group-pod-index-label names.
KUEUE_POD_INDEX = "kueue.x-k8s.io/pod-group-pod-index"
KUEUE_POD_INDEX_LABEL = "kueue.x-k8s.io/pod-group-pod-index-label"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"
RANK_LABELS = (KUEUE_POD_INDEX, JOB_COMPLETION_INDEX, KUBEFLOW_REPLICA_INDEX)
# Kueue's webhook allows at most three layers (TASMultiLayerTopology).
MAX_SLICE_LAYERS = 3


def slices_from_annotations(
    annotations: Mapping[str, Any] | None, where: str
) -> tuple[tuple[str, int], ...]:
    """Kueue's slice layers, outermost first, as (node label key, size); () for none.

    One layer: podset-slice-required-topology with podset-slice-size. Several:
    the JSON list podset-slice-required-topology-constraints
    (`[{"topology": <label>, "size": <n>}]`, outermost first, each inner size
    dividing the one above). Kueue's webhook rules, so a pod it would refuse
    is refused here too, with the rule in the message.
    """
    if not annotations:
        return ()
    required = annotations.get(KUEUE_SLICE_REQUIRED)
    size = annotations.get(KUEUE_SLICE_SIZE)
    listed = annotations.get(KUEUE_SLICE_CONSTRAINTS)
    if listed is not None:
        if required is not None or size is not None:
            raise TopologyError(
                f"annotation {KUEUE_SLICE_CONSTRAINTS} on the {where} cannot be combined with "
                f"{KUEUE_SLICE_REQUIRED} or {KUEUE_SLICE_SIZE}: keep one form"
            )
        return _slice_layers(listed, where)
    if required is None and size is None:
        return ()
    if required is None:
        raise TopologyError(
            f"annotation {KUEUE_SLICE_SIZE} on the {where} needs {KUEUE_SLICE_REQUIRED} "
            "(the node label each slice must share)"
        )
    if size is None:
        raise TopologyError(
            f"annotation {KUEUE_SLICE_REQUIRED} on the {where} needs {KUEUE_SLICE_SIZE} "
            "(the number of pods per slice)"
        )
    return ((_label_key(required, KUEUE_SLICE_REQUIRED, where), _size(size, where)),)


def _label_key(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise TopologyError(
            f"{name}={value!r:.80} on the {where} must be a node label key (e.g. example.com/rack)"
        )
    return value


def _size(value: Any, where: str, name: str = f"annotation {KUEUE_SLICE_SIZE}") -> int:
    text = str(value).strip() if isinstance(value, (str, int)) else ""
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) < 2**31:
        raise TopologyError(
            f"{name}={value!r:.40} on the {where} must be a whole number >= 1 (pods per slice)"
        )
    return int(text)


def _slice_layers(raw: Any, where: str) -> tuple[tuple[str, int], ...]:
    name = f"annotation {KUEUE_SLICE_CONSTRAINTS}"
    try:
        layers = json.loads(raw) if isinstance(raw, str) else None
    except ValueError as err:
        raise TopologyError(
            f"{name} on the {where} is not valid JSON ({err}); write a list like "
            '[{"topology": "example.com/block", "size": 8}, '
            '{"topology": "example.com/rack", "size": 4}]'
        ) from None
    if not isinstance(layers, list) or not 1 <= len(layers) <= MAX_SLICE_LAYERS:
        raise TopologyError(
            f"{name} on the {where} must be a JSON list of 1 to {MAX_SLICE_LAYERS} "
            '{"topology": <node label>, "size": <pods>} objects, outermost first'
        )
    out: list[tuple[str, int]] = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, Mapping):
            raise TopologyError(f"{name} on the {where}: entry {i} must be an object")
        key = _label_key(layer.get("topology"), f"{name} [{i}].topology", where)
        size = _size(layer.get("size"), where, f"{name} [{i}].size")
        if any(key == k for k, _ in out):
            raise TopologyError(f"{name} on the {where} names {key} twice")
        if out and out[-1][1] % size:
            raise TopologyError(
                f"{name} on the {where}: size {size} of {key} must divide the size "
                f"{out[-1][1]} of {out[-1][0]} above it"
            )
        out.append((key, size))
    return tuple(out)


def rank_of(labels: Mapping[str, Any] | None, annotations: Mapping[str, Any] | None) -> int | None:
    """The pod's index in its gang (Kueue's podIndexLabel), None when it carries none.

    An index that is not a whole number counts as none: Kueue's ungater then
    places such pods greedily, and so do we (they get no slice).
    """
    labels = labels or {}
    named = (annotations or {}).get(KUEUE_POD_INDEX_LABEL)
    keys = (named, *RANK_LABELS) if isinstance(named, str) and named else RANK_LABELS
    for key in keys:
        value = labels.get(key)
        if value is None and key == JOB_COMPLETION_INDEX:
            value = (annotations or {}).get(key)
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None
