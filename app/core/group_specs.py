"""How each PodGroup API's spec becomes a GroupSpec: x-k8s, Volcano and Kubernetes' own. Pure.

The CRD schemas validate new objects; these readers also guard old ones and
say what is wrong in words a user can act on (PodGroupSpecError). KAI's
PodGroups are read in app/core/group_rules.py; objectless groups in
app/core/groups.py (their pods' labels say).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from app.core.api_ints import INT32_MAX, is_int32
from app.core.groups import (
    SOURCE_NATIVE,
    SOURCE_VOLCANO,
    SOURCE_XK8S,
    GroupSpec,
    PodGroupSpecError,
)
from app.core.resources import QuantityError, Resources, parse_resource_list
from app.core.topology.domains import TopologyError
from app.core.topology.sources import constraint_from_native, constraint_from_volcano
from app.core.topology.subgroup_sources import policies_from_volcano

_T = TypeVar("_T")


# The group APIs declare their counts and timeouts as int32.


def _int_field(
    key: str, spec: Mapping[str, Any], name: str, default: int | None, minimum: int
) -> int | None:
    # An explicit null is an absent field, as the API server's defaulting treats it.
    value = spec.get(name)
    if value is None:
        value = default
    if value is None:
        return None
    if not is_int32(value, minimum):
        raise PodGroupSpecError(
            f"PodGroup {key}: spec.{name} must be an integer between {minimum} and "
            f"{INT32_MAX}, got {value!r:.80}"
        )
    return value


def _spec_object(key: str, spec: Any) -> Mapping[str, Any]:
    """The spec as a mapping: absent is empty, anything else but an object is refused."""
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise PodGroupSpecError(f"PodGroup {key}: spec must be an object, got {spec!r:.80}")
    return spec


def _min_resources(key: str, spec: Mapping[str, Any]) -> Resources:
    try:
        return parse_resource_list(spec.get("minResources"))
    except QuantityError as err:
        raise PodGroupSpecError(f"PodGroup {key}: spec.minResources: {err}") from None


def spec_from_podgroup(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read an x-k8s PodGroup's spec; the CRD schema already validates, this guards old objects.

    scheduleTimeoutSeconds 0 or absent means "the extender's default", as in
    upstream Coscheduling: mpi-operator and the training-operator write 0
    when a job sets no timeout.
    """
    spec = _spec_object(key, spec)
    min_member = _int_field(key, spec, "minMember", 1, 1)
    assert min_member is not None
    timeout = _int_field(key, spec, "scheduleTimeoutSeconds", None, 0)
    return GroupSpec(
        key=key,
        min_member=min_member,
        min_resources=_min_resources(key, spec),
        schedule_timeout_seconds=timeout or None,
    )


def spec_from_volcano(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read a Volcano PodGroup's spec (minMember 0 or absent: every pod on its own)."""
    spec = _spec_object(key, spec)
    min_member = _int_field(key, spec, "minMember", 1, 0) or 1
    raw_tasks = spec.get("minTaskMember") or {}
    if not isinstance(raw_tasks, Mapping):
        raise PodGroupSpecError(f"PodGroup {key}: spec.minTaskMember must map task names to counts")
    tasks = []
    for task, count in sorted(raw_tasks.items()):
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise PodGroupSpecError(
                f"PodGroup {key}: spec.minTaskMember[{task}] must be an integer >= 0"
            )
        if count:
            tasks.append((str(task), count))
    queue = spec.get("queue")
    priority_class = spec.get("priorityClassName")
    policies = _topology(key, policies_from_volcano, spec)
    return GroupSpec(
        key=key,
        # Volcano's sub-group check needs minSubGroups x subGroupSize pods ready per policy:
        # the gang never starts (nor the gate binds) with fewer.
        min_member=max(min_member, sum(p.min_sub_groups * p.size for p in policies)),
        min_resources=_min_resources(key, spec),
        source=SOURCE_VOLCANO,
        topology=_topology(key, constraint_from_volcano, spec),
        min_task_member=tuple(tasks),
        sub_group_policy=policies,
        queue=queue if isinstance(queue, str) and queue else None,
        priority_class_name=priority_class if isinstance(priority_class, str) else None,
    )


def spec_from_native(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read a native PodGroup: `schedulingPolicy.gang.minCount`; the `basic` policy is no gang."""
    spec = _spec_object(key, spec)
    policy = spec.get("schedulingPolicy") or {}
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    topology = _topology(key, constraint_from_native, spec)
    if not isinstance(gang, Mapping):
        return GroupSpec(key=key, min_member=1, source=SOURCE_NATIVE, topology=topology)
    min_count = _int_field(key, gang, "minCount", None, 1)
    if min_count is None:
        raise PodGroupSpecError(f"PodGroup {key}: spec.schedulingPolicy.gang.minCount is required")
    priority_class = spec.get("priorityClassName")
    return GroupSpec(
        key=key,
        min_member=min_count,
        source=SOURCE_NATIVE,
        topology=topology,
        priority_class_name=priority_class if isinstance(priority_class, str) else None,
    )


def _topology(key: str, reader: Callable[[Mapping[str, Any]], _T], spec: Mapping[str, Any]) -> _T:
    try:
        return reader(spec)
    except TopologyError as err:
        raise PodGroupSpecError(f"PodGroup {key}: {err}") from None


SPEC_READERS = {
    SOURCE_XK8S: spec_from_podgroup,
    SOURCE_VOLCANO: spec_from_volcano,
    SOURCE_NATIVE: spec_from_native,
}
