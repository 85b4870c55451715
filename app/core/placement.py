"""Where a pod may go: the parts of its spec kube-scheduler's filters check against a node.

nodeSelector, required node affinity (matchExpressions and matchFields),
and taints with their tolerations, parsed once per pod into small frozen
values (most pods have none: None, no memory) and checked per node.
Whole-gang feasibility (app/core/packing.py), node choice and preemption
planning all ask the same question here. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        """core/v1 Toleration.ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]
    # matchFields (only metadata.name exists) instead of matchExpressions.
    field: bool = False


@dataclass(frozen=True, slots=True)
class Placement:
    """The parts of a pod spec that restrict its nodes (None on a pod means: any node)."""

    node_selector: tuple[tuple[str, str], ...] = ()
    # Required node affinity: ORed terms of ANDed requirements; () = no affinity.
    terms: tuple[tuple[Requirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def allows(self, node: str, labels: Mapping[str, str], taints: Sequence[Taint]) -> bool:
        for key, value in self.node_selector:
            if labels.get(key) != value:
                return False
        if self.terms and not any(_term_matches(t, node, labels) for t in self.terms):
            return False
        return all(
            taint.effect not in ("NoSchedule", "NoExecute") or self.tolerates(taint)
            for taint in taints
        )

    def tolerates(self, taint: Taint) -> bool:
        """Whether one of the pod's tolerations tolerates `taint`."""
        return any(t.tolerates(taint) for t in self.tolerations)


ANY_NODE = Placement()
"""The placement of a pod with no node restrictions (a Demand's None)."""


def _term_matches(term: Sequence[Requirement], node: str, labels: Mapping[str, str]) -> bool:
    # An empty term matches nothing (kube-scheduler's nodeaffinity semantics).
    return bool(term) and all(requirement_matches(r, node, labels) for r in term)


def requirement_matches(req: Requirement, node: str, labels: Mapping[str, str]) -> bool:
    """One node-affinity (or label-selector) requirement against a node's name and labels."""
    if req.field:
        value: str | None = node if req.key == "metadata.name" else None
    else:
        value = labels.get(req.key)
    if req.operator == "In":
        return value is not None and value in req.values
    if req.operator == "NotIn":
        return value is None or value not in req.values
    if req.operator == "Exists":
        return value is not None
    if req.operator == "DoesNotExist":
        return value is None
    if req.operator in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if req.operator == "Gt" else have < bound
    return False


def placement_of(spec: Mapping[str, Any]) -> Placement | None:
    """The pod's node restrictions, None when it has none (most pods: saves memory)."""
    selector = tuple(sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items()))
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = tuple(
        tuple(
            [_requirement(e, False) for e in term.get("matchExpressions") or ()]
            + [_requirement(e, True) for e in term.get("matchFields") or ()]
        )
        for term in affinity.get("nodeSelectorTerms") or ()
        if isinstance(term, Mapping)
    )
    tolerations = tuple(
        Toleration(
            str(t.get("key") or ""),
            str(t.get("operator") or "Equal"),
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or ()
        if isinstance(t, Mapping)
    )
    if not selector and not terms and not tolerations:
        return None
    return Placement(selector, terms, tolerations)


def _requirement(raw: Mapping[str, Any], is_field: bool) -> Requirement:
    return Requirement(
        str(raw.get("key") or ""),
        str(raw.get("operator") or ""),
        tuple(str(v) for v in raw.get("values") or ()),
        is_field,
    )


def taints_of(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or ()
        if isinstance(t, Mapping)
    )
