"""The cluster as the verbs need to see it: slim records of Nodes, Pods and PodGroups.

Fed by the watches in app/kube/reflector.py and by the permit gate (reservations
and bindings it made itself), read by the verbs. It is plain in-memory data
with no I/O and no locking: every mutation and every read happens on the
asyncio event loop thread, so a verb sees one consistent picture.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.core.groups import (
    ALL_SOURCES,
    GROUP_APIS,
    SOURCE_XK8S,
    SPEC_READERS,
    GroupLabelError,
    GroupRef,
    GroupSpec,
    PodGroupSpecError,
    group_key,
    group_ref_of_pod,
    spec_from_labels,
)
from app.core.hypernode import HyperNode, HyperNodeError, HyperNodeIndex, hypernode_from
from app.core.marking import is_marked
from app.core.packing import Bin, Placement, Taint, placement_of, taints_of
from app.core.queues import QUEUE_ANNOTATION
from app.core.resources import (
    QuantityError,
    Resources,
    add,
    parse_resource_list,
    pod_requests,
    subtract,
)
from app.core.timestamps import parse_rfc3339
from app.core.topology import Domain, TopologyConstraint, TopologyError, placed_domain
from app.core.topology_sources import constraint_from_annotations

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(slots=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str
    deleting: bool
    requests: Resources
    priority: int
    scheduler_name: str
    group: GroupRef | None
    group_error: str | None
    resource_version: str = ""
    # Set when kube-scheduler marked the pod as a preemption victim (condition
    # DisruptionTarget, reason PreemptionByScheduler) just before deleting it.
    preempted: bool = False
    # Node the permit gate holds this pod for; kube-scheduler has assumed it there.
    reserved_node: str = ""
    # The gate answered this pod's bind call with an error and gave its node back:
    # kube-scheduler forgets the pod there, even if a snapshot still shows it.
    bind_refused: bool = False
    # kube-scheduler reported it could not place the pod (condition PodScheduled
    # False): it may sit in the unschedulable queue, so sibling wake-up touches it.
    unschedulable: bool = False
    # metadata.creationTimestamp, seconds since the epoch (0 when absent).
    created: float = 0.0
    # spec.schedulingGates is not empty: kube-scheduler does not try the pod yet.
    gated: bool = False
    # The latest PodScheduled=False message kube-scheduler wrote (why it is unplaced).
    unschedulable_message: str = ""
    # nodeSelector, required node affinity, tolerations (None: any node).
    placement: Placement | None = None
    # status.nominatedNodeName: kube-scheduler preempted pods to make room here.
    nominated_node: str = ""
    # Kueue's podset topology annotations on the pod (app/core/topology.py), None: none.
    topology: TopologyConstraint | None = None
    # A group member carrying the member mark (app/core/marking.py), which the
    # gang-only mode needs for kube-scheduler to call us; False for plain pods.
    marked: bool = False
    # The queue its gang joins (annotation scheduling.volcano.sh/queue-name), "": none named.
    queue: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def placed_node(self) -> str:
        """Where the pod takes resources: bound by the API, else reserved in the gate."""
        return self.node_name or self.reserved_node

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def counts_as_member(self) -> bool:
        """A sibling that can still take part in the gang (a gated pod cannot, yet)."""
        return not self.terminal and not self.deleting and not self.gated


@dataclass(slots=True)
class NodeRecord:
    name: str
    allocatable: Resources
    unschedulable: bool
    # The node's labels, with one per HyperNode tier holding it (app/core/hypernode.py).
    labels: dict[str, str]
    taints: tuple[Taint, ...] = ()
    # metadata.labels as the node has them (the same dict when no HyperNode holds it).
    own_labels: dict[str, str] | None = None


@dataclass(slots=True)
class PodGroupRecord:
    namespace: str
    name: str
    uid: str
    spec: GroupSpec | None
    # Why spec is None: shown to users whose pods point at this group.
    error: str | None = None
    source: str = SOURCE_XK8S
    # metadata.creationTimestamp, seconds since the epoch (0 when absent).
    created: float = 0.0

    @property
    def key(self) -> str:
        return group_key(self.source, self.namespace, self.name)


class GroupNotFound(LookupError):
    """The pod names a PodGroup that does not exist (yet)."""


PodListener = Callable[[PodRecord | None, PodRecord | None], None]
"""Called with (old, new) after a pod changed; new is None when it is gone."""


@dataclass
class ClusterState:
    pods: dict[str, PodRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    podgroups: dict[str, PodGroupRecord] = field(default_factory=dict)
    # group key -> keys of pods labelled into it (any phase).
    _members: dict[str, set[str]] = field(default_factory=dict)
    # node name -> requests of the non-terminal pods placed there (bound or reserved).
    _requested: dict[str, Resources] = field(default_factory=dict)
    # node name -> keys of the non-terminal pods placed there (preemption plans
    # look at the pods of a few nodes, not at every pod).
    _on_node: dict[str, set[str]] = field(default_factory=dict)
    # uid -> pod key: preemption victims arrive as UIDs.
    _by_uid: dict[str, str] = field(default_factory=dict)
    # Placed pods on their way out (being deleted, or marked as preemption
    # victims), by key: their room is as good as free for a gang, as
    # kube-scheduler counts it for the preemptors it nominated.
    leaving: dict[str, PodRecord] = field(default_factory=dict)
    # Unplaced pods kube-scheduler nominated for a node (status.nominatedNodeName), by key.
    nominated: dict[str, PodRecord] = field(default_factory=dict)
    _pod_listeners: list[PodListener] = field(default_factory=list)
    # Group sources in use (flags and API discovery); pods naming another are plain pods.
    sources: frozenset[str] = ALL_SOURCES

    _node_listeners: list[Callable[[], None]] = field(default_factory=list)
    # The latest changes to a node's record or to the requests placed on it,
    # as (stamp, node name), oldest first: prioritize keeps per-node scores
    # and forgets only the nodes named here (app/core/scoring.py). Bounded: a
    # reader that fell further behind is told to forget everything.
    _node_changes: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=4096))
    # group key -> stamp of the last change to one of its members (any field,
    # placement included): the arbiter reuses what it derived from a gang's
    # members while this stays put (app/runtime/arbiter.py).
    _group_stamps: dict[str, int] = field(default_factory=dict)
    _stamp: int = 0
    # Volcano HyperNodes (only when their API is served): their tiers are topology levels.
    hypernodes: HyperNodeIndex = field(default_factory=HyperNodeIndex)
    # HyperNode name -> why it is not used (logged once per change).
    hypernode_errors: dict[str, str] = field(default_factory=dict)
    # The HyperNodes as the watch delivered them; `hypernodes` once relabelled.
    _hypernodes_seen: dict[str, HyperNode] = field(default_factory=dict)

    def add_pod_listener(self, listener: PodListener) -> None:
        self._pod_listeners.append(listener)

    def add_node_listener(self, listener: Callable[[], None]) -> None:
        """Called after any node was added, changed or removed."""
        self._node_listeners.append(listener)

    def nodes_changed_since(self, stamp: int) -> tuple[int, list[str] | None]:
        """(the stamp now, the nodes changed after `stamp`); None: too many to tell, assume all."""
        changes = self._node_changes
        if stamp == self._stamp:
            return stamp, []
        if not changes or changes[0][0] > stamp + 1:
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

    def _restamp(self, node: str) -> None:
        self._stamp += 1
        self._node_changes.append((self._stamp, node))

    def _restamp_group(self, pod: PodRecord) -> None:
        if pod.group is not None:
            self._stamp += 1
            self._group_stamps[pod.group.key] = self._stamp

    def _nodes_changed(self) -> None:
        for listener in self._node_listeners:
            listener()

    # ---- pods ---------------------------------------------------------------

    def apply_pod(self, raw: Mapping[str, Any]) -> None:
        """Insert or replace a pod from its API object (ADDED/MODIFIED event or list item)."""
        new = pod_record_from(raw, self.sources)
        old = self.pods.get(new.key)
        if old is not None and old.uid == new.uid:
            # nodeName never goes back to empty; an older event arriving after
            # assume_bound() must not unbind the pod in our view.
            new.node_name = new.node_name or old.node_name
            # The gate's reservation outlives the watch's copy of the pod.
            new.reserved_node = "" if new.node_name else old.reserved_node
            new.bind_refused = old.bind_refused and not new.node_name
            if _same_but_version(old, new):
                # Nothing the verbs read changed (a status update of the kubelet,
                # the echo of our own binding): no listener has anything to do,
                # and the node's remembered scores stay valid.
                old.resource_version = new.resource_version
                return
        self._store(old, new)

    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        old = self.pods.get(f"{namespace}/{name}")
        if old is None or (uid and old.uid != uid):
            return
        self._store(old, None)

    def replace_pods(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Adopt a fresh list: pods missing from it were deleted while we did not watch."""
        seen: set[str] = set()
        for raw in objects:
            self.apply_pod(raw)
            meta = raw.get("metadata") or {}
            seen.add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        for key in [k for k in self.pods if k not in seen]:
            self._store(self.pods[key], None)

    def reserve(self, pod_key: str, node: str) -> None:
        """The gate holds the pod on `node`: count its requests there from now on."""
        pod = self.pods.get(pod_key)
        if pod is None or pod.node_name:
            return
        self._account(pod, -1)
        pod.reserved_node = node
        pod.bind_refused = False
        self._account(pod, +1)
        self._restamp_group(pod)

    def unreserve(self, pod_key: str) -> None:
        """The gate answered the pod's bind call with an error: its node is free again."""
        pod = self.pods.get(pod_key)
        if pod is None or not pod.reserved_node:
            return
        self._account(pod, -1)
        pod.reserved_node = ""
        pod.bind_refused = True
        self._account(pod, +1)
        self._restamp_group(pod)

    def assume_bound(self, pod_key: str, node: str) -> None:
        """We created the binding; record it before the watch echoes it back."""
        pod = self.pods.get(pod_key)
        if pod is None:
            return
        self._account(pod, -1)
        pod.node_name = node
        pod.reserved_node = ""
        self._account(pod, +1)
        self._restamp_group(pod)

    def _store(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if old is not None:
            self._account(old, -1)
            self._restamp_group(old)
            if old.group is not None:
                members = self._members.get(old.group.key)
                if members is not None:
                    members.discard(old.key)
                    if not members:
                        del self._members[old.group.key]
                        # Groups come and go (one per Job run): keep no stamp for
                        # an empty one; a new member gets a fresh, higher stamp.
                        del self._group_stamps[old.group.key]
            del self.pods[old.key]
            if self._by_uid.get(old.uid) == old.key:
                del self._by_uid[old.uid]
        if new is not None:
            self.pods[new.key] = new
            self._by_uid[new.uid] = new.key
            self._account(new, +1)
            self._restamp_group(new)
            if new.group is not None:
                self._members.setdefault(new.group.key, set()).add(new.key)
        for listener in self._pod_listeners:
            listener(old, new)

    def _account(self, pod: PodRecord, sign: int) -> None:
        """Count (+1) or uncount (-1) the pod where it is placed, and in `leaving`/`nominated`."""
        self._index(pod, sign)
        node = pod.placed_node
        if not node or pod.terminal:
            return
        self._restamp(node)
        requested = self._requested.setdefault(node, {})
        if sign > 0:
            add(requested, pod.requests)
            self._on_node.setdefault(node, set()).add(pod.key)
        else:
            subtract(requested, pod.requests)
            keys = self._on_node.get(node)
            if keys is not None:
                keys.discard(pod.key)
                if not keys:
                    del self._on_node[node]
            if not requested:
                del self._requested[node]

    def _index(self, pod: PodRecord, sign: int) -> None:
        if sign < 0:
            self.leaving.pop(pod.key, None)
            self.nominated.pop(pod.key, None)
        elif pod.terminal:
            return
        elif pod.placed_node:
            if pod.deleting or pod.preempted:
                self.leaving[pod.key] = pod
        elif pod.nominated_node:
            self.nominated[pod.key] = pod

    # ---- nodes and podgroups --------------------------------------------------

    def apply_node(self, raw: Mapping[str, Any]) -> None:
        record = self._with_hypernodes(node_record_from(raw))
        self.nodes[record.name] = record
        self._restamp(record.name)
        self._nodes_changed()

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self._restamp(name)
        self._nodes_changed()

    def replace_nodes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        fresh = {r.name: self._with_hypernodes(r) for r in map(node_record_from, objects)}
        for name in {*self.nodes, *fresh}:
            self._restamp(name)
        self.nodes = fresh
        self._nodes_changed()

    # ---- Volcano HyperNodes -------------------------------------------------

    def _with_hypernodes(self, record: NodeRecord) -> NodeRecord:
        """The record with a label per HyperNode tier holding the node (app/core/hypernode.py)."""
        own = record.own_labels if record.own_labels is not None else record.labels
        record.own_labels = own
        if not self.hypernodes.hypernodes:
            record.labels = own
            return record
        extra = self.hypernodes.labels_for(record.name, own)
        record.labels = {**own, **extra} if extra else own
        return record

    def _hypernodes_changed(self, hypernodes: dict[str, HyperNode]) -> None:
        """Rebuild the index and relabel every node; restamp the nodes whose labels changed."""
        self.hypernodes = HyperNodeIndex.build(hypernodes.values())
        for problem in self.hypernodes.problems:
            log.warning("HyperNodes: %s", problem)
        changed = False
        for record in self.nodes.values():
            before = record.labels
            if self._with_hypernodes(record).labels != before:
                self._restamp(record.name)
                changed = True
        if changed:
            self._nodes_changed()

    def _read_hypernode(self, raw: Mapping[str, Any]) -> HyperNode | None:
        name = (raw.get("metadata") or {}).get("name") or ""
        try:
            hypernode = hypernode_from(raw)
        except HyperNodeError as err:
            if self.hypernode_errors.get(name) != str(err):
                log.warning("%s; it is left out of the topology until fixed", err)
            self.hypernode_errors[name] = str(err)
            return None
        self.hypernode_errors.pop(name, None)
        return hypernode

    def apply_hypernode(self, raw: Mapping[str, Any], *, relabel: bool = True) -> None:
        """relabel=False: only note it; relabel_hypernodes() then applies every change at
        once (a burst of HyperNode events costs one relabelling of the nodes, not one each)."""
        name = (raw.get("metadata") or {}).get("name") or ""
        hypernode = self._read_hypernode(raw)
        if hypernode is None:
            self._hypernodes_seen.pop(name, None)
        else:
            self._hypernodes_seen[name] = hypernode
        if relabel:
            self.relabel_hypernodes()

    def delete_hypernode(self, name: str, *, relabel: bool = True) -> None:
        self.hypernode_errors.pop(name, None)
        self._hypernodes_seen.pop(name, None)
        if relabel:
            self.relabel_hypernodes()

    def replace_hypernodes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.hypernode_errors.clear()
        read = (self._read_hypernode(raw) for raw in objects)
        self._hypernodes_seen = {h.name: h for h in read if h is not None}
        self.relabel_hypernodes()

    def relabel_hypernodes(self) -> None:
        """Make the node labels follow the HyperNodes seen, if they changed."""
        if self._hypernodes_seen != self.hypernodes.hypernodes:
            self._hypernodes_changed(dict(self._hypernodes_seen))

    def labels_of(self, node: str) -> Mapping[str, str]:
        """A node's labels (HyperNode tiers included); {} for a node not (or no longer) known."""
        record = self.nodes.get(node)
        return record.labels if record is not None else {}

    def placed_domain(
        self, constraint: TopologyConstraint, configured: tuple[str, ...], nodes: list[str]
    ) -> Domain | None:
        """The lowest domain of the constraint's levels all `nodes` share (app/core/topology.py)."""
        return placed_domain(
            constraint,
            self.topology_levels(configured),
            nodes,
            self.labels_of,
            self.hypernodes.tier_names,
        )

    def topology_levels(self, configured: tuple[str, ...]) -> tuple[str, ...]:
        """The configured levels, then the HyperNode tiers there are, lowest first."""
        return (*configured, *self.hypernodes.levels) if self.hypernodes.levels else configured

    def apply_podgroup(self, raw: Mapping[str, Any], source: str = SOURCE_XK8S) -> None:
        record = podgroup_record_from(raw, source)
        self.podgroups[record.key] = record

    def delete_podgroup(self, namespace: str, name: str, source: str = SOURCE_XK8S) -> None:
        self.podgroups.pop(group_key(source, namespace, name), None)

    def replace_podgroups(
        self, objects: Iterable[Mapping[str, Any]], source: str = SOURCE_XK8S
    ) -> None:
        """Adopt a fresh list of one source's objects; the other sources' records stay."""
        fresh = {r.key: r for r in (podgroup_record_from(o, source) for o in objects)}
        kept = {k: r for k, r in self.podgroups.items() if r.source != source}
        self.podgroups = {**kept, **fresh}

    # ---- queries --------------------------------------------------------------

    def group_spec(self, ref: GroupRef) -> GroupSpec:
        """The group's rules; raises GroupNotFound or PodGroupSpecError with a usable message."""
        if ref.min_available is not None:
            return spec_from_labels(ref)
        record = self.podgroups.get(ref.key)
        if record is None:
            raise GroupNotFound(not_found_message(ref))
        if record.spec is None:
            raise PodGroupSpecError(record.error or f"PodGroup {ref.key} has an unusable spec")
        return record.spec

    def members(self, group_key: str) -> list[PodRecord]:
        """Siblings that can still take part (not finished, not being deleted)."""
        keys = self._members.get(group_key, ())
        return [p for k in keys if (p := self.pods[k]).counts_as_member]

    def pod_by_uid(self, uid: str) -> PodRecord | None:
        key = self._by_uid.get(uid)
        return self.pods.get(key) if key is not None else None

    def placed_members(self, group_key: str) -> list[PodRecord]:
        """Members holding a node now: bound by the API or reserved in the gate."""
        return [p for p in self.members(group_key) if p.placed_node]

    def total_allocatable(self) -> Resources:
        total: Resources = {}
        for node in self.nodes.values():
            if not node.unschedulable:
                add(total, node.allocatable)
        return total

    def requested_on(self, node: str) -> Resources:
        return self._requested.get(node, {})

    def pods_on(self, node: str) -> list[PodRecord]:
        """The non-terminal pods placed on `node` (bound, or reserved in the gate)."""
        return [self.pods[key] for key in self._on_node.get(node, ())]

    def room(self) -> list[Bin]:
        """What each schedulable node has free once the pods `leaving` it are gone.

        A fresh copy per call, for a packing to work on (gang admission, the
        preempt verb); below zero where a node is overcommitted.
        """
        leaving_on: dict[str, list[Resources]] = {}
        for pod in self.leaving.values():
            leaving_on.setdefault(pod.placed_node, []).append(pod.requests)
        bins: list[Bin] = []
        for node in self.nodes.values():
            if node.unschedulable:
                continue
            free = dict(node.allocatable)
            subtract(free, self._requested.get(node.name, {}))
            for requests in leaving_on.get(node.name, ()):
                add(free, requests)
            bins.append(Bin(node.name, free, node.labels, node.taints))
        return bins

    def free_resources(self, exclude_group: str | None = None) -> Resources:
        """Allocatable minus what placed pods request, over schedulable nodes.

        Pods of `exclude_group` do not count as used: a group that already has
        members placed needs only the rest (Coscheduling's minResources rule).
        Each node contributes what is left on it, never less than zero.
        """
        own: dict[str, Resources] = {}
        if exclude_group is not None:
            for pod in self.members(exclude_group):
                if pod.placed_node:
                    add(own.setdefault(pod.placed_node, {}), pod.requests)
        free: Resources = {}
        for node in self.nodes.values():
            if node.unschedulable:
                continue
            used = dict(self._requested.get(node.name, {}))
            subtract(used, own.get(node.name, {}))
            for name, amount in node.allocatable.items():
                left = amount - used.get(name, 0)
                if left > 0:
                    free[name] = free.get(name, 0) + left
        return free


# ---- parsing API objects into records --------------------------------------------


_POINTER = {
    SOURCE_XK8S: "the pod's label scheduling.x-k8s.io/pod-group",
    "volcano": "the pod's annotation scheduling.k8s.io/group-name",
    "native": "the pod's spec.schedulingGroup.podGroupName",
}


def not_found_message(ref: GroupRef) -> str:
    api = GROUP_APIS[ref.source]
    return (
        f"PodGroup {ref.namespace}/{ref.name} not found: create it (kind {api.kind}, apiVersion "
        f"{api.api_version}) or fix {_POINTER[ref.source]}"
    )


def pod_record_from(raw: Mapping[str, Any], sources: frozenset[str] = ALL_SOURCES) -> PodRecord:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    conditions = status.get("conditions") or ()
    namespace = meta.get("namespace") or "default"
    group: GroupRef | None = None
    group_error: str | None = None
    topology: TopologyConstraint | None = None
    queue = ""
    try:
        group = group_ref_of_pod(namespace, meta, spec, sources)
        if group is not None:
            annotations = meta.get("annotations") or {}
            queue = str(annotations.get(QUEUE_ANNOTATION) or "")
            topology = constraint_from_annotations(annotations, "pod")
    except (GroupLabelError, TopologyError) as err:
        group_error = str(err)
    try:
        requests = pod_requests(spec)
    except QuantityError as err:
        log.warning("pod %s/%s has unreadable requests: %s", namespace, meta.get("name"), err)
        requests = {"pods": 1000}
    return PodRecord(
        namespace=namespace,
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        requests=requests,
        priority=int(spec.get("priority") or 0),
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        group=group,
        group_error=group_error,
        resource_version=meta.get("resourceVersion") or "",
        preempted=any(
            c.get("type") == "DisruptionTarget"
            and c.get("status") == "True"
            and c.get("reason") == "PreemptionByScheduler"
            for c in conditions
        ),
        unschedulable=any(
            c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions
        ),
        created=parse_timestamp(meta.get("creationTimestamp")),
        gated=bool(spec.get("schedulingGates")),
        unschedulable_message=_unschedulable_message(status),
        placement=placement_of(spec),
        nominated_node=status.get("nominatedNodeName") or "",
        topology=topology,
        marked=group is not None and is_marked(raw),
        queue=queue,
    )


def _same_but_version(old: PodRecord, new: PodRecord) -> bool:
    """The two records are equal in every field but resource_version."""
    version = new.resource_version
    new.resource_version = old.resource_version
    same = new == old
    new.resource_version = version
    return same


def _unschedulable_message(status: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "")
    return ""


def parse_timestamp(value: Any) -> float:
    """An API timestamp (RFC 3339 string, or the client's datetime) as epoch seconds."""
    if isinstance(value, datetime):
        return value.timestamp()
    return parse_rfc3339(value) or 0.0


def node_record_from(raw: Mapping[str, Any]) -> NodeRecord:
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    try:
        allocatable = parse_resource_list(status.get("allocatable") or status.get("capacity"))
    except QuantityError as err:
        log.warning("node %s has unreadable allocatable: %s", meta.get("name"), err)
        allocatable = {}
    return NodeRecord(
        name=meta.get("name") or "",
        allocatable=allocatable,
        unschedulable=bool((raw.get("spec") or {}).get("unschedulable")),
        labels=dict(meta.get("labels") or {}),
        taints=taints_of(raw.get("spec") or {}),
    )


def podgroup_record_from(raw: Mapping[str, Any], source: str = SOURCE_XK8S) -> PodGroupRecord:
    meta = raw.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    name = meta.get("name") or ""
    key = group_key(source, namespace, name)
    try:
        spec: GroupSpec | None = SPEC_READERS[source](key, raw.get("spec"))
        error = None
        if spec is not None and spec.topology is None:
            annotated = constraint_from_annotations(meta.get("annotations"), "PodGroup")
            if annotated is not None:
                spec = dataclasses.replace(spec, topology=annotated)
        queue = (meta.get("annotations") or {}).get(QUEUE_ANNOTATION)
        if spec is not None and spec.queue is None and isinstance(queue, str) and queue:
            spec = dataclasses.replace(spec, queue=queue)
    except TopologyError as err:
        spec, error = None, f"PodGroup {key}: {err}"
    except PodGroupSpecError as err:
        spec, error = None, str(err)
    return PodGroupRecord(
        namespace,
        name,
        meta.get("uid") or "",
        spec,
        error,
        source,
        parse_timestamp(meta.get("creationTimestamp")),
    )
