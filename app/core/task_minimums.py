"""Volcano's per-task minimums (minTaskMember): which tasks are short, and saying so. Pure.

Kept apart from app/core/groups.py (which reads the minimums into
GroupSpec.min_task_member) so that module stays one job long.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.core.groups import VOLCANO_TASK_ANNOTATION, GroupSpec


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


def describe_task_shortfall(spec: GroupSpec, gap: list[tuple[str, int, int]]) -> str:
    parts = ", ".join(f"task {task}: {have} of {need}" for task, have, need in gap)
    return (
        f"cannot find enough sibling pods per task for group {spec.key} (minTaskMember: "
        f"{parts}); create the missing pods of each task (annotation {VOLCANO_TASK_ANNOTATION})"
    )
