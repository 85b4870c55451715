"""Members of a CompositePodGroup tree that cannot be used, told so by an Event.

With the feature gate CompositePodGroup, kube-scheduler's own queue keeps a
leaf PodGroup's pods back while their tree has no root it can schedule (a
parent that does not exist, a cycle): it never calls the extender's filter
for them, so no FailedScheduling carries our message and the pods would sit
Pending without a word. This listener says it instead: an InvalidPodGroup
Event on the group the pods point at (the leaf PodGroup, or the tree's root)
naming the object and field to fix, once per pod and message, when a pending
member arrives and when the tree turns invalid under pods already there.
"""

from __future__ import annotations

from app.core.admission import FilterReason
from app.core.observer import GangObserver, MemberRef
from app.core.records import PodRecord
from app.core.state import ClusterState

# Bound on the pods remembered as told (a pod deleted while its tree was invalid).
_MAX_TOLD = 10_000


class HeldTrees:
    """Tells each pending member of an unusable tree why it waits, once per message."""

    def __init__(self, state: ClusterState, observer: GangObserver) -> None:
        self._state = state
        self._observer = observer
        self._told: dict[str, str] = {}  # pod uid -> the message it was told

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if new is None:
            if old is not None:
                self._told.pop(old.uid, None)
            return
        self._tell(new)

    def on_tree_changed(self, group_key: str) -> None:
        """The tree behind `group_key` (a leaf's or a root's) changed: tell its members."""
        for pod in self._state.group_pods(group_key):
            self._tell(pod)

    def _tell(self, pod: PodRecord) -> None:
        if pod.group is None or pod.node_name or not pod.counts_as_member:
            return
        problem = self._state.trees.problem(pod.group)
        if problem is None or self._told.get(pod.uid) == problem:
            return
        if len(self._told) >= _MAX_TOLD:
            self._told.clear()
        self._told[pod.uid] = problem
        member = MemberRef(pod.namespace, pod.name, pod.uid)
        self._observer.member_rejected(member, pod.group.key, FilterReason.BAD_GROUP, problem)
