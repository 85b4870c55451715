"""A gang's rules where no plain group object gives them: per-role minimums, KAI, YuniKorn. Pure.

- label-only and Kueue groups: the size the pods' labels give;
- roles (Volcano minTaskMember, KAI's leaf sub-groups, YuniKorn's task
  groups): each role's own minimum, and the message when one is short, in
  each source's words;
- KAI's PodGroup (app/core/kai.py) read into a GroupSpec;
- YuniKorn's gang, whose task groups come from its oldest pod that declares
  them (app/core/yunikorn.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from app.core.groups import (
    SOURCE_KAI,
    SOURCE_NATIVE,
    SOURCE_YUNIKORN,
    VOLCANO_TASK_ANNOTATION,
    GroupRef,
    GroupSpec,
    PodGroupSpecError,
)
from app.core.kai import KAI_SUBGROUP_LABEL, kai_spec
from app.core.topology.domains import TopologyError
from app.core.topology.subgroups import leaf_problem
from app.core.yunikorn import (
    TASK_GROUP_NAME_ANNOTATION,
    TASK_GROUPS_ANNOTATION,
    SchedulingPolicy,
)


def spec_from_labels(ref: GroupRef, pods_of: Callable[[str], Sequence[_Pod]]) -> GroupSpec:
    """An objectless group's rules: its pods' labels say (YuniKorn: its declaring pod's)."""
    if ref.source == SOURCE_YUNIKORN:
        return spec_from_yunikorn(ref.key, declaring_member(pods_of(ref.key), ref))
    if ref.spec is not None:  # LeaderWorkerSet: the spec its pod's labels declare
        return ref.spec
    assert ref.min_available is not None
    return GroupSpec(key=ref.key, min_member=ref.min_available, source=ref.source)


def spec_from_kai(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read a KAI PodGroup (app/core/kai.py): its sub-group tree, each leaf a role."""
    if spec is not None and not isinstance(spec, Mapping):
        raise PodGroupSpecError(f"PodGroup {key}: spec must be an object, got {spec!r:.80}")
    try:
        read = kai_spec(spec or {})
    except TopologyError as err:
        raise PodGroupSpecError(f"PodGroup {key}: {err}") from None
    return GroupSpec(
        key=key,
        min_member=read.min_member,
        source=SOURCE_KAI,
        topology=read.topology,
        min_task_member=read.leaves,
        sub_groups=read.sub_groups,
        queue=read.queue,
        priority_class_name=read.priority_class_name,
    )


class _Pod(Protocol):
    """What declaring_member() reads of a pod record."""

    @property
    def group(self) -> GroupRef | None: ...
    @property
    def created(self) -> float: ...
    @property
    def name(self) -> str: ...


def declaring_member(pods: Sequence[_Pod], ref: GroupRef) -> GroupRef | None:
    """YuniKorn: the member whose task-groups annotation counts for the whole gang.

    YuniKorn reads the groups of the first pod it sees; that order is not
    stable, so here it is the oldest pod of the gang (creationTimestamp, then
    name) that carries the annotation, else the pod asking (not delivered yet).
    """
    declaring = [
        p
        for p in pods
        if p.group is not None and (p.group.roles is not None or p.group.roles_error)
    ]
    if declaring:
        return min(declaring, key=lambda p: (p.created, p.name)).group
    return ref if _declares(ref) else None


def _declares(ref: GroupRef) -> bool:
    return ref.roles is not None or bool(ref.roles_error)


def spec_from_yunikorn(key: str, declaring: GroupRef | None) -> GroupSpec:
    """A YuniKorn gang's rules from the member whose task groups count (PodGroupSpecError).

    Its schedulingPolicyParameters come from the same member: the timeout is the
    gate's wait, the Soft style makes the members plain pods once it has run out.
    """
    if declaring is None or (declaring.roles is None and not declaring.roles_error):
        raise PodGroupSpecError(
            f"gang {key}: no member carries the annotation {TASK_GROUPS_ANNOTATION} (the task "
            "groups and their minMember): add it to the job's first pod, or to every pod"
        )
    if declaring.roles is None:
        raise PodGroupSpecError(f"gang {key}: {declaring.roles_error}")
    policy = declaring.policy or SchedulingPolicy()
    return GroupSpec(
        key=key,
        min_member=sum(n for _, n in declaring.roles),
        schedule_timeout_seconds=policy.timeout_seconds or None,
        plain_after_timeout=policy.soft,
        source=SOURCE_YUNIKORN,
        min_task_member=tuple(sorted(declaring.roles)),
    )


def task_shortfall(spec: GroupSpec, tasks: Iterable[str]) -> list[tuple[str, int, int]]:
    """Volcano minTaskMember: (task, have, need) for every task below its own minimum.

    `tasks` holds one entry per counted member (its task name, "" for none).
    """
    if not spec.min_task_member:
        return []
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task] = counts.get(task, 0) + 1
    return [
        (task, counts.get(task, 0), need)
        for task, need in spec.min_task_member
        if counts.get(task, 0) < need
    ]


def role_problem(spec: GroupSpec, member: str, task: str) -> str | None:
    """Why a member's named role is not one of its gang's (KAI, YuniKorn), None if it is.

    KAI drops such a pod from the job and YuniKorn refuses it; either way the
    gang could start without it, so every member is told and the gang held.
    """
    if spec.sub_groups:
        return leaf_problem(spec.key, spec.sub_groups, member, task)
    if spec.source == SOURCE_YUNIKORN and task and all(t != task for t, _ in spec.min_task_member):
        declared = ", ".join(t for t, _ in spec.min_task_member)
        return (
            f"gang {spec.key}: member {member} names task group {task!r} "
            f"(annotation {TASK_GROUP_NAME_ANNOTATION}), which the gang's "
            f"{TASK_GROUPS_ANNOTATION} does not declare ({declared})"
        )
    return None


# Per source: what its per-role minimums are called and where a member names its role.
_ROLE_WORDS = {
    # A CompositePodGroup tree's leaves (app/core/composite.py).
    SOURCE_NATIVE: ("PodGroup", "minCount", "spec.schedulingGroup.podGroupName"),
    SOURCE_KAI: ("sub-group", "subGroups minMember", f"label {KAI_SUBGROUP_LABEL}"),
    SOURCE_YUNIKORN: (
        "task group",
        f"{TASK_GROUPS_ANNOTATION} minMember",
        f"annotation {TASK_GROUP_NAME_ANNOTATION}",
    ),
}


def describe_task_shortfall(spec: GroupSpec, gap: list[tuple[str, int, int]]) -> str:
    role, field, pointer = _ROLE_WORDS.get(
        spec.source, ("task", "minTaskMember", f"annotation {VOLCANO_TASK_ANNOTATION}")
    )
    parts = ", ".join(f"{role} {task}: {have} of {need}" for task, have, need in gap)
    return (
        f"cannot find enough sibling pods per {role} for group {spec.key} ({field}: "
        f"{parts}); create the missing pods of each {role} ({pointer})"
    )
