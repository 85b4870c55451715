"""Pods kube-scheduler nominated for a node that has room for them now, yet left parked.

kube-scheduler parks a pod it could not place in its unschedulable queue and
retries it on a cluster event its plugins' queueing hints accept, or after
five minutes. A preemptor whose victims are gone is normally retried on the
victims' delete events. But a delete its informer missed (a watch broken
while the API server restarted, the list after it) reaches the queue as the
pod's last known state; for a victim last seen unbound (one that was being
bound, in our gate, when its watch broke) that state has no node, and
NodeResourcesFit's hint skips it as "an unscheduled pod was deleted"
(pkg/scheduler/framework/plugins/noderesources/fit.go
isSchedulableAfterAssignedPodDelete, v1.37.2; kubernetes issue 122444). The
preemptor then waits minutes on a node with room for it (the soak's seed 4,
issue 49). Such pods are found here; the runtime requeues them
(app/runtime/preemption/parked.py). Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from app.core.records import PodRecord
from app.core.resources import Resources, fits, subtract
from app.core.state import ClusterState


def room_as_scheduler_counts(
    state: ClusterState, node: str, priority: int, uid: str
) -> Resources | None:
    """The room on `node` for a pod of `priority` (uid `uid`) as kube-scheduler counts it.

    Every pod placed there holds its requests, pods on their way out included
    (they hold them until gone), and so does each other pod nominated there at
    that priority or above. None when the node is unknown or cordoned.
    """
    record = state.nodes.get(node)
    if record is None or record.unschedulable:
        return None
    free = dict(record.allocatable)
    subtract(free, state.requested_on(node))
    for pod in state.nominated.values():
        if pod.nominated_node == node and pod.priority >= priority and pod.uid != uid:
            subtract(free, pod.requests)
    return free


def parked(pod: PodRecord) -> bool:
    """A pod in no gang, unplaced, that kube-scheduler nominated and reported unschedulable.

    Gang members are left to the extender's own wake-ups and plans.
    """
    return (
        pod.group is None
        and bool(pod.nominated_node)
        and pod.unschedulable
        and not pod.placed_node
        and not pod.deleting
        and not pod.gated
        and not pod.terminal
    )


# kube-scheduler's PostFilter status when an extender's preempt call got no answer (v1.37.2
# HTTPExtender.send: the Post's error as net/http words it): refused while the extender was
# down, reset, or past the extender's httpTimeout.
_PREEMPT_UNANSWERED = re.compile(r'preemption: Post "[^"]*/preempt": ')


def preempt_unanswered(message: str) -> bool:
    """Does kube-scheduler's unschedulable message say its preempt call got no answer?"""
    return _PREEMPT_UNANSWERED.search(message) is not None


def unanswered(pod: PodRecord) -> bool:
    """A pod in no gang that kube-scheduler parked because its preempt call to an extender
    got no answer (the extender restarting, the soak's extender kills).

    kube-scheduler parks it as unschedulable, as if preemption had found nothing,
    and asks again only on an event its filters' queueing hints accept: a minute or
    more in a quiet cluster although its victims are there to evict.
    """
    return (
        pod.group is None
        and pod.may_preempt
        and pod.unschedulable
        and not pod.placed_node
        and not pod.deleting
        and not pod.gated
        and not pod.terminal
        and preempt_unanswered(pod.unschedulable_message)
    )


def parked_with_room(state: ClusterState, node: str | None = None) -> Iterator[PodRecord]:
    """The parked pods (on `node`, or on any) whose nominated node has room for them now,
    and whose node rules (selector, required affinity, tolerations) allow that node."""
    for pod in list(state.nominated.values()):
        if (node is not None and pod.nominated_node != node) or not parked(pod):
            continue
        record = state.nodes.get(pod.nominated_node)
        rules = pod.placement
        if record is None or (
            rules and not rules.allows(record.name, record.labels, record.taints)
        ):
            continue  # its node rules keep it off that node, whatever the room
        free = room_as_scheduler_counts(state, pod.nominated_node, pod.priority, pod.uid)
        if free is not None and fits(pod.requests, free):
            yield pod
