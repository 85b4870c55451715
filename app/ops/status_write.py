"""One PodGroup status write: read the object, compare, merge-patch, retry on a conflict.

Apart from the reconciler so that the write's outcomes (written, unchanged,
kept, gone, conflict) can be reasoned about and tested one call at a time;
the reconciler only decides which groups to write and when.
"""

from __future__ import annotations

from typing import Any, Protocol

from app.core.clock import Clock, wall
from app.core.status import (
    TERMINAL,
    GroupStatus,
    StatusShape,
    status_from_object,
    status_patch,
)
from app.core.timestamps import rfc3339
from app.kube.errors import Conflict


class StatusApi(Protocol):
    """The API calls on a group object's status (app/kube/status.py)."""

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as JSON, None if it does not exist."""

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """JSON merge patch of the status; Conflict (app/kube/errors.py) on 409."""


WRITTEN, UNCHANGED, KEPT, GONE, CONFLICT = "written", "unchanged", "kept", "gone", "conflict"


async def write_status(
    api: StatusApi,
    namespace: str,
    name: str,
    uid: str,
    wanted: GroupStatus,
    *,
    shape: StatusShape | None = None,
    keep_terminal: bool = False,
    attempts: int = 3,
    clock: Clock = wall,
) -> tuple[str, GroupStatus | None]:
    """Read, compare, patch; re-read and retry on a conflict.

    keep_terminal (no member left that could run): a Finished or Failed
    status on the object stays, and is returned with KEPT. This is how a
    restarted extender, which never saw the gang's pods, learns the outcome.
    """
    for _ in range(attempts):
        current = await api.read(namespace, name)
        if current is None or (current.get("metadata") or {}).get("uid") != uid:
            return GONE, None
        shown = status_from_object(current, shape)
        if keep_terminal and shown.phase in TERMINAL:
            return KEPT, shown
        patch = status_patch(current, wanted, shape, now=rfc3339(clock()))
        if patch is None:
            return UNCHANGED, wanted
        try:
            await api.patch(namespace, name, patch)
        except Conflict:
            continue
        return WRITTEN, wanted
    return CONFLICT, None
