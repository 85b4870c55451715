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

PlacementListener = Callable[[PodRecord], None]
"""Called after the extender placed a pod itself, or took the place back: reserved in the
gate, released by it, or bound by its own call. The record changes in place and no pod
listener hears of it: the watch's echo of such a binding changes nothing it reads."""


class _RecentNames:
    """The latest names changed, as (stamp, name), oldest first; bounded: a reader that
    fell further behind is told so (None) and must assume every name changed."""

    def __init__(self, size: int) -> None:
        self._changes: deque[tuple[int, str]] = deque(maxlen=size)
        # The stamp of the newest change the bounded log let go of.
        self._forgotten = 0

    def add(self, stamp: int, name: str) -> None:
        changes = self._changes
        if len(changes) == changes.maxlen:
            self._forgotten = changes[0][0]
        changes.append((stamp, name))

    def since(self, stamp: int) -> list[str] | None:
        """The names logged after `stamp`, newest first (a name may repeat)."""
        if stamp < self._forgotten:
            return None
        changed: list[str] = []
        for when, name in reversed(self._changes):
            if when <= stamp:
                break
            changed.append(name)
        return changed


class ChangeLog:
    def __init__(
        self, remembered_node_changes: int = 4096, remembered_group_changes: int = 16384
    ) -> None:
        self._pod_listeners: list[PodListener] = []
        self._node_listeners: list[NodeListener] = []
        self._placement_listeners: list[PlacementListener] = []
        # Changes to a node's record or to the requests placed on it: prioritize
        # keeps per-node scores and forgets only the nodes named here
        # (app/core/scoring.py).
        self._node_changes = _RecentNames(remembered_node_changes)
        # group key -> stamp of the last change to one of its members (any field,
        # placement included): the arbiter reuses what it derived from a gang's
        # members while this stays put (app/runtime/claims.py).
        self._group_stamps: dict[str, int] = {}
        # Changes to a group (a member, or its group object): the queues' tally
        # redoes only these gangs (app/runtime/queues/tally.py).
        self._group_changes = _RecentNames(remembered_group_changes)
        self._stamp = 0

    def add_pod_listener(self, listener: PodListener) -> None:
        self._pod_listeners.append(listener)

    def add_node_listener(self, listener: NodeListener) -> None:
        self._node_listeners.append(listener)

    def add_placement_listener(self, listener: PlacementListener) -> None:
        self._placement_listeners.append(listener)

    @property
    def stamp(self) -> int:
        """The stamp of the newest change (node or group): what *_changed_since name now."""
        return self._stamp

    def nodes_changed_since(self, stamp: int) -> tuple[int, list[str] | None]:
        """(the stamp now, the nodes changed after `stamp`); None: too many to tell, assume all."""
        if stamp == self._stamp:
            return stamp, []
        return self._stamp, self._node_changes.since(stamp)

    def groups_changed_since(self, stamp: int) -> tuple[int, list[str] | None]:
        """(the stamp now, the groups changed after `stamp`); None: too many to tell, assume all.

        A group changes when one of its pods does (placement included) or its
        group object (a PodGroup) does.
        """
        if stamp == self._stamp:
            return stamp, []
        return self._stamp, self._group_changes.since(stamp)

    def group_stamp(self, group_key: str) -> int:
        """Changes whenever a member of the group changes (0: it has none)."""
        return self._group_stamps.get(group_key, 0)

    def node_touched(self, node: str) -> None:
        self._stamp += 1
        self._node_changes.add(self._stamp, node)

    def group_touched(self, group_key: str) -> None:
        """A member of the group changed."""
        self.group_object_changed(group_key)
        self._group_stamps[group_key] = self._stamp

    def group_object_changed(self, group_key: str) -> None:
        """The group's own object (its PodGroup) came, changed or went."""
        self._stamp += 1
        self._group_changes.add(self._stamp, group_key)

    def group_emptied(self, group_key: str) -> None:
        """Groups come and go (one per Job run): keep no stamp for an empty one;
        a new member gets a fresh, higher stamp."""
        del self._group_stamps[group_key]

    def pod_changed(self, old: PodRecord | None, new: PodRecord | None) -> None:
        for listener in self._pod_listeners:
            listener(old, new)

    def pod_placed(self, pod: PodRecord) -> None:
        for listener in self._placement_listeners:
            listener(pod)

    def nodes_changed(self) -> None:
        for listener in self._node_listeners:
            listener()


class ChangeReader:
    """What the owner of a ChangeLog (ClusterState) offers the components that read it:
    listeners, and stamps that say what changed since. Kept apart from the owner so that
    its class keeps to the cluster's records."""

    def __init__(self, changes: ChangeLog) -> None:
        self._changes = changes

    def add_pod_listener(self, listener: PodListener) -> None:
        self._changes.add_pod_listener(listener)

    def add_node_listener(self, listener: NodeListener) -> None:
        """Called after any node was added, changed or removed."""
        self._changes.add_node_listener(listener)

    def add_placement_listener(self, listener: PlacementListener) -> None:
        """Called after the extender reserved, released or bound a pod itself."""
        self._changes.add_placement_listener(listener)

    def nodes_changed_since(self, stamp: int) -> tuple[int, list[str] | None]:
        """(the stamp now, the nodes changed after `stamp`); None: too many to tell, assume all."""
        return self._changes.nodes_changed_since(stamp)

    def group_stamp(self, group_key: str) -> int:
        """Changes whenever a member of the group changes (0: it has none)."""
        return self._changes.group_stamp(group_key)

    def groups_changed_since(self, stamp: int) -> tuple[int, list[str] | None]:
        """As nodes_changed_since, for groups: their pods or their group object changed."""
        return self._changes.groups_changed_since(stamp)

    @property
    def change_stamp(self) -> int:
        """The stamp of the newest change to pods, nodes or groups (the first of what
        nodes_changed_since and groups_changed_since answer now): a reader that keeps it
        knows whether anything changed since, without reading what."""
        return self._changes.stamp
