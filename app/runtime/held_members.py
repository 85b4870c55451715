"""Native gang members kube-scheduler's queue holds back, told why on their pods.

Two of kube-scheduler's own gates keep a native member (a pod whose
spec.schedulingGroup names a PodGroup) out of its scheduling queue before any
filter, so no FailedScheduling carries our message and the pod would sit
Pending without a word:
- with the feature gate CompositePodGroup, a leaf's pods while their tree has
  no root it can schedule (a parent that does not exist, a cycle);
- GangScheduling's PreEnqueue, which the shipped profiles enable (it is what
  makes kube-scheduler check a CompositePodGroup tree's placements,
  docs/preemption.md), while fewer pods than the gang's minimum exist.
This listener says what our filter would have said, on the pod and on its
group (GangObserver.member_held): once per pod for too few siblings (the count
in the message changes with every sibling; kube-scheduler retries the pod
when the next one comes anyway), once per pod and message for a group that
cannot be used. Pods of other sources reach the filter, which tells them.
"""

from __future__ import annotations

from app.core.admission import FilterReason, too_few_siblings, wholeness
from app.core.group_rules import describe_task_shortfall
from app.core.groups import SOURCE_NATIVE, GroupRef, PodGroupSpecError
from app.core.observer import GangObserver, MemberRef
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState

# Bound on the pods remembered as told (a pod deleted while held).
_MAX_TOLD = 10_000


class HeldMembers:
    """Tells each pending native member kube-scheduler holds why it waits, once."""

    def __init__(self, state: ClusterState, observer: GangObserver) -> None:
        self._state = state
        self._observer = observer
        self._told: dict[str, str] = {}  # pod uid -> what it was told (see _why)

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if new is None:
            if old is not None:
                self._told.pop(old.uid, None)
            return
        if old is not None and old.group == new.group and new.uid in self._told:
            return  # told already; a change of its group or tree comes by on_group_changed
        self._tell(new)

    def on_group_changed(self, group_key: str) -> None:
        """The group (a leaf's, a root's) appeared or its tree changed: tell its members."""
        for pod in self._state.group_pods(group_key):
            self._tell(pod)

    def _tell(self, pod: PodRecord) -> None:
        ref = pod.group
        if ref is None or ref.source != SOURCE_NATIVE or pod.node_name:
            return
        if not pod.counts_as_member:
            return
        why = self._why(ref)
        if why is None:
            self._told.pop(pod.uid, None)
            return
        reason, message = why
        token = reason if reason == FilterReason.TOO_FEW_SIBLINGS else message
        if self._told.get(pod.uid) == token:
            return
        if len(self._told) >= _MAX_TOLD:
            self._told.clear()
        self._told[pod.uid] = token
        member = MemberRef(pod.namespace, pod.name, pod.uid)
        self._observer.member_held(member, ref.key, reason, message)

    def _why(self, ref: GroupRef) -> tuple[FilterReason, str] | None:
        """What the filter would answer this member about its group (None: nothing the
        gates hold it for; a PodGroup not seen yet is told when it appears)."""
        problem = self._state.trees.problem(ref)
        if problem is not None:
            return FilterReason.BAD_GROUP, problem
        try:
            spec = self._state.group_spec(ref)
        except GroupNotFound:
            return None
        except PodGroupSpecError as err:
            return FilterReason.BAD_GROUP, str(err)
        members = self._state.members(ref.key)
        siblings = wholeness(spec, len(members), lambda: [p.group.task for p in members if p.group])
        if siblings.task_gap:
            return FilterReason.TOO_FEW_SIBLINGS, describe_task_shortfall(
                spec, list(siblings.task_gap)
            )
        if siblings.missing:
            return FilterReason.TOO_FEW_SIBLINGS, too_few_siblings(spec, siblings)
        return None
