"""GET /debug/caches: the watch caches as they are, to compare with a fresh list.

After a fault (API server restarted, watches answered 410 Gone, connections
cut) the caches must converge on what the API server holds. This dumps the
identity and version of every cached object, so a test or an operator can
diff them against `kubectl get -o json`. Read-only; served with /debug/gangs.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Response

from app.core.devices.report import device_snapshot
from app.core.state import ClusterState


def cache_snapshot(state: ClusterState) -> dict[str, Any]:
    """Pods, nodes, PodGroups and HyperNodes as the verbs see them (pure; unit-tested)."""
    return {
        "pods": {
            key: {
                "uid": pod.uid,
                "resourceVersion": pod.resource_version,
                "nodeName": pod.node_name,
                "phase": pod.phase,
            }
            for key, pod in sorted(state.pods.items())
        },
        "nodes": sorted(state.nodes),
        "podgroups": {key: record.uid for key, record in sorted(state.podgroups.items())},
        # Volcano HyperNodes in use (name -> tier), and those left out with why.
        "hypernodes": {name: h.tier for name, h in sorted(state.hypernodes.hypernodes.items())},
        "hypernode_errors": dict(sorted(state.hypernode_errors.items())),
        # DRA: device pools, devices per class (offered, taken, free, held in the gate).
        "devices": device_snapshot(state),
    }


def add_cache_route(app: FastAPI, state: ClusterState) -> None:
    @app.get("/debug/caches")
    async def debug_caches() -> Response:
        return Response(json.dumps(cache_snapshot(state)), media_type="application/json")
