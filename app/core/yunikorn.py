"""YuniKorn task groups read into gang roles. Pure.

YuniKorn has no group object: the gang is the pods of one application id,
and its task groups are the JSON list in the pod annotation
`yunikorn.apache.org/task-groups` (as `pkg/cache/gang_utils.go` and
`pkg/common/utils/utils.go` of yunikorn-k8shim read it):

- each entry has `name`, `minMember` (>= 1), `minResource` (resource name to
  quantity), and `nodeSelector`, `tolerations`, `affinity` for YuniKorn's
  placeholders. Go's JSON decoding matches keys without regard to case, and
  so does this reader;
- a member names its group with the annotation
  `yunikorn.apache.org/task-group-name`;
- the application id is, in YuniKorn's order, the label
  `yunikorn.apache.org/app-id`, the annotation of that name, the label
  `applicationId`, the label `spark-app-selector`;
- the annotation `yunikorn.apache.org/schedulingPolicyParameters` holds
  space-separated `key=value` pairs (`pkg/cache/gang_utils.go`
  GetSchedulingPolicyParam): `placeholderTimeoutInSeconds` (how long the gang
  may wait once its first member holds room; 0 or absent: the default) and
  `gangSchedulingStyle`, `Soft` (YuniKorn's default: after the timeout the
  members are scheduled as plain pods) or `Hard` (YuniKorn fails the
  application; here the gang keeps waiting as a gang). YuniKorn skips what it
  cannot read and uses the defaults; here such a value holds the gang with a
  message naming it, so a typo is seen instead of silently changing the
  gang's rules (`scheduling_policy`).

Each task group is a role with its own minimum (a leaf of the gang's tree);
the gang needs the sum of the minimums. The per-group placement fields are
YuniKorn's placeholders' business: the real members' own specs decide where
they may go, so they are not read here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from app.core.resources import QuantityError, parse_resource_list

TASK_GROUPS_ANNOTATION = "yunikorn.apache.org/task-groups"
TASK_GROUP_NAME_ANNOTATION = "yunikorn.apache.org/task-group-name"
POLICY_ANNOTATION = "yunikorn.apache.org/schedulingPolicyParameters"
TIMEOUT_PARAMETER = "placeholderTimeoutInSeconds"
STYLE_PARAMETER = "gangSchedulingStyle"
SOFT = "Soft"
HARD = "Hard"
APP_ID_KEY = "yunikorn.apache.org/app-id"
# YuniKorn's order: label app-id, annotation app-id, then these labels.
APP_ID_LABELS = ("applicationId", "spark-app-selector")

_INT32_MAX = 2**31 - 1


class TaskGroupsError(ValueError):
    """The task-groups annotation cannot be used; the message names the rule broken."""


def app_id_of(labels: Mapping[str, Any], annotations: Mapping[str, Any]) -> str | None:
    """The pod's YuniKorn application id, None when it names none."""
    for value in (
        labels.get(APP_ID_KEY),
        annotations.get(APP_ID_KEY),
        *(labels.get(label) for label in APP_ID_LABELS),
    ):
        if isinstance(value, str) and value:
            return value
    return None


class SchedulingPolicy(NamedTuple):
    """A YuniKorn gang's schedulingPolicyParameters, as read from its declaring pod."""

    # placeholderTimeoutInSeconds; 0: the extender's --permit-waiting-time-seconds.
    timeout_seconds: int = 0
    # gangSchedulingStyle Soft (YuniKorn's default): plain pods once the wait runs out.
    soft: bool = True


class TaskGroupMember(NamedTuple):
    """A pod of a YuniKorn gang: its app id, its task group, the task groups it declares."""

    app: str
    task: str
    # None: it declares none; else what its annotation says (or why it cannot be used).
    roles: tuple[tuple[str, int], ...] | None
    error: str
    # Its schedulingPolicyParameters; None unless it declares the task groups.
    policy: SchedulingPolicy | None = None


def task_group_member(
    labels: Mapping[str, Any], annotations: Mapping[str, Any]
) -> TaskGroupMember | None:
    """The pod as a member of its app's gang, None when it has no task groups at all.

    TaskGroupsError when it has task groups but no application id to gather them by.
    """
    declared = annotations.get(TASK_GROUPS_ANNOTATION)
    task = annotations.get(TASK_GROUP_NAME_ANNOTATION)
    if declared is None and task is None:
        return None
    app = app_id_of(labels, annotations)
    if app is None:
        raise TaskGroupsError(
            f"the pod has YuniKorn task groups ({TASK_GROUPS_ANNOTATION} or "
            f"{TASK_GROUP_NAME_ANNOTATION}) but no application id: set the label "
            "yunikorn.apache.org/app-id (or applicationId) to the job's id, the same on "
            "every pod of the gang"
        )
    roles: tuple[tuple[str, int], ...] | None = None
    policy: SchedulingPolicy | None = None
    error = ""
    if declared is not None:
        # YuniKorn reads the policy from the same pod as the task groups (its first one).
        try:
            roles = task_groups(declared if isinstance(declared, str) else "")
            policy = scheduling_policy(annotations.get(POLICY_ANNOTATION))
        except TaskGroupsError as err:
            roles, error = None, str(err)
    return TaskGroupMember(app, task if isinstance(task, str) else "", roles, error, policy)


def scheduling_policy(raw: object) -> SchedulingPolicy:
    """The annotation's `key=value` pairs (TaskGroupsError naming the one that is wrong).

    YuniKorn's reading, stricter: a pair that is not `key=value`, a key other
    than its two, a timeout that is not a whole number >= 0, a style other than
    Soft or Hard (case matters, as in YuniKorn) is refused instead of skipped.
    A key given twice: the last one counts, as in YuniKorn.
    """
    if raw is None:
        return SchedulingPolicy()
    where = f"annotation {POLICY_ANNOTATION}"
    if not isinstance(raw, str):
        raise TaskGroupsError(f"{where} must be a string of key=value pairs")
    timeout, soft = 0, True
    for pair in raw.split():
        key, equals, value = pair.partition("=")
        if not equals or not key or "=" in value:
            raise TaskGroupsError(
                f"{where}: {pair!r:.60} is not key=value (pairs are separated by spaces, "
                f"e.g. {TIMEOUT_PARAMETER}=60 {STYLE_PARAMETER}={HARD})"
            )
        if key == TIMEOUT_PARAMETER:
            if not (value.isascii() and value.isdigit()) or len(value) > 18:
                raise TaskGroupsError(
                    f"{where}: {TIMEOUT_PARAMETER} must be a whole number of seconds >= 0 "
                    f"(0: the default wait), got {value!r:.40}"
                )
            timeout = int(value)
        elif key == STYLE_PARAMETER:
            if value not in (SOFT, HARD):
                raise TaskGroupsError(
                    f"{where}: {STYLE_PARAMETER} must be {SOFT} or {HARD} (case matters; "
                    f"YuniKorn would take {value!r:.40} as {SOFT})"
                )
            soft = value == SOFT
        else:
            raise TaskGroupsError(
                f"{where}: unknown parameter {key!r:.60}; YuniKorn reads "
                f"{TIMEOUT_PARAMETER} and {STYLE_PARAMETER} only"
            )
    return SchedulingPolicy(timeout, soft)


def _field(entry: Mapping[str, Any], name: str) -> Any:
    """A key as Go's encoding/json finds it: exact first, else any case."""
    if name in entry:
        return entry[name]
    lowered = name.lower()
    for key, value in entry.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def task_groups(raw: str) -> tuple[tuple[str, int], ...]:
    """The (name, minMember) of each task group, in declared order (TaskGroupsError if bad).

    YuniKorn's own checks: a non-empty name, named once, minMember >= 1 and a
    minResource whose quantities parse and are not negative.
    """
    where = f"annotation {TASK_GROUPS_ANNOTATION}"
    try:
        decoded = json.loads(raw)
    except ValueError as err:
        raise TaskGroupsError(f"{where} is not valid JSON ({err})") from None
    if not isinstance(decoded, list) or not decoded:
        raise TaskGroupsError(f"{where} must be a non-empty JSON list of task groups")
    groups: list[tuple[str, int]] = []
    for i, entry in enumerate(decoded):
        if not isinstance(entry, Mapping):
            raise TaskGroupsError(f"{where}: entry {i} must be an object (name, minMember, ...)")
        name = _field(entry, "name")
        if not isinstance(name, str) or not name:
            raise TaskGroupsError(f"{where}: entry {i} needs a non-empty name")
        if any(n == name for n, _ in groups):
            raise TaskGroupsError(f"{where} names task group {name} twice")
        minimum = _field(entry, "minMember")
        if (
            not isinstance(minimum, int)
            or isinstance(minimum, bool)
            or not 1 <= minimum <= _INT32_MAX
        ):
            raise TaskGroupsError(
                f"{where}: task group {name} needs minMember, a whole number >= 1, "
                f"got {minimum!r:.40}"
            )
        resources = _field(entry, "minResource")
        if not isinstance(resources, Mapping):
            raise TaskGroupsError(
                f"{where}: task group {name} needs minResource (resource name to quantity)"
            )
        try:
            parsed = parse_resource_list(resources)
        except QuantityError as err:
            raise TaskGroupsError(f"{where}: task group {name} minResource: {err}") from None
        if any(v < 0 for v in parsed.values()):
            raise TaskGroupsError(f"{where}: task group {name} minResource must not be negative")
        groups.append((name, minimum))
    return tuple(groups)
