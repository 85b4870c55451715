"""The verbs' pod calls: bind pods, read a pod, wake or evict pods.

Requests run on the event loop (app/kube/http.py: no thread competes with
the loop for the GIL while a binding is in flight). Failures raise ApiError (app/kube/errors.py);
answers that mean "nothing to do" (the pod is gone, or a new pod reuses the
name) do not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

import orjson

from app.core.marking import LINE_GATE
from app.kube.errors import ApiError, Conflict, Invalid, NotFound, Transient
from app.kube.http import Requests

log = logging.getLogger(__name__)

WAKEUP_ANNOTATION = "gang-extender.dev/wakeup"
"""Written on pending siblings to make kube-scheduler retry them (see app/runtime/wakeup.py)."""

_RETRIES = 3
_RETRY_DELAY_SECONDS = 0.2


class PodApi:
    """The verbs' pod calls: bindings, reads, wake-up and nomination patches, evictions."""

    def __init__(self, requests: Requests, *, timeout_seconds: float = 10) -> None:
        self._requests = requests
        self._timeout = timeout_seconds

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create pods/binding, as kube-scheduler's DefaultBinder does; retry transient errors."""
        # metadata.uid makes the API server refuse to bind a different pod that
        # reuses the name (a StatefulSet member recreated while it waited).
        meta = {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})}
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        for attempt in range(1, _RETRIES + 1):
            try:
                await self._run("POST", _pod_path(namespace, name, "/binding"), body)
            except Conflict:
                # A retry after an answer that was lost (the API server restarting)
                # finds the binding made: the pod is where we meant it, not a failure
                # that would roll back its gang's bound members (soak seed 4, issue 49).
                if await self._bound_to(namespace, name, uid, node):
                    break
                raise
            except Transient:
                if attempt < _RETRIES:
                    await asyncio.sleep(_RETRY_DELAY_SECONDS * attempt)
                    continue
                if await self._bound_to(namespace, name, uid, node):
                    break
                raise
            else:
                break
        # Debug: one JSON line per pod was 6% of the extender's time under a
        # stream of plain pods; a gang's binding is logged once (app/runtime/gate.py).
        log.debug("pod bound", extra={"pod": f"{namespace}/{name}", "node": node, "verb": "bind"})

    async def _bound_to(self, namespace: str, name: str, uid: str, node: str) -> bool:
        """Whether this pod (this uid) is bound to `node` now.

        A binding refused as a conflict, or never answered, may have been made
        by an earlier attempt whose answer was lost on the way back.
        """
        for attempt in range(1, _RETRIES + 1):
            try:
                pod = await self.read_pod(namespace, name)
            except Transient:
                if attempt == _RETRIES:
                    return False
                await asyncio.sleep(_RETRY_DELAY_SECONDS * attempt)
                continue
            if pod is None:
                return False
            same_pod = not uid or (pod.get("metadata") or {}).get("uid") == uid
            return same_pod and (pod.get("spec") or {}).get("nodeName") == node
        return False

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET one pod as a dict (None if it does not exist): the watch cache may lag."""
        data = await self._run("GET", _pod_path(namespace, name), absent=(NotFound,))
        return orjson.loads(data) if data is not None else None

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        """Set the wake-up annotation: an update of a pending pod requeues it in kube-scheduler."""
        # The uid in the patch keeps us from touching a recreated pod of the same name.
        patch = {"metadata": {"uid": uid, "annotations": {WAKEUP_ANNOTATION: value}}}
        await self._run(
            "PATCH",
            _pod_path(namespace, name),
            patch,
            absent=(NotFound, Conflict, Invalid),
            content_type="application/merge-patch+json",
        )

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Set (or, with node "", remove) status.nominatedNodeName of a pending pod.

        kube-scheduler's filters count a nominated pod's requests on its node
        for every pod of no higher priority (app/runtime/preemption/nominations.py).
        """
        patch = {"metadata": {"uid": uid}, "status": {"nominatedNodeName": node or None}}
        await self._run(
            "PATCH",
            _pod_path(namespace, name, "/status"),
            patch,
            absent=(NotFound, Conflict, Invalid),
            content_type="application/merge-patch+json",
        )

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        """Remove the line's scheduling gate: kube-scheduler takes the pod into its queue now.

        A strategic merge patch deletes the one gate by name (the list is keyed by
        name), so other controllers' gates stay; the uid guards a recreated pod.
        """
        patch = {
            "metadata": {"uid": uid},
            "spec": {"schedulingGates": [{"$patch": "delete", "name": LINE_GATE}]},
        }
        await self._run(
            "PATCH",
            _pod_path(namespace, name),
            patch,
            absent=(NotFound, Conflict, Invalid),
            content_type="application/strategic-merge-patch+json",
        )

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a pod (graceful, uid-guarded): the rest of a gang evicted whole."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._run("DELETE", _pod_path(namespace, name), body, absent=(NotFound, Conflict))

    async def evict_through_api(
        self, namespace: str, name: str, uid: str, *, dry_run: bool = False
    ) -> None:
        """POST pods/eviction (policy/v1): the API server honours PodDisruptionBudgets.

        A budget that allows no disruption now answers 429, raised as
        Transient; the pod being gone already is nothing to do. `dry_run`:
        only ask whether the eviction would be allowed now (the budgets are
        checked, nothing is deleted or counted).
        """
        options: dict[str, Any] = {"preconditions": {"uid": uid}}
        if dry_run:
            options["dryRun"] = ["All"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": options,
        }
        await self._run(
            "POST", _pod_path(namespace, name, "/eviction"), body, absent=(NotFound, Conflict)
        )

    async def _run(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        absent: tuple[type[ApiError], ...] = (),
        content_type: str = "application/json",
    ) -> bytes | None:
        """One request; None when it failed with one of the `absent` errors."""
        try:
            return await self._requests.request(
                method, path, body, content_type=content_type, timeout_seconds=self._timeout
            )
        except absent:
            return None  # gone, or a new pod reuses the name: nothing to do


def _pod_path(namespace: str, name: str, subresource: str = "") -> str:
    return (
        f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}{subresource}"
    )
