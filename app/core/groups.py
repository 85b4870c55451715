"""How a pod names its gang, and what the gang asks for: one model, four sources.

Every source ends in the same GroupSpec, so admission, the gate, scoring and
preemption never care where a group was declared:

- `x-k8s`: scheduler-plugins' PodGroup (`scheduling.x-k8s.io/v1alpha1`),
  pods carry the label `scheduling.x-k8s.io/pod-group: <name>`. This is what
  mpi-operator and the Kubeflow training-operator create.
- `labels`: no object at all; `pod-group.scheduling.sigs.k8s.io/name` and
  `.../min-available` on the pods (scheduler-plugins' lightweight coscheduling).
- `volcano`: Volcano's PodGroup (`scheduling.volcano.sh/v1beta1`), pods name
  it with the annotation `scheduling.k8s.io/group-name` (or
  `scheduling.volcano.sh/group-name`); `minTaskMember` counts per task
  (pod annotation `volcano.sh/task-spec`, else the label of that name).
- `native`: Kubernetes' own PodGroup (`scheduling.k8s.io/v1beta1`, feature
  gate GenericWorkload), pods point to it with `spec.schedulingGroup.podGroupName`.
- `kueue`: Kueue's plain pod groups, no object either: the label
  `kueue.x-k8s.io/pod-group-name` and the annotation
  `kueue.x-k8s.io/pod-group-total-count` (the gang's size) on every pod.
- `kai`, `yunikorn`: KAI's PodGroup and YuniKorn's task groups (app/core/kai.py,
  app/core/yunikorn.py; their specs: app/core/role_sources.py).

This module is the single home of those API coordinates. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.kai import KaiPointerError, kai_pointer
from app.core.lws import LWS_NAME_LABEL, LwsLabelError, lws_gang_of
from app.core.resources import Resources
from app.core.topology.domains import TopologyConstraint
from app.core.topology.subgroups import Slicing, SubGroup, SubGroupPolicy
from app.core.yunikorn import SchedulingPolicy, TaskGroupsError, task_group_member

SOURCE_XK8S = "x-k8s"
SOURCE_LABELS = "labels"
SOURCE_VOLCANO = "volcano"
SOURCE_NATIVE = "native"
SOURCE_KUEUE = "kueue"
# LeaderWorkerSet replicas (app/core/lws.py): opt-in (--lws-gangs), so not among ALL_SOURCES.
SOURCE_LWS = "lws"
SOURCE_KAI = "kai"
SOURCE_YUNIKORN = "yunikorn"
ALL_SOURCES = frozenset({SOURCE_XK8S, SOURCE_LABELS, SOURCE_VOLCANO, SOURCE_NATIVE, SOURCE_KUEUE})
ALL_SOURCES |= {SOURCE_KAI, SOURCE_YUNIKORN}


@dataclass(frozen=True, slots=True)
class GroupApi:
    """Where a source's group objects live in the API."""

    source: str
    group: str
    version: str
    plural: str
    kind: str
    # Volcano's CRD has no status subresource: status is written on the object itself.
    status_subresource: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


XK8S_API = GroupApi(SOURCE_XK8S, "scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", True)
VOLCANO_API = GroupApi(
    SOURCE_VOLCANO, "scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", False
)
NATIVE_API = GroupApi(SOURCE_NATIVE, "scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup", True)
KAI_API = GroupApi(SOURCE_KAI, "scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup", True)
GROUP_APIS = {api.source: api for api in (XK8S_API, VOLCANO_API, NATIVE_API, KAI_API)}


POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LIGHT_NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
LIGHT_MIN_AVAILABLE_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
VOLCANO_TASK_ANNOTATION = "volcano.sh/task-spec"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"


class GroupLabelError(ValueError):
    """The pod's group labels cannot be understood; the message says how to fix them."""


COMPOSITE_KEY_PREFIX = "composite"
"""The key prefix of a CompositePodGroup tree's gang (app/core/composite.py)."""


def group_key(source: str, namespace: str, name: str, *, composite: bool = False) -> str:
    """The group's identity in caches, the gate and messages.

    x-k8s and label-only groups keep the plain `namespace/name` that
    Coscheduling users know; the other sources are prefixed so that a Volcano
    and a native PodGroup of the same name never share a gang, and so is the
    root of a CompositePodGroup tree (`composite`): a PodGroup may bear its name.
    """
    if composite:
        return f"{COMPOSITE_KEY_PREFIX}:{namespace}/{name}"
    if source in (SOURCE_XK8S, SOURCE_LABELS):
        return f"{namespace}/{name}"
    return f"{source}:{namespace}/{name}"


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A pod's pointer to its group, as read from its labels, annotations or spec."""

    namespace: str
    name: str
    # Set for label-only groups; None when an object holds the spec.
    min_available: int | None = None
    source: str = SOURCE_XK8S
    # Volcano: the pod's task (annotation volcano.sh/task-spec), for minTaskMember;
    # KAI: its sub-group; YuniKorn: its task group.
    task: str = ""
    # YuniKorn: the task groups its own annotation declares (None: none), or why unusable.
    roles: tuple[tuple[str, int], ...] | None = None
    roles_error: str = ""
    # YuniKorn: the schedulingPolicyParameters of a pod that declares task groups.
    policy: SchedulingPolicy | None = None
    # LeaderWorkerSet (no object, more than a count): the spec its pod's labels declare.
    spec: GroupSpec | None = field(default=None, compare=False)
    # The root of a CompositePodGroup tree (name), reached from a leaf (task).
    composite: bool = False

    @property
    def key(self) -> str:
        return group_key(self.source, self.namespace, self.name, composite=self.composite)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What the group asks for, whichever source declared it."""

    key: str
    min_member: int
    min_resources: Resources = field(default_factory=dict)
    # None: use the extender's --permit-waiting-time-seconds.
    schedule_timeout_seconds: int | None = None
    # YuniKorn's gangSchedulingStyle Soft: once the gang has waited its timeout, its
    # members are scheduled as plain pods (app/core/soft_timeouts.py); False: it stays a gang.
    plain_after_timeout: bool = False
    source: str = SOURCE_XK8S
    # Volcano minTaskMember: (task, minimum) pairs, sorted; each task needs its own minimum.
    min_task_member: tuple[tuple[str, int], ...] = ()
    # Volcano queue (or annotation scheduling.volcano.sh/queue-name on the group object):
    # the queue the gang shares the cluster in (app/core/queues.py). priorityClassName: shown only.
    queue: str | None = None
    priority_class_name: str | None = None
    # Where the whole gang must (or should) be placed together (app/core/topology/domains.py).
    topology: TopologyConstraint | None = None
    # Kueue's podset slices declared on the group object (app/core/topology/tree.py).
    slicing: Slicing | None = None
    # Volcano spec.subGroupPolicy (app/core/topology/subgroup_sources.py).
    sub_group_policy: tuple[SubGroupPolicy, ...] = ()
    # KAI spec.subGroups: the named sub-group tree (app/core/kai.py).
    sub_groups: tuple[SubGroup, ...] = ()
    # LeaderWorkerSet exclusive-topology: the replica's size. Its members come only once
    # the first is placed, and its domain (topology) must hold no other LWS group and
    # have room for them all (app/core/topology/exclusive.py). 0: no such rule.
    exclusive_size: int = 0


def group_ref_of(namespace: str, labels: Mapping[str, str] | None) -> GroupRef | None:
    """The group a pod's labels name (x-k8s label or label-only group), None for none.

    Raises GroupLabelError for labels that name a group but cannot be used,
    so the pod is rejected with a message instead of silently scheduled alone.
    """
    return group_ref_of_pod(namespace, {"labels": labels or {}}, None)


def group_ref_of_pod(
    namespace: str,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any] | None,
    sources: Iterable[str] = ALL_SOURCES,
) -> GroupRef | None:
    """The group a pod belongs to, from the first enabled source that names one.

    Precedence: x-k8s label, native spec.schedulingGroup, Volcano annotation,
    Kueue pod group, KAI annotation, YuniKorn task groups, LeaderWorkerSet replica
    (opt-in), label-only group. A source that is switched off (or whose API the
    cluster does not serve) is not
    consulted: its pods are ordinary pods for us.
    """
    enabled = frozenset(sources)
    labels = meta.get("labels") or {}
    if SOURCE_XK8S in enabled:
        name = labels.get(POD_GROUP_LABEL)
        if name is not None:
            if not name:
                raise GroupLabelError(
                    f"label {POD_GROUP_LABEL} is empty: set it to the name of a PodGroup "
                    "in the pod's namespace, or remove it"
                )
            return GroupRef(namespace, name)
    if SOURCE_NATIVE in enabled:
        group = (spec or {}).get("schedulingGroup")
        # A dict (decoded JSON); isinstance() against Mapping costs more on every pod.
        if isinstance(group, dict) and group.get("podGroupName"):
            return GroupRef(namespace, str(group["podGroupName"]), source=SOURCE_NATIVE)
    if SOURCE_VOLCANO in enabled:
        annotations = meta.get("annotations") or {}
        for annotation in VOLCANO_GROUP_ANNOTATIONS:
            name = annotations.get(annotation)
            if name is None:
                continue
            if not isinstance(name, str) or not name:
                raise GroupLabelError(
                    f"annotation {annotation} is empty: set it to the name of a Volcano "
                    "PodGroup in the pod's namespace, or remove it"
                )
            # The annotation, else the label of the same name (as Volcano's scheduler reads it).
            task = annotations.get(VOLCANO_TASK_ANNOTATION) or labels.get(VOLCANO_TASK_ANNOTATION)
            return GroupRef(
                namespace,
                name,
                source=SOURCE_VOLCANO,
                task=task if isinstance(task, str) else "",
            )
    if SOURCE_KUEUE in enabled and labels.get(KUEUE_GROUP_LABEL) is not None:
        return _kueue_ref(namespace, labels[KUEUE_GROUP_LABEL], meta.get("annotations") or {})
    if (ref := _role_source_ref(namespace, meta, enabled)) is not None:
        return ref
    if SOURCE_LWS in enabled and LWS_NAME_LABEL in labels:
        return _lws_ref(namespace, labels, meta.get("annotations") or {})
    if SOURCE_LABELS in enabled:
        return _light_ref(namespace, labels)
    return None


def _lws_ref(namespace: str, labels: Mapping[str, str], annotations: Mapping[str, Any]) -> GroupRef:
    """A LeaderWorkerSet replica: a gang of its size, its sub-groups and exclusive levels."""
    try:
        gang = lws_gang_of(labels, annotations)
    except LwsLabelError as err:
        raise GroupLabelError(str(err)) from None
    assert gang is not None
    key = group_key(SOURCE_LWS, namespace, gang.group_name)
    spec = GroupSpec(
        key=key,
        min_member=gang.min_member,
        source=SOURCE_LWS,
        topology=gang.constraint,
        sub_group_policy=gang.policies,
        exclusive_size=gang.size if gang.constraint is not None else 0,
    )
    return GroupRef(namespace, gang.group_name, gang.min_member, SOURCE_LWS, spec=spec)


def _kueue_ref(namespace: str, name: str, annotations: Mapping[str, Any]) -> GroupRef:
    """Kueue's plain pod group: its size is the total count every pod carries."""
    if not name:
        raise GroupLabelError(f"label {KUEUE_GROUP_LABEL} is empty: set it to the group's name")
    raw = annotations.get(KUEUE_TOTAL_COUNT_ANNOTATION)
    try:
        total = int(raw) if isinstance(raw, str) else 0
    except ValueError:
        total = 0
    if total < 1:
        raise GroupLabelError(
            f"label {KUEUE_GROUP_LABEL}={name} needs the annotation "
            f"{KUEUE_TOTAL_COUNT_ANNOTATION} set to a whole number >= 1 (the number of pods "
            f"in the group), got {raw!r:.40}"
        )
    return GroupRef(namespace, name, total, SOURCE_KUEUE)


def _role_source_ref(
    namespace: str, meta: Mapping[str, Any], enabled: frozenset[str]
) -> GroupRef | None:
    """A KAI PodGroup's or a YuniKorn gang's member (app/core/kai.py, app/core/yunikorn.py)."""
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    try:
        if SOURCE_KAI in enabled and (kai := kai_pointer(labels, annotations)) is not None:
            return GroupRef(namespace, kai[0], source=SOURCE_KAI, task=kai[1])
        if SOURCE_YUNIKORN in enabled and (yk := task_group_member(labels, annotations)):
            size = sum(n for _, n in yk.roles or ())
            return GroupRef(namespace, yk.app, size, SOURCE_YUNIKORN, yk.task, *yk[2:])
    except (KaiPointerError, TaskGroupsError) as err:
        raise GroupLabelError(str(err)) from None
    return None


def _light_ref(namespace: str, labels: Mapping[str, str]) -> GroupRef | None:
    name = labels.get(LIGHT_NAME_LABEL)
    if name is None:
        return None
    raw_min = labels.get(LIGHT_MIN_AVAILABLE_LABEL)
    if not name:
        raise GroupLabelError(f"label {LIGHT_NAME_LABEL} is empty: set it to the group's name")
    if raw_min is None:
        raise GroupLabelError(
            f"label {LIGHT_NAME_LABEL}={name} needs {LIGHT_MIN_AVAILABLE_LABEL} "
            "(the number of pods that must start together)"
        )
    try:
        min_available = int(raw_min)
    except ValueError:
        min_available = 0
    if min_available < 1:
        raise GroupLabelError(
            f"label {LIGHT_MIN_AVAILABLE_LABEL}={raw_min!r} must be a whole number >= 1"
        )
    return GroupRef(namespace, name, min_available, SOURCE_LABELS)


class PodGroupSpecError(ValueError):
    """A group object whose spec cannot be used."""
