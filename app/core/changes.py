"""Who hears of cluster changes, and stamps that tell readers what changed since they last looked.

Listeners are called synchronously after each change, in the order they were
added (app/server.py wires them). Stamps let a reader that keeps derived data
(per-node scores, a gang's demands) redo only what changed instead of
listening to every event itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from app.core.records import PodRecord

PodListener = Callable[[PodRecord | None, PodRecord | None], None]
"""Called with (old, new) after a pod changed; new is None when it is gone."""

NodeListener = Callable[[], None]
"""Called after any node was added, changed, removed or relabelled."""


class ChangeLog:
    def __init__(self, remembered_node_changes: int = 4096) -> None:
        self._pod_listeners: list[PodListener] = []
        self._node_listeners: list[NodeListener] = []
        # The latest changes to a node's record or to the requests placed on it,
        # as (stamp, node name), oldest first: prioritize keeps per-node scores
        # and forgets only the nodes named here (app/core/scoring.py). Bounded: a
        # reader that fell further behind is told to forget everything.
        self._node_changes: deque[tuple[int, str]] = deque(maxlen=remembered_node_changes)
        # group key -> stamp of the last change to one of its members (any field,
        # placement included): the arbiter reuses what it derived from a gang's
        # members while this stays put (app/runtime/claims.py).
        self._group_stamps: dict[str, int] = {}
        self._stamp = 0
        # The stamp of the newest node change the bounded log let go of.
        self._forgotten = 0

    def add_pod_listener(self, listener: PodListener) -> None:
        self._pod_listeners.append(listener)

    def add_node_listener(self, listener: NodeListener) -> None:
        self._node_listeners.append(listener)

    def nodes_changed_since(self, stamp: int) -> tuple[int, list[str] | None]:
        """(the stamp now, the nodes changed after `stamp`); None: too many to tell, assume all."""
        changes = self._node_changes
        if stamp == self._stamp:
            return stamp, []
        if stamp < self._forgotten:
            return self._stamp, None
        changed: list[str] = []
        for when, node in reversed(changes):
            if when <= stamp:
                break
            changed.append(node)
        return self._stamp, changed

    def group_stamp(self, group_key: str) -> int:
        """Changes whenever a member of the group changes (0: it has none)."""
        return self._group_stamps.get(group_key, 0)

    def node_touched(self, node: str) -> None:
        self._stamp += 1
        changes = self._node_changes
        if len(changes) == changes.maxlen:
            self._forgotten = changes[0][0]
        changes.append((self._stamp, node))

    def group_touched(self, group_key: str) -> None:
        self._stamp += 1
        self._group_stamps[group_key] = self._stamp

    def group_emptied(self, group_key: str) -> None:
        """Groups come and go (one per Job run): keep no stamp for an empty one;
        a new member gets a fresh, higher stamp."""
        del self._group_stamps[group_key]

    def pod_changed(self, old: PodRecord | None, new: PodRecord | None) -> None:
        for listener in self._pod_listeners:
            listener(old, new)

    def nodes_changed(self) -> None:
        for listener in self._node_listeners:
            listener()
