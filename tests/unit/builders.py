"""Small builders of API objects (as dicts, the way the watch delivers them) and of a cluster."""

from __future__ import annotations

from typing import Any

from app.core.groups import LIGHT_MIN_AVAILABLE_LABEL, LIGHT_NAME_LABEL, POD_GROUP_LABEL, XK8S_API
from app.core.state import ClusterState


def pod(
    name: str,
    *,
    namespace: str = "default",
    group: str | None = None,
    light: tuple[str, str] | None = None,
    cpu: str = "1",
    memory: str = "1Gi",
    node: str = "",
    phase: str = "Pending",
    uid: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if group is not None:
        labels[POD_GROUP_LABEL] = group
    if light is not None:
        labels[LIGHT_NAME_LABEL], labels[LIGHT_MIN_AVAILABLE_LABEL] = light
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": labels,
        "resourceVersion": "1",
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node or None,
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
            ],
        },
        "status": {"phase": phase},
    }


def node(name: str, *, cpu: str = "4", memory: str = "8Gi", pods: str = "110") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods}},
    }


def podgroup(
    name: str,
    min_member: int,
    *,
    namespace: str = "default",
    min_resources: dict[str, str] | None = None,
    timeout: int | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if min_resources:
        spec["minResources"] = min_resources
    if timeout:
        spec["scheduleTimeoutSeconds"] = timeout
    return {
        "apiVersion": XK8S_API.api_version,
        "kind": XK8S_API.kind,
        "metadata": {"name": name, "namespace": namespace, "uid": f"pg-{name}"},
        "spec": spec,
    }


def cluster(members: int = 0) -> ClusterState:
    """Nodes n1 and n2 (4 CPUs each), and pods p0.. of group g in namespace default, unbound."""
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])
    for i in range(members):
        state.apply_pod(pod(f"p{i}", group="g"))
    return state
