"""Calls to the API server from the verbs: bind pods, read a pod, wake or evict pods.

The official client is synchronous, so each call runs on a small thread pool
and the event loop stays free for filter calls while a binding is in flight.
Every call goes through `_request`, which maps failures to BindError with a
short reason (a metric label) and a message a user can act on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
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
    """The API calls of the verbs: bindings, pod reads, wake-up patches, evictions."""

    def __init__(
        self, core: k8s.CoreV1Api, executor: ThreadPoolExecutor, *, timeout_seconds: float = 10
    ) -> None:
        self._core = core
        self._executor = executor
        self._timeout = timeout_seconds

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create pods/binding, as kube-scheduler's DefaultBinder does; retry transient errors."""
        # metadata.uid makes the API server refuse to bind a different pod that
        # reuses the name (a StatefulSet member recreated while it waited).
        body = k8s.V1Binding(
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        for attempt in range(1, _RETRIES + 1):
            try:
                # Raw response: the client cannot deserialize the Status the
                # server answers with (a long-standing client bug).
                await self._run(self._core.create_namespaced_pod_binding, name, namespace, body)
                log.info(
                    "pod bound", extra={"pod": f"{namespace}/{name}", "node": node, "verb": "bind"}
                )
                return
            except BindError as err:
                if err.reason != "transient" or attempt == _RETRIES:
                    raise
                await asyncio.sleep(_RETRY_DELAY_SECONDS * attempt)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET one pod as a dict (None if it does not exist): the watch cache may lag."""
        data = await self._run(self._core.read_namespaced_pod, name, namespace, absent=(404,))
        return json.loads(data) if data is not None else None

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        """Set the wake-up annotation: an update of a pending pod requeues it in kube-scheduler."""
        # The uid in the patch keeps us from touching a recreated pod of the same name.
        patch = {"metadata": {"uid": uid, "annotations": {WAKEUP_ANNOTATION: value}}}
        await self._run(
            self._core.patch_namespaced_pod,
            name,
            namespace,
            patch,
            absent=(404, 409, 422),
            _content_type="application/merge-patch+json",
        )

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a pod (graceful, uid-guarded): the rest of a gang evicted whole."""
        body = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        await self._run(
            self._core.delete_namespaced_pod, name, namespace, body=body, absent=(404, 409)
        )

    async def _run(
        self, call: Callable[..., Any], *args: Any, absent: tuple[int, ...] = (), **kwargs: Any
    ) -> bytes | None:
        """Run a client call on the pool; None when it answered one of the `absent` codes."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, lambda: self._request(call, args, kwargs, absent)
        )

    def _request(
        self,
        call: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        absent: tuple[int, ...],
    ) -> bytes | None:
        try:
            response = call(*args, _preload_content=False, _request_timeout=self._timeout, **kwargs)
        except ApiException as err:
            if err.status in absent:
                return None  # gone, or a new pod reuses the name: nothing to do
            raise BindError(_reason_of(err), _message_of(err)) from None
        except (HTTPError, OSError) as err:
            raise BindError("transient", f"API server unreachable: {err}") from None
        return read_and_release(response)


def read_and_release(response: Any) -> bytes:
    """Read a raw (_preload_content=False) response whole, then give its connection back.

    Releasing a connection with the body unread would hand the next request
    on it the leftover bytes (urllib3 then fails with BadStatusLine).
    """
    try:
        data: bytes = response.data
        return data
    finally:
        response.release_conn()


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
