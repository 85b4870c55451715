"""Fake nodes: Node objects that look kubelet-managed and Ready, with no kubelet."""

from __future__ import annotations

import datetime as dt
import platform
from dataclasses import dataclass, field
from typing import Any

from .api import Api, message
from .report import ClusterError, info

# The label that marks a node as ours (the pod simulator plays only their kubelet).
FAKE_NODE_LABEL = ("type", "fake-node")


@dataclass(frozen=True)
class NodeShape:
    """Resources and extra labels of a fake node."""

    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)


def _go_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def create_fake_node(api: Api, name: str, shape: NodeShape, kube_version: str) -> None:
    """Register a Node object that looks like a healthy kubelet-managed node.

    Status is written through the status subresource, as a kubelet does,
    so the scheduler sees the same fields a real node reports.
    """
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        FAKE_NODE_LABEL[0]: FAKE_NODE_LABEL[1],
    }
    labels.update(shape.labels)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
    }
    status, body = api.request("POST", "/api/v1/nodes", node)
    if status == 409:
        raise ClusterError(f"node {name} already exists")
    if status != 201:
        raise ClusterError(f"creating node {name} failed: HTTP {status}: {message(body)}")
    if (body or {}).get("spec", {}).get("taints"):
        # Defensive: an admission plugin tainted the node; nothing would lift it.
        status, body = api.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"spec": {"taints": None}},
            "application/merge-patch+json",
        )
        if status != 200:
            raise ClusterError(
                f"removing taints from node {name} failed: HTTP {status}: {message(body)}"
            )
    set_fake_node_status(api, name, shape, kube_version)


def set_fake_node_status(api: Api, name: str, shape: NodeShape, kube_version: str) -> None:
    """Capacity/allocatable from the shape, Ready=True, no pressure conditions."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": shape.cpu, "memory": shape.memory, "pods": str(shape.pods)}

    def condition(ctype: str, value: str, reason: str, note: str) -> dict[str, str]:
        return {
            "type": ctype,
            "status": value,
            "reason": reason,
            "message": note,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    node_status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "fake node"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "fake node"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "fake node"),
                condition(
                    "Ready", "True", "KubeletReady", "fake node registered by hack/local-cluster"
                ),
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "fake",
                "containerRuntimeVersion": "fake://0",
                "kubeletVersion": kube_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": _go_arch(),
            },
        }
    }
    status, body = api.request(
        "PATCH", f"/api/v1/nodes/{name}/status", node_status, "application/merge-patch+json"
    )
    if status != 200:
        raise ClusterError(f"setting status of node {name} failed: HTTP {status}: {message(body)}")


def node_counts(api: Api) -> tuple[int, int]:
    """(Ready nodes, all nodes)."""
    status, body = api.request("GET", "/api/v1/nodes")
    if status != 200:
        raise ClusterError(f"listing nodes failed: HTTP {status}: {message(body)}")
    items = body.get("items", [])
    return sum(1 for n in items if is_ready(n)), len(items)


def is_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ensure_nodes(api: Api, count: int, shape: NodeShape, kube_version: str) -> None:
    """Create node-1..node-N if missing; existing (or extra) nodes are left as they are.

    The one repair: a fake node whose status was never written (an `up`
    interrupted between create and status) gets its status now.
    """
    created = []
    for i in range(1, count + 1):
        name = f"node-{i}"
        status, body = api.request("GET", f"/api/v1/nodes/{name}")
        if status == 200:
            labels = body.get("metadata", {}).get("labels") or {}
            if labels.get(FAKE_NODE_LABEL[0]) == FAKE_NODE_LABEL[1] and not is_ready(body):
                set_fake_node_status(api, name, shape, kube_version)
                info(f"repaired status of fake node {name}")
            continue
        if status != 404:
            raise ClusterError(f"reading node {name} failed: HTTP {status}: {message(body)}")
        create_fake_node(api, name, shape, kube_version)
        created.append(name)
    if created:
        info(
            f"created fake node(s) {', '.join(created)} "
            f"(cpu={shape.cpu}, memory={shape.memory}, pods={shape.pods})"
        )
