"""The extender wire format, exactly as kube-scheduler (kube-scheduler/extender/v1) speaks it.

The Go types carry no json tags, so fields arrive with their Go names
("Pod", "NodeNames") and Go's encoding/json matches keys case-insensitively;
older releases used lower-case tags ("nodenames", "nodeToVictims"). Requests
are read with the same tolerance; answers always use the Go names. Embedded
Pods and Nodes are plain Kubernetes JSON, kept as dicts (no model classes:
decoding thousands of nodes into objects per call would dominate the verb).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from app.core.preemption.victims import VictimCandidate


class WireError(ValueError):
    """The request body is not what kube-scheduler sends; answered with HTTP 400."""


def _decode(body: bytes) -> dict[str, str | Any]:
    try:
        # orjson: a filter body carries the whole Pod and every node name, and
        # kube-scheduler sends one per pod; the stdlib decoder was most of the verb.
        data = orjson.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise WireError(f"request body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise WireError("request body must be a JSON object")
    # Go's encoding/json matches field names case-insensitively.
    return {k.lower(): v for k, v in data.items()}


def _field(data: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = data.get(name.lower())
        if value is not None:
            return value
    return None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WireError(f"{what} must be a JSON object")
    return value


def _string(value: Any, what: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise WireError(f"{what} must be a non-empty string")
    return value


def _pod(data: Mapping[str, Any]) -> dict[str, Any]:
    """The embedded Pod, with the type of every field the verbs read checked.

    The API server guarantees these shapes for real pods; checking them here
    turns a hand-made or corrupted request into a 400 that names the field,
    instead of an exception deep in the admission code.
    """
    pod = _object(_field(data, "Pod"), "Pod")
    meta = _object(pod.get("metadata"), "Pod.metadata")
    _string(meta.get("name"), "Pod.metadata.name")
    for name in ("namespace", "uid"):
        _string(meta.get(name), f"Pod.metadata.{name}", required=False)
    labels = meta.get("labels")
    if labels is not None and not (
        isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())
    ):
        raise WireError("Pod.metadata.labels must map label names to strings")
    annotations = meta.get("annotations")
    if annotations is not None and not (
        isinstance(annotations, dict) and all(isinstance(v, str) for v in annotations.values())
    ):
        raise WireError("Pod.metadata.annotations must map annotation names to strings")
    spec = pod.get("spec")
    if spec is None:
        return pod
    spec = _object(spec, "Pod.spec")
    group = spec.get("schedulingGroup")
    if group is not None:
        _string(
            _object(group, "Pod.spec.schedulingGroup").get("podGroupName"),
            "Pod.spec.schedulingGroup.podGroupName",
            required=False,
        )
    priority = spec.get("priority")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise WireError("Pod.spec.priority must be an integer")
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise WireError(f"Pod.spec.{kind} must be a list")
        for container in containers:
            resources = _object(container, f"Pod.spec.{kind}[]").get("resources")
            if resources is None:
                continue
            for part in ("requests", "limits"):
                value = _object(resources, f"Pod.spec.{kind}[].resources").get(part)
                if value is not None:
                    _object(value, f"Pod.spec.{kind}[].resources.{part}")
    if spec.get("overhead") is not None:
        _object(spec["overhead"], "Pod.spec.overhead")
    return pod


def _node(node: dict[str, Any]) -> None:
    """Check the fields of an embedded Node that prioritize reads (full-Node mode)."""
    meta = _object(node.get("metadata"), "Nodes.items[].metadata")
    _string(meta.get("name"), "Nodes.items[].metadata.name")
    labels = meta.get("labels")
    if labels is not None and not (
        isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())
    ):
        raise WireError("Nodes.items[].metadata.labels must map label names to strings")
    if node.get("spec") is not None:
        _object(node["spec"], "Nodes.items[].spec")
    status = node.get("status")
    if status is not None:
        status = _object(status, "Nodes.items[].status")
        for part in ("allocatable", "capacity"):
            if status.get(part) is not None:
                _object(status[part], f"Nodes.items[].status.{part}")


# ---- filter / prioritize -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: dict[str, Any]
    # nodeCacheCapable: true -> names only; false -> full Node objects.
    node_names: list[str] | None
    nodes: list[dict[str, Any]] | None

    @property
    def names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [(n.get("metadata") or {}).get("name", "") for n in self.nodes or ()]


def parse_extender_args(body: bytes) -> ExtenderArgs:
    data = _decode(body)
    pod = _pod(data)
    raw_names = _field(data, "NodeNames")
    names: list[str] | None = None
    if raw_names is not None:
        if not isinstance(raw_names, list) or not _all_str(raw_names):
            raise WireError("NodeNames must be a list of node names")
        names = raw_names
    raw_nodes = _field(data, "Nodes")
    nodes: list[dict[str, Any]] | None = None
    if raw_nodes is not None:
        items = _object(raw_nodes, "Nodes").get("items") or []
        if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
            raise WireError("Nodes.items must be a list of Node objects")
        for node in items:
            _node(node)
        nodes = items
    if names is None and nodes is None:
        raise WireError(
            "neither NodeNames nor Nodes is set: kube-scheduler sends NodeNames when "
            "nodeCacheCapable is true and Nodes otherwise"
        )
    return ExtenderArgs(pod=pod, node_names=names, nodes=nodes)


def _all_str(items: list[Any]) -> bool:
    """Whether every item is a str: str.join checks each in C, without hashing or calls.

    A filter call names thousands of nodes; a type check per name in Python,
    or a set of their types, cost a filter at 5,000 nodes 40 µs more.
    """
    try:
        "".join(items)
    except TypeError:
        return False
    return True


class ExtenderArgsReader:
    """parse_extender_args, remembering the last body it read.

    For every pod kube-scheduler sends filter, then prioritize with the nodes
    the filter kept, in the order it kept them: when every node passed (a
    pod in no gang, an admitted member) the two bodies are the same bytes,
    and decoding the Pod and hundreds of node names again was most of the
    prioritize call. A different body is read afresh. The arguments it hands
    out are shared between the calls: the verbs only read them.
    """

    def __init__(self) -> None:
        self._body = b""
        self._args: ExtenderArgs | None = None

    def __call__(self, body: bytes) -> ExtenderArgs:
        if self._args is not None and body == self._body:
            return self._args
        args = parse_extender_args(body)
        self._body, self._args = body, args
        return args


def filter_result(
    args: ExtenderArgs,
    passed: list[str],
    failed: Mapping[str, str],
    failed_unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult, answering in the same mode the request came in."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(failed_unresolvable),
        "Error": error,
    }
    if args.node_names is not None:
        result["NodeNames"] = passed
    else:
        keep = set(passed)
        result["Nodes"] = {
            "metadata": {},
            "items": [n for n in args.nodes or () if n["metadata"]["name"] in keep],
        }
    return result


def host_priorities(scores: Mapping[str, int]) -> list[dict[str, Any]]:
    """HostPriorityList: [{"Host": name, "Score": 1..10}].

    Zero scores are left out: kube-scheduler adds nothing for a node the list
    does not name, and on a large, mostly empty cluster most binpack scores
    are 0, so the answer (which it decodes for every pod) stays small.
    """
    return [{"Host": host, "Score": score} for host, score in scores.items() if score]


# ---- preempt ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreemptArgs:
    pod: dict[str, Any]
    candidates: list[VictimCandidate]


def parse_preempt_args(body: bytes) -> PreemptArgs:
    data = _decode(body)
    pod = _pod(data)
    candidates: list[VictimCandidate] = []
    meta = _field(data, "NodeNameToMetaVictims")
    full = _field(data, "NodeNameToVictims", "nodeToVictims")
    source, what = (
        (meta, "NodeNameToMetaVictims")
        if meta is not None
        else (
            full,
            "NodeNameToVictims",
        )
    )
    for node, raw_victims in _object(source or {}, what).items():
        where = f"{what}[{node}]"
        victims = {str(k).lower(): v for k, v in _object(raw_victims, where).items()}
        pods = victims.get("pods") or []
        if not isinstance(pods, list):
            raise WireError(f"{where}.Pods must be a list")
        uids = [_victim_uid(victim, where, meta=meta is not None) for victim in pods]
        violations = victims.get("numpdbviolations") or 0
        if not isinstance(violations, int):
            raise WireError(f"{where}.NumPDBViolations must be an integer")
        candidates.append(VictimCandidate(str(node), uids, violations))
    return PreemptArgs(pod=pod, candidates=candidates)


def _victim_uid(victim: Any, where: str, *, meta: bool) -> str:
    """A victim's UID: {"UID": ...} in meta victims, metadata.uid in full Pods.

    Hundreds of candidates with their victims come in one call, so the
    usual spelling is read first and no message is formatted unless needed.
    """
    if not isinstance(victim, dict):
        raise WireError(f"{where}.Pods[] must be a JSON object")
    if meta:
        uid = victim.get("UID")
        if uid is None:  # Go matches field names case-insensitively
            uid = {str(k).lower(): v for k, v in victim.items()}.get("uid")
    else:
        uid = _object(victim.get("metadata") or {}, f"{where}.Pods[].metadata").get("uid")
    if not isinstance(uid, str) or not uid:
        raise WireError(f"{where}.Pods[] UID must be a non-empty string")
    return uid


def preempt_result(candidates: list[VictimCandidate]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always NodeNameToMetaVictims."""
    return {
        "NodeNameToMetaVictims": {
            c.node: {
                "Pods": [{"UID": uid} for uid in c.victim_uids],
                "NumPDBViolations": c.num_pdb_violations,
            }
            for c in candidates
        }
    }


# ---- bind ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def pod_key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def parse_binding_args(body: bytes) -> BindingArgs:
    data = _decode(body)
    return BindingArgs(
        pod_name=_string(_field(data, "PodName"), "PodName"),
        pod_namespace=_string(_field(data, "PodNamespace"), "PodNamespace"),
        pod_uid=_string(_field(data, "PodUID"), "PodUID", required=False),
        node=_string(_field(data, "Node"), "Node"),
    )


def binding_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}
