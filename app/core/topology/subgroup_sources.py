"""Sub-groups as a group object declares them: Volcano's spec.subGroupPolicy. Pure.

Also the checks every declared list of named sub-groups shares (Volcano's
spec.subGroupPolicy here, KAI's spec.subGroups in app/core/kai.py): a
list, of objects, each named once, counts that are int32s
(`named_entries`, `int32_count`), so both check them one way, each in its own words.

Volcano's fields as volcano-sh/apis v1beta1 `SubGroupPolicySpec` has them: `name`,
`subGroupSize` (default 1), `minSubGroups` (default 0), `labelSelector`,
`matchLabelKeys` and `networkTopology`. Read as Volcano's scheduler reads
them (app/core/topology/subgroups.py SubGroupPolicy.path_of): the policies
in order, the first that takes a pod wins.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from app.core.api_ints import INT32_MAX, is_int32
from app.core.placement import Requirement
from app.core.topology.domains import TopologyError
from app.core.topology.sources import constraint_from_volcano
from app.core.topology.subgroups import SubGroupPolicy

# The label selector operators (metav1.LabelSelectorRequirement).
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class ListWords(NamedTuple):
    """A source's own words for a declared list's mistakes: the entry's are templates of
    `{where}` ("spec.<field>[i]"), so the message names the entry."""

    not_a_list: str
    not_an_object: str
    unnamed: str


def named_entries(
    spec: Mapping[str, Any], field: str, words: ListWords
) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """spec[field]'s entries in order, as (where, name, entry); nothing when it is absent.

    TopologyError in the source's `words` when it is not a list, an entry is not an
    object or has no name; naming the name when it comes twice. The caller checks the
    rest of each entry as it comes: the first mistake in the list is the one reported.
    """
    raw = spec.get(field)
    if not raw:
        return
    if not isinstance(raw, list):
        raise TopologyError(words.not_a_list)
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"spec.{field}[{i}]"
        if not isinstance(entry, Mapping):
            raise TopologyError(words.not_an_object.format(where=where))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise TopologyError(words.unnamed.format(where=where))
        if name in seen:
            raise TopologyError(f"spec.{field} names {name} twice")
        seen.add(name)
        yield where, name, entry


def int32_count(value: Any, where: str, minimum: int) -> int:
    """`value` when it is an integer from `minimum` to int32's largest, else TopologyError
    naming `where` (a bool is not a count)."""
    if not is_int32(value, minimum):
        raise TopologyError(
            f"{where} must be an integer between {minimum} and {INT32_MAX}, got {value!r:.40}"
        )
    return value


def policies_from_volcano(spec: Mapping[str, Any]) -> tuple[SubGroupPolicy, ...]:
    """spec.subGroupPolicy, () when absent; TopologyError naming the field when unusable."""
    words = ListWords(
        "spec.subGroupPolicy must be a list of policies",
        "{where} must be an object",
        "{where}.name must name the policy (its sub-groups are named so)",
    )
    policies: list[SubGroupPolicy] = []
    for where, name, entry in named_entries(spec, "subGroupPolicy", words):
        keys = entry.get("matchLabelKeys") or []
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise TopologyError(f"{where}.matchLabelKeys must be a list of label keys")
        try:
            constraint = constraint_from_volcano(entry)
        except TopologyError as err:
            raise TopologyError(f"{where}: {str(err).replace('spec.', '', 1)}") from None
        if constraint is not None:
            origin = constraint.origin.replace("PodGroup spec.", f"PodGroup {where}.", 1)
            constraint = replace(constraint, origin=origin)
        policies.append(
            SubGroupPolicy(
                name,
                _count(entry, "subGroupSize", 1, 1, where),
                _count(entry, "minSubGroups", 0, 0, where),
                _selector(entry.get("labelSelector"), where),
                tuple(keys),
                constraint,
            )
        )
    return tuple(policies)


def _count(entry: Mapping[str, Any], field: str, default: int, minimum: int, where: str) -> int:
    value = entry.get(field)
    return default if value is None else int32_count(value, f"{where}.{field}", minimum)


def _selector(raw: Any, where: str) -> tuple[Requirement, ...]:
    """A metav1.LabelSelector as requirements (matchLabels are `In` one value)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise TopologyError(f"{where}.labelSelector must be an object")
    labels = raw.get("matchLabels") or {}
    expressions = raw.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not isinstance(expressions, list):
        raise TopologyError(
            f"{where}.labelSelector: matchLabels must map keys to values and "
            "matchExpressions be a list"
        )
    out = [Requirement(str(k), "In", (str(v),)) for k, v in sorted(labels.items())]
    for expression in expressions:
        operator = expression.get("operator") if isinstance(expression, Mapping) else None
        if operator not in _OPERATORS or not isinstance(expression.get("key"), str):
            raise TopologyError(
                f"{where}.labelSelector.matchExpressions: each needs a key and an operator "
                f"of {', '.join(_OPERATORS)}"
            )
        values = tuple(str(v) for v in expression.get("values") or ())
        out.append(Requirement(expression["key"], operator, values))
    return tuple(out)
