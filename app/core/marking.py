"""The member mark: the extended resource that makes kube-scheduler call us for gang members only.

In the gang-only deployment mode (docs/deployment-modes.md) kube-scheduler
calls the filter, prioritize and bind verbs only for pods that request the
managed resource MEMBER_RESOURCE (`HTTPExtender.IsInterested`), so every pod
of a group must carry it. The admission webhook (app/web/webhook.py) adds it to
each container of a pod that names a group, from any group source;
this module decides which pods and builds the JSONPatch. Everything here is
pure: pods in, patch operations and AdmissionReview answers out.

A plain pod that may evict others (`can_preempt`) gets PREEMPTOR_RESOURCE,
which the preempt-only extender entry names: without managedResources
kube-scheduler considers that entry "interested" in every pod and does work
proportional to the feasible nodes for it on every scheduling cycle, verb or
not (docs/deployment-modes.md, BENCHMARKS.md). That mark is not the
webhook's: a MutatingAdmissionPolicy adds it inside the API server
(`preemptor_mutation`), so no pod escapes it because this process is down.

With --hold-waiting-gangs the webhook also gives each member that cannot
preempt the scheduling gate LINE_GATE (`hold_patch`): kube-scheduler then
does not try the member at all until the extender removes the gate, which it
does once the gang can be admitted as a whole (app/runtime/holds.py). A gang
waiting in a long line then costs kube-scheduler nothing; without the gate,
every pod the extender turns away is retried on every cluster event
(kube-scheduler's "Extender" pseudo-plugin has no queueing hints).

A pod that names a group through a source the extender has switched off is
marked too: it then reaches the verbs as an ordinary pod (a few round trips),
and the ValidatingAdmissionPolicy that refuses unmarked members
(`member_expression`) stays a simple statement about labels, annotations and
spec that needs no knowledge of the extender's flags.
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson

from app.core.groups import (
    KUEUE_GROUP_LABEL,
    LIGHT_NAME_LABEL,
    POD_GROUP_LABEL,
    VOLCANO_GROUP_ANNOTATIONS,
)
from app.core.kai import (
    KAI_GROUP_ANNOTATION,
)

# Extended resource names need a domain that is not kubernetes.io; this
# project's annotations already live under gang-extender.dev.
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE
from app.core.yunikorn import TASK_GROUP_NAME_ANNOTATION, TASK_GROUPS_ANNOTATION

# The annotations that name a group (Volcano, KAI, YuniKorn task groups): each marks a pod.
GROUP_ANNOTATIONS = (
    *VOLCANO_GROUP_ANNOTATIONS,
    KAI_GROUP_ANNOTATION,
    TASK_GROUPS_ANNOTATION,
    TASK_GROUP_NAME_ANNOTATION,
)

# Zero: kube-scheduler's IsInterested() looks only for the name, and
# NodeResourcesFit skips a zero request before anything else, where a
# request of 1 cost a regular expression (IsExtendedResourceName) per node
# per member: 11-14% of kube-scheduler's CPU for gangs at 2,000 nodes
# (BENCHMARKS.md "Issue 20, 2026-11-26"). Nothing counts it: not a node's
# capacity, not a ResourceQuota, not the kubelet.
MEMBER_QUANTITY = "0"

# The scheduling gate holding a gang member out of kube-scheduler's queue while its gang
# waits in line (--hold-waiting-gangs); the extender removes it (app/runtime/holds.py).
LINE_GATE = "gang-extender.dev/line"

JsonPatch = list[dict[str, Any]]

# The member-mark webhook's default namespaceSelector leaves these out (the
# chart's webhook.excludedNamespaces; tests compare).
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})


def names_a_group(pod: Mapping[str, Any], member_labels: Collection[str] = ()) -> bool:
    """Whether the pod names a group through any source, usable or not.

    member_labels: labels of opt-in sources that also make a pod a member
    (LeaderWorkerSet's name label with --lws-gangs on).

    Deliberately broader than app.core.groups.group_ref_of_pod: an empty label
    (which the filter refuses with a message) still marks the pod, so it
    reaches the filter that explains what is wrong instead of being bound
    by kube-scheduler's own binder.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if any(label in labels for label in (POD_GROUP_LABEL, LIGHT_NAME_LABEL, KUEUE_GROUP_LABEL)):
        return True
    if any(label in labels for label in member_labels):
        return True
    if any(annotation in annotations for annotation in GROUP_ANNOTATIONS):
        return True
    group = (pod.get("spec") or {}).get("schedulingGroup")
    return isinstance(group, Mapping) and bool(group.get("podGroupName"))


def is_marked(pod: Mapping[str, Any], resource: str = MEMBER_RESOURCE) -> bool:
    """Whether kube-scheduler's IsInterested() would be true for a pod managing `resource`.

    True when any container or init container requests or limits it (exactly
    what kube-scheduler looks at; ephemeral containers and pod-level
    resources are not).
    """
    spec = pod.get("spec") or {}
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or ():
            resources = container.get("resources") or {}
            if resource in (resources.get("requests") or {}) or resource in (
                resources.get("limits") or {}
            ):
                return True
    return False


def can_preempt(pod: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler may evict other pods to place this one.

    Priority above zero and a preemptionPolicy other than Never (the API
    server's Priority admission plugin fills in both before any webhook
    runs). A pod of priority zero or less can only evict pods of negative
    priority: gangs that run at zero or above are safe from it, which is the
    guarantee docs/deployment-modes.md states for this mark.
    """
    spec = pod.get("spec") or {}
    if spec.get("preemptionPolicy") == "Never":
        return False
    priority = spec.get("priority")
    return isinstance(priority, int) and priority > 0


def _ours(pod: Mapping[str, Any], scheduler_names: Collection[str]) -> bool:
    """Whether the pod names one of our schedulers; empty `scheduler_names`: every one.

    Another scheduler would count the resource in NodeResourcesFit (it is
    only ignored where an extender declares it `ignoredByScheduler`).
    """
    if not scheduler_names:
        return True
    name = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
    return name in scheduler_names


def needs_member_mark(
    pod: Mapping[str, Any], scheduler_names: Collection[str], member_labels: Collection[str] = ()
) -> bool:
    """Whether the webhook marks this pod: a pod of a group, of one of our schedulers.

    An empty `scheduler_names` means every scheduler, as on the local
    control plane.
    """
    return _ours(pod, scheduler_names) and names_a_group(pod, member_labels)


def _pointer(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901): `~` and `/` escaped."""
    return token.replace("~", "~0").replace("/", "~1")


def member_patch(pod: Mapping[str, Any], resource: str = MEMBER_RESOURCE) -> JsonPatch:
    """JSONPatch operations giving every app container `resource: "0"` in requests and limits.

    `resource`: the member mark, or the preemptor mark to build a pod as the
    preemptor-mark policy (preemptor_mutation) leaves it; both are zero.

    Idempotent: a container that already requests and limits exactly
    MEMBER_QUANTITY gets no operation, so marking a marked pod returns [].
    Another amount is set to it (an extended resource's request must equal
    its limit). Only `spec.containers`: one container
    is enough for IsInterested(), and init containers' requests would only
    add to the pod's effective requests elsewhere.
    """
    ops: JsonPatch = []
    containers: Sequence[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or ()
    key = _pointer(resource)
    for index, container in enumerate(containers):
        base = f"/spec/containers/{index}/resources"
        resources = container.get("resources")
        if not isinstance(resources, Mapping):
            ops.append(
                {
                    "op": "add",
                    "path": base,
                    "value": {
                        "requests": {resource: MEMBER_QUANTITY},
                        "limits": {resource: MEMBER_QUANTITY},
                    },
                }
            )
            continue
        for part in ("requests", "limits"):
            values = resources.get(part)
            if not isinstance(values, Mapping):
                ops.append(
                    {"op": "add", "path": f"{base}/{part}", "value": {resource: MEMBER_QUANTITY}}
                )
            elif str(values.get(resource)) != MEMBER_QUANTITY:
                # "add" on an existing member replaces it (RFC 6902 4.1).
                ops.append({"op": "add", "path": f"{base}/{part}/{key}", "value": MEMBER_QUANTITY})
    return ops


def holds(pod: Mapping[str, Any]) -> bool:
    """Whether a member gets LINE_GATE (with --hold-waiting-gangs).

    Members that may preempt too: kube-scheduler's dry run never tries a gated pod,
    so the extender starts a held gang's preemption itself, when its plan finds
    victims (app/runtime/holds.py); kept in kube-scheduler's queue instead, a
    high-priority gang that cannot fit even with evictions is retried on every
    cluster event and keeps lower-priority pods from being tried at all (issue
    49's soak). A pod created bound (spec.nodeName) may not carry gates (the API
    server refuses it), and one that has ours already keeps it.
    """
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return False
    gates = spec.get("schedulingGates")
    return not isinstance(gates, list) or all(
        not isinstance(g, Mapping) or g.get("name") != LINE_GATE for g in gates
    )


def hold_patch(pod: Mapping[str, Any]) -> JsonPatch:
    """The JSONPatch operation adding LINE_GATE to the pod's scheduling gates."""
    gate = {"name": LINE_GATE}
    if isinstance((pod.get("spec") or {}).get("schedulingGates"), list):
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]


def review_response(
    review: Mapping[str, Any],
    scheduler_names: Collection[str] = (),
    member_labels: Collection[str] = (),
    hold: bool = False,
) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answer to a pod CREATE review, and what was done.

    Always allowed (the webhook marks, it never refuses: refusing unmarked
    members is the ValidatingAdmissionPolicy's job, which runs even when this
    process does not). The second value is the metric label: `marked` (a
    member), `held` (a member marked and given LINE_GATE: `hold`, see holds()),
    `unchanged` (already marked), `skipped` (no member, or not of our
    schedulers) or `invalid` (no pod in the request).
    """
    request = review.get("request") or {}
    uid = request.get("uid") or ""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    answer = {
        "apiVersion": review.get("apiVersion") or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }
    pod = request.get("object")
    if not isinstance(pod, Mapping) or request.get("operation", "CREATE") != "CREATE":
        return answer, "invalid"
    if not needs_member_mark(pod, scheduler_names, member_labels):
        return answer, "skipped"
    ops = member_patch(pod)
    # Not a LeaderWorkerSet's pod (member_labels): LWS creates the workers only once the
    # leader has a node, so a held leader would hold its group back for good.
    labels = (pod.get("metadata") or {}).get("labels") or {}
    held = hold and holds(pod) and not any(label in labels for label in member_labels)
    if held:
        ops += hold_patch(pod)
    if not ops:
        return answer, "unchanged"
    response["patchType"] = "JSONPatch"
    response["patch"] = base64.b64encode(orjson.dumps(ops)).decode()
    return answer, "held" if held else "marked"


def member_expression(
    resource: str = MEMBER_RESOURCE, member_labels: Sequence[str] = ()
) -> dict[str, str]:
    """CEL of the ValidatingAdmissionPolicy that refuses gang members without the mark.

    `isMember` mirrors names_a_group(), `isMarked` mirrors is_marked() for
    app and init containers, on the pod being written. `valid` is the
    policy's validation: a member must be marked, except an UPDATE of a pod
    that was a member already (one created before the policy existed keeps
    working); so a pod created plain cannot join a group later by a label
    or annotation change (container resources are immutable, the webhook
    cannot mark it then). The chart and hack/local-cluster carry the same
    expressions (tests/unit/test_marking.py and tests/packaging compare them
    with these; the cluster tests run them in the real kube-apiserver).
    member_labels: the opt-in sources' labels (the chart's groupSources.lws "on" adds
    LeaderWorkerSet's name label), after the others.
    """

    def member(obj: str) -> str:
        def label(key: str) -> str:
            return f"(has({obj}.metadata.labels) && '{key}' in {obj}.metadata.labels)"

        def annotation(key: str) -> str:
            return f"(has({obj}.metadata.annotations) && '{key}' in {obj}.metadata.annotations)"

        return " || ".join(
            [
                label(POD_GROUP_LABEL),
                label(LIGHT_NAME_LABEL),
                label(KUEUE_GROUP_LABEL),
                *(annotation(a) for a in GROUP_ANNOTATIONS),
                f"(has({obj}.spec.schedulingGroup) && has({obj}.spec.schedulingGroup.podGroupName)"
                f" && {obj}.spec.schedulingGroup.podGroupName != '')",
                *(label(key) for key in member_labels),
            ]
        )

    def marked(kind: str) -> str:
        return (
            f"(has(object.spec.{kind}) && object.spec.{kind}.exists(c, has(c.resources) && ("
            f"(has(c.resources.requests) && '{resource}' in c.resources.requests) || "
            f"(has(c.resources.limits) && '{resource}' in c.resources.limits))))"
        )

    is_marked = f"{marked('containers')} || {marked('initContainers')}"
    return {
        "isMember": member("object"),
        "isMarked": is_marked,
        "valid": f"{is_marked} || (request.operation == 'UPDATE' && ({member('oldObject')}))",
    }


def preemptor_expression() -> str:
    """CEL mirroring can_preempt(): which pods the preemptor-mark policy marks.

    One of the MutatingAdmissionPolicy's matchConditions in the chart and in
    deploy/webhook.yaml (tests compare the text); the others leave out gang
    members (their own entry preempts; a second mark would have
    kube-scheduler ask twice), pods bound already (mirror pods) and pods of
    other schedulers.
    """
    return (
        "has(object.spec.priority) && object.spec.priority > 0 && "
        "(!has(object.spec.preemptionPolicy) || object.spec.preemptionPolicy != 'Never')"
    )


def preemptor_mutation(resource: str = PREEMPTOR_RESOURCE) -> str:
    """CEL of the policy's mutation: `resource: "0"` in every app container's requests and limits.

    An apply configuration, merged by the API server like a server-side
    apply: containers by name, requests and limits by key, so nothing else
    in the pod changes (member_patch does the same for the webhook).
    """
    quantity = f"{{'{resource}': '{MEMBER_QUANTITY}'}}"
    return (
        "Object{spec: Object.spec{containers: object.spec.containers.map(c, "
        "Object.spec.containers{name: c.name, resources: Object.spec.containers.resources{"
        f"requests: {quantity}, limits: {quantity}}}}})}}}}"
    )


def refusal_message(resource: str = MEMBER_RESOURCE) -> str:
    """What a refused pod's creator sees (a controller's FailedCreate event, kubectl's error)."""
    return (
        f"gang member without the {resource} resource: gang-extender's admission webhook did "
        "not mark this pod (is the extender running and its MutatingWebhookConfiguration "
        "registered?), and an unmarked member would be bound by kube-scheduler without the "
        "gang gate; create the pod again once the webhook answers (controllers retry on their "
        "own). A pod cannot join a group after its creation either: create it with the group's "
        "label, annotation or schedulingGroup"
    )
