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
  `applicationId`, the label `spark-app-selector`.

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


class TaskGroupMember(NamedTuple):
    """A pod of a YuniKorn gang: its app id, its task group, the task groups it declares."""

    app: str
    task: str
    # None: it declares none; else what its annotation says (or why it cannot be used).
    roles: tuple[tuple[str, int], ...] | None
    error: str


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
    error = ""
    if declared is not None:
        try:
            roles = task_groups(declared if isinstance(declared, str) else "")
        except TaskGroupsError as err:
            error = str(err)
    return TaskGroupMember(app, task if isinstance(task, str) else "", roles, error)


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
