"""Calls to the API server from the verbs: bind pods, read a pod, wake pending siblings.

The official client is synchronous, so each call runs on a small thread pool
and the event loop stays free for filter calls while a binding is in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from app.gate import BindError

log = logging.getLogger(__name__)

WAKEUP_ANNOTATION = "gang-extender.dev/wakeup"
"""Written on pending siblings to make kube-scheduler retry them (see app/wakeup.py)."""

_RETRIES = 3
_RETRY_DELAY_SECONDS = 0.2


class KubeApi:
    """The API calls of the verbs: bindings, pod reads, wake-up patches."""

    def __init__(
        self, core: k8s.CoreV1Api, executor: ThreadPoolExecutor, *, timeout_seconds: float = 10
    ) -> None:
        self._core = core
        self._executor = executor
        self._timeout = timeout_seconds

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        loop = asyncio.get_running_loop()
        for attempt in range(1, _RETRIES + 1):
            try:
                await loop.run_in_executor(
                    self._executor, self._bind_sync, namespace, name, uid, node
                )
                log.info(
                    "pod bound",
                    extra={"pod": f"{namespace}/{name}", "node": node, "verb": "bind"},
                )
                return
            except BindError as err:
                if err.reason != "transient" or attempt == _RETRIES:
                    raise
                await asyncio.sleep(_RETRY_DELAY_SECONDS * attempt)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET one pod as a dict (None if it does not exist): the watch cache may lag."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._read_pod_sync, namespace, name)

    def _read_pod_sync(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response: Any = self._core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=self._timeout
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise BindError(_reason_of(err), _message_of(err)) from None
        except (HTTPError, OSError) as err:
            raise BindError("transient", f"API server unreachable: {err}") from None
        try:
            pod: dict[str, Any] = json.loads(response.data)
            return pod
        finally:
            response.release_conn()

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        """Set the wake-up annotation: an update of a pending pod requeues it in kube-scheduler."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._touch_sync, namespace, name, uid, value)

    def _touch_sync(self, namespace: str, name: str, uid: str, value: str) -> None:
        # The uid precondition keeps us from touching a recreated pod of the same name.
        patch = {"metadata": {"uid": uid, "annotations": {WAKEUP_ANNOTATION: value}}}
        try:
            response: Any = self._core.patch_namespaced_pod(
                name,
                namespace,
                patch,
                _preload_content=False,
                _request_timeout=self._timeout,
                _content_type="application/merge-patch+json",
            )
            response.release_conn()
        except ApiException as err:
            if err.status in (404, 409, 422):
                return  # gone or recreated (uid mismatch): nothing to wake
            raise BindError(_reason_of(err), _message_of(err)) from None
        except (HTTPError, OSError) as err:
            raise BindError("transient", f"API server unreachable: {err}") from None

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a pod (graceful, uid-guarded): the rest of a gang evicted whole."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._evict_sync, namespace, name, uid)

    def _evict_sync(self, namespace: str, name: str, uid: str) -> None:
        body = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        try:
            response: Any = self._core.delete_namespaced_pod(
                name,
                namespace,
                body=body,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            response.release_conn()
        except ApiException as err:
            if err.status in (404, 409):
                return  # already gone, or a new pod reuses the name
            raise BindError(_reason_of(err), _message_of(err)) from None
        except (HTTPError, OSError) as err:
            raise BindError("transient", f"API server unreachable: {err}") from None

    def _bind_sync(self, namespace: str, name: str, uid: str, node: str) -> None:
        # metadata.uid makes the API server refuse to bind a different pod that
        # reuses the name (a StatefulSet member recreated while it waited).
        body = k8s.V1Binding(
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            # _preload_content=False: the client cannot deserialize the Status
            # the server answers with (a long-standing client bug).
            response: Any = self._core.create_namespaced_pod_binding(
                name,
                namespace,
                body,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            response.release_conn()
        except ApiException as err:
            raise BindError(_reason_of(err), _message_of(err)) from None
        except (HTTPError, OSError) as err:
            raise BindError("transient", f"API server unreachable: {err}") from None


def _reason_of(err: ApiException) -> str:
    status = err.status or 0
    if status == 404:
        return "not-found"
    if status == 409:
        return "conflict"
    if status in (401, 403):
        return "forbidden"
    if status == 429 or status >= 500:
        return "transient"
    return "rejected"


def _message_of(err: ApiException) -> str:
    try:
        message = json.loads(err.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"API server answered {err.status}: {message or err.reason}"
