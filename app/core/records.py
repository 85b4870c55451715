"""The slim records the verbs read of Nodes, Pods and PodGroups, and how API objects become them.

A record keeps only what some decision needs, parsed once when the watch
delivers the object: the verbs then never read raw API dictionaries. Parsing
never fails: a field that cannot be read is logged and given a safe value, or
(for a group) kept as an error to show the users whose pods point at it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.core.devices.records import PodClaim, pod_claims_of
from app.core.group_rules import spec_from_kai
from app.core.group_specs import SPEC_READERS
from app.core.groups import (
    ALL_SOURCES,
    GROUP_APIS,
    SOURCE_KAI,
    SOURCE_XK8S,
    GroupLabelError,
    GroupRef,
    GroupSpec,
    PodGroupSpecError,
    group_key,
    group_ref_of_pod,
)
from app.core.marking import LINE_GATE, can_preempt, is_marked
from app.core.placement import Placement, Taint, placement_of, taints_of
from app.core.queues import QUEUE_ANNOTATION
from app.core.resources import (
    PREEMPTOR_RESOURCE,
    QuantityError,
    Resources,
    parse_resource_list,
    pod_requests,
)
from app.core.timestamps import parse_rfc3339
from app.core.topology.domains import TopologyConstraint, TopologyError
from app.core.topology.sources import constraint_from_annotations
from app.core.topology.subgroups import PodShape, Slicing, pod_shape, slicing_from_annotations

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# The PodScheduled reason kube-scheduler writes for a gated pod: not tried, not unschedulable.
_SCHEDULING_GATED = "SchedulingGated"


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
    # spec.schedulingGates holds a gate other than the line's: kube-scheduler does not try
    # the pod yet, and it is no member yet (another controller holds it).
    gated: bool = False
    # spec.schedulingGates holds the line's gate (app/core/marking.py LINE_GATE): a member
    # the extender keeps out of kube-scheduler's queue while its gang waits in line
    # (app/runtime/holds.py); it counts as a member.
    held: bool = False
    # The latest PodScheduled=False message kube-scheduler wrote (why it is unplaced).
    unschedulable_message: str = ""
    # spec.preemptionPolicy is not Never: the pod may evict pods of lower priority.
    may_preempt: bool = True
    # nodeSelector, required node affinity, tolerations (None: any node).
    placement: Placement | None = None
    # status.nominatedNodeName: kube-scheduler preempted pods to make room here.
    nominated_node: str = ""
    # Kueue's podset topology annotations on the pod (app/core/topology/domains.py), None: none.
    topology: TopologyConstraint | None = None
    # Kueue's podset slices on the pod, and its rank in the gang (its index label),
    # which decide its slice (app/core/topology/tree.py).
    slicing: Slicing | None = None
    rank: int | None = None
    # A group member's labels (Volcano's subGroupPolicy matches them); None for other pods.
    labels: Mapping[str, str] | None = None
    # A group member carrying the member mark (app/core/marking.py), which the
    # gang-only mode needs for kube-scheduler to call us; False for plain pods.
    marked: bool = False
    # A plain pod that may preempt (app/core/marking.py can_preempt) without
    # the preemptor mark: with --webhook-mark-preemptors kube-scheduler would
    # evict for it without asking us.
    unmarked_preemptor: bool = False
    # The queue its gang joins (annotation scheduling.volcano.sh/queue-name), "": none named.
    queue: str = ""
    # Its DRA claims (spec.resourceClaims): what they ask is in `requests`
    # (app/core/devices/book.py).
    claims: tuple[PodClaim, ...] = ()
    # What the claims added to `requests` beside devices/...: the extended resource
    # names their classes back (taken off again when the claims are counted anew).
    claim_extras: Resources = field(default_factory=dict, compare=False)

    # "namespace/name", made once with the record: the index looks a pod up by it a
    # dozen times per watch event, and every index then shares this one string.
    key: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        self.key = f"{self.namespace}/{self.name}"

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

    @property
    def refused_for_room(self) -> bool:
        """kube-scheduler's last refusal was its NodeResourcesFit's ("3 Insufficient cpu"):
        the pod waits for room, as a gang the line turned away does. Its condition has no
        structured reason (always "Unschedulable"), so the message is all there is."""
        return _SHORT_OF_ROOM in self.unschedulable_message


@dataclass(slots=True)
class NodeRecord:
    name: str
    allocatable: Resources
    unschedulable: bool
    # The node's labels, with one per HyperNode tier holding it (app/core/topology/hypernode.py).
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
    # The root of a CompositePodGroup tree (app/core/composite_trees.py), not a PodGroup:
    # its Events name that kind.
    composite: bool = False

    @property
    def key(self) -> str:
        return group_key(self.source, self.namespace, self.name, composite=self.composite)


class GroupNotFound(LookupError):
    """The pod names a PodGroup that does not exist (yet)."""


def delivered(members: Iterable[PodRecord], uid: str) -> bool:
    """Whether the pod kube-scheduler sent is among the members our watch delivered.

    The watch may lag behind kube-scheduler's: a pod it has not delivered yet
    still counts as a member of its gang (as a sibling, a demand, a binding).
    """
    return any(p.uid == uid for p in members)


# ---- parsing API objects into records --------------------------------------------


_READERS = {**SPEC_READERS, SOURCE_KAI: spec_from_kai}

_POINTER = {
    SOURCE_XK8S: "the pod's label scheduling.x-k8s.io/pod-group",
    "volcano": "the pod's annotation scheduling.k8s.io/group-name",
    "native": "the pod's spec.schedulingGroup.podGroupName",
    "kai": "the pod's annotation pod-group-name",
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
    gates = _gate_names(spec)
    namespace = meta.get("namespace") or "default"
    group: GroupRef | None = None
    group_error: str | None = None
    shape = PodShape()
    queue = ""
    try:
        group = group_ref_of_pod(namespace, meta, spec, sources)
        if group is not None:
            queue = str((meta.get("annotations") or {}).get(QUEUE_ANNOTATION) or "")
            shape = pod_shape(meta)
    except (GroupLabelError, TopologyError) as err:
        group_error = str(err)
    return PodRecord(
        namespace=namespace,
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        requests=_requests_of(namespace, meta, spec),
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
        unschedulable=_unplaced(conditions) is not None,
        created=parse_timestamp(meta.get("creationTimestamp")),
        gated=bool(gates - {LINE_GATE}),
        held=LINE_GATE in gates,
        unschedulable_message=_unschedulable_message(status),
        may_preempt=spec.get("preemptionPolicy") != "Never",
        placement=placement_of(spec),
        nominated_node=status.get("nominatedNodeName") or "",
        topology=shape.topology,
        slicing=shape.slicing,
        rank=shape.rank,
        labels=meta.get("labels") if group is not None else None,
        marked=group is not None and is_marked(raw),
        unmarked_preemptor=(
            group is None
            and can_preempt(raw)
            and not is_marked(raw)
            and not is_marked(raw, PREEMPTOR_RESOURCE)
        ),
        queue=queue,
        claims=pod_claims_of(spec, status),
    )


def _requests_of(namespace: str, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> Resources:
    try:
        return pod_requests(spec)
    except QuantityError as err:
        log.warning("pod %s/%s has unreadable requests: %s", namespace, meta.get("name"), err)
        return {"pods": 1000}


def same_but_version(old: PodRecord, new: PodRecord) -> bool:
    """The two records are equal in every field but resource_version."""
    version = new.resource_version
    new.resource_version = old.resource_version
    same = new == old
    new.resource_version = version
    return same


def _gate_names(spec: Mapping[str, Any]) -> set[str]:
    """The names in spec.schedulingGates (a malformed entry counts as a gate: it holds the pod)."""
    gates = spec.get("schedulingGates")
    if not gates:
        return set()
    if not isinstance(gates, list):
        return {"?"}
    return {str(g.get("name") or "?") if isinstance(g, Mapping) else "?" for g in gates}


def _unplaced(conditions: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """kube-scheduler's PodScheduled=False condition: it tried the pod and found no node (a
    gated pod's, reason SchedulingGated, is none: it was not tried)."""
    for condition in conditions:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") != _SCHEDULING_GATED
        ):
            return condition
    return None


# NodeResourcesFit's reason in kube-scheduler's "0/3 nodes are available: ..." message.
_SHORT_OF_ROOM = "Insufficient "


def _unschedulable_message(status: Mapping[str, Any]) -> str:
    condition = _unplaced(status.get("conditions") or ())
    if condition is None:
        return ""
    return str(condition.get("message") or condition.get("reason") or "")


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
        spec: GroupSpec | None = _READERS[source](key, raw.get("spec"))
        error = None
        if spec is not None and spec.topology is None:
            annotated = constraint_from_annotations(meta.get("annotations"), "PodGroup")
            if annotated is not None:
                spec = dataclasses.replace(spec, topology=annotated)
        slicing = slicing_from_annotations(meta.get("annotations"), "PodGroup")
        if spec is not None and slicing is not None:
            spec = dataclasses.replace(spec, slicing=slicing)
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
