"""How a pod names its gang, and what the gang asks for.

Two spellings are supported, as in scheduler-plugins: the label
`scheduling.x-k8s.io/pod-group: <PodGroup name>` (a PodGroup object in the
pod's namespace carries minMember, minResources and the timeout), and the
older label pair `pod-group.scheduling.sigs.k8s.io/name` +
`.../min-available` that needs no CRD. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.resources import QuantityError, Resources, parse_resource_list

PODGROUP_GROUP = "scheduling.x-k8s.io"
PODGROUP_VERSION = "v1alpha1"
PODGROUP_API_VERSION = f"{PODGROUP_GROUP}/{PODGROUP_VERSION}"
PODGROUP_PLURAL = "podgroups"

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LIGHT_NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
LIGHT_MIN_AVAILABLE_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"


class GroupLabelError(ValueError):
    """The pod's group labels cannot be understood; the message says how to fix them."""


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A pod's pointer to its group, as read from its labels."""

    namespace: str
    name: str
    # Set for label-only groups; None when a PodGroup object holds the spec.
    min_available: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What the group asks for, whichever spelling declared it."""

    key: str
    min_member: int
    min_resources: Resources = field(default_factory=dict)
    # None: use the extender's --permit-waiting-time-seconds.
    schedule_timeout_seconds: int | None = None


def group_ref_of(namespace: str, labels: Mapping[str, str] | None) -> GroupRef | None:
    """The group a pod belongs to, None for an ordinary pod.

    Raises GroupLabelError for labels that name a group but cannot be used,
    so the pod is rejected with a message instead of silently scheduled alone.
    """
    if not labels:
        return None
    name = labels.get(POD_GROUP_LABEL)
    if name is not None:
        if not name:
            raise GroupLabelError(
                f"label {POD_GROUP_LABEL} is empty: set it to the name of a PodGroup "
                "in the pod's namespace, or remove it"
            )
        return GroupRef(namespace, name)
    name = labels.get(LIGHT_NAME_LABEL)
    if name is None:
        return None
    raw_min = labels.get(LIGHT_MIN_AVAILABLE_LABEL)
    if not name:
        raise GroupLabelError(f"label {LIGHT_NAME_LABEL} is empty: set it to the group's name")
    if raw_min is None:
        raise GroupLabelError(
            f"label {LIGHT_NAME_LABEL}={name} needs {LIGHT_MIN_AVAILABLE_LABEL} "
            "(the number of pods that must start together)"
        )
    try:
        min_available = int(raw_min)
    except ValueError:
        min_available = 0
    if min_available < 1:
        raise GroupLabelError(
            f"label {LIGHT_MIN_AVAILABLE_LABEL}={raw_min!r} must be a whole number >= 1"
        )
    return GroupRef(namespace, name, min_available)


class PodGroupSpecError(ValueError):
    """A PodGroup object whose spec cannot be used."""


def spec_from_podgroup(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read a PodGroup's spec; the CRD schema already validates, this guards old objects."""
    spec = spec or {}
    if not isinstance(spec, Mapping):
        raise PodGroupSpecError(f"PodGroup {key}: spec must be an object, got {spec!r:.80}")
    min_member = spec.get("minMember", 1)
    if not _int32(min_member) or min_member < 1:
        raise PodGroupSpecError(
            f"PodGroup {key}: spec.minMember must be an integer between 1 and {_INT32_MAX}, "
            f"got {min_member!r:.80}"
        )
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is not None and (not _int32(timeout) or timeout < 1):
        raise PodGroupSpecError(
            f"PodGroup {key}: spec.scheduleTimeoutSeconds must be an integer between 1 and "
            f"{_INT32_MAX}, got {timeout!r:.80}"
        )
    try:
        min_resources = parse_resource_list(spec.get("minResources"))
    except QuantityError as err:
        raise PodGroupSpecError(f"PodGroup {key}: spec.minResources: {err}") from None
    return GroupSpec(
        key=key,
        min_member=min_member,
        min_resources=min_resources,
        schedule_timeout_seconds=timeout,
    )


# The PodGroup API declares minMember and scheduleTimeoutSeconds as int32.
_INT32_MAX = 2**31 - 1


def _int32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value <= _INT32_MAX


def spec_from_labels(ref: GroupRef) -> GroupSpec:
    assert ref.min_available is not None
    return GroupSpec(key=ref.key, min_member=ref.min_available)
