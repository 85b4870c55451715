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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.core.kai import KaiPointerError, kai_pointer
from app.core.resources import QuantityError, Resources, parse_resource_list
from app.core.topology.domains import TopologyConstraint, TopologyError
from app.core.topology.sources import constraint_from_native, constraint_from_volcano
from app.core.topology.subgroup_sources import policies_from_volcano
from app.core.topology.subgroups import Slicing, SubGroup, SubGroupPolicy
from app.core.yunikorn import TaskGroupsError, task_group_member

_T = TypeVar("_T")

SOURCE_XK8S = "x-k8s"
SOURCE_LABELS = "labels"
SOURCE_VOLCANO = "volcano"
SOURCE_NATIVE = "native"
SOURCE_KUEUE = "kueue"
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


def group_key(source: str, namespace: str, name: str) -> str:
    """The group's identity in caches, the gate and messages.

    x-k8s and label-only groups keep the plain `namespace/name` that
    Coscheduling users know; the other sources are prefixed so that a Volcano
    and a native PodGroup of the same name never share a gang.
    """
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

    @property
    def key(self) -> str:
        return group_key(self.source, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What the group asks for, whichever source declared it."""

    key: str
    min_member: int
    min_resources: Resources = field(default_factory=dict)
    # None: use the extender's --permit-waiting-time-seconds.
    schedule_timeout_seconds: int | None = None
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
    Kueue pod group, KAI annotation, YuniKorn task groups, label-only group. A
    source that is switched off (or whose API the cluster does not serve) is not
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
    if SOURCE_LABELS in enabled:
        return _light_ref(namespace, labels)
    return None


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


# The group APIs declare their counts and timeouts as int32.
_INT32_MAX = 2**31 - 1


def _int_field(
    key: str, spec: Mapping[str, Any], name: str, default: int | None, minimum: int
) -> int | None:
    # An explicit null is an absent field, as the API server's defaulting treats it.
    value = spec.get(name)
    if value is None:
        value = default
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= _INT32_MAX:
        raise PodGroupSpecError(
            f"PodGroup {key}: spec.{name} must be an integer between {minimum} and "
            f"{_INT32_MAX}, got {value!r:.80}"
        )
    return value


def _spec_object(key: str, spec: Any) -> Mapping[str, Any]:
    """The spec as a mapping: absent is empty, anything else but an object is refused."""
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise PodGroupSpecError(f"PodGroup {key}: spec must be an object, got {spec!r:.80}")
    return spec


def _min_resources(key: str, spec: Mapping[str, Any]) -> Resources:
    try:
        return parse_resource_list(spec.get("minResources"))
    except QuantityError as err:
        raise PodGroupSpecError(f"PodGroup {key}: spec.minResources: {err}") from None


def spec_from_podgroup(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read an x-k8s PodGroup's spec; the CRD schema already validates, this guards old objects.

    scheduleTimeoutSeconds 0 or absent means "the extender's default", as in
    upstream Coscheduling: mpi-operator and the training-operator write 0
    when a job sets no timeout.
    """
    spec = _spec_object(key, spec)
    min_member = _int_field(key, spec, "minMember", 1, 1)
    assert min_member is not None
    timeout = _int_field(key, spec, "scheduleTimeoutSeconds", None, 0)
    return GroupSpec(
        key=key,
        min_member=min_member,
        min_resources=_min_resources(key, spec),
        schedule_timeout_seconds=timeout or None,
    )


def spec_from_volcano(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read a Volcano PodGroup's spec (minMember 0 or absent: every pod on its own)."""
    spec = _spec_object(key, spec)
    min_member = _int_field(key, spec, "minMember", 1, 0) or 1
    raw_tasks = spec.get("minTaskMember") or {}
    if not isinstance(raw_tasks, Mapping):
        raise PodGroupSpecError(f"PodGroup {key}: spec.minTaskMember must map task names to counts")
    tasks = []
    for task, count in sorted(raw_tasks.items()):
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise PodGroupSpecError(
                f"PodGroup {key}: spec.minTaskMember[{task}] must be an integer >= 0"
            )
        if count:
            tasks.append((str(task), count))
    queue = spec.get("queue")
    priority_class = spec.get("priorityClassName")
    policies = _topology(key, policies_from_volcano, spec)
    return GroupSpec(
        key=key,
        # Volcano's sub-group check needs minSubGroups x subGroupSize pods ready per policy:
        # the gang never starts (nor the gate binds) with fewer.
        min_member=max(min_member, sum(p.min_sub_groups * p.size for p in policies)),
        min_resources=_min_resources(key, spec),
        source=SOURCE_VOLCANO,
        topology=_topology(key, constraint_from_volcano, spec),
        min_task_member=tuple(tasks),
        sub_group_policy=policies,
        queue=queue if isinstance(queue, str) and queue else None,
        priority_class_name=priority_class if isinstance(priority_class, str) else None,
    )


def spec_from_native(key: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """Read a native PodGroup: `schedulingPolicy.gang.minCount`; the `basic` policy is no gang."""
    spec = _spec_object(key, spec)
    policy = spec.get("schedulingPolicy") or {}
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    topology = _topology(key, constraint_from_native, spec)
    if not isinstance(gang, Mapping):
        return GroupSpec(key=key, min_member=1, source=SOURCE_NATIVE, topology=topology)
    min_count = _int_field(key, gang, "minCount", None, 1)
    if min_count is None:
        raise PodGroupSpecError(f"PodGroup {key}: spec.schedulingPolicy.gang.minCount is required")
    priority_class = spec.get("priorityClassName")
    return GroupSpec(
        key=key,
        min_member=min_count,
        source=SOURCE_NATIVE,
        topology=topology,
        priority_class_name=priority_class if isinstance(priority_class, str) else None,
    )


def _topology(key: str, reader: Callable[[Mapping[str, Any]], _T], spec: Mapping[str, Any]) -> _T:
    try:
        return reader(spec)
    except TopologyError as err:
        raise PodGroupSpecError(f"PodGroup {key}: {err}") from None


SPEC_READERS = {
    SOURCE_XK8S: spec_from_podgroup,
    SOURCE_VOLCANO: spec_from_volcano,
    SOURCE_NATIVE: spec_from_native,
}
