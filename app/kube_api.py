"""Calls to the API server from the verbs: bind pods, read a pod, wake or evict pods.

Requests are plain HTTP on the official client's connection pool and
credentials, blocking, so each runs on a small thread pool and the event loop
stays free for filter calls while a binding is in flight. Every call goes
through `_request`, which maps failures to BindError with a short reason (a
metric label) and a message a user can act on.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
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
        self._client: k8s.ApiClient = core.api_client
        self._executor = executor
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
        data = await self._run("GET", _pod_path(namespace, name), absent=(404,))
        return orjson.loads(data) if data is not None else None

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        """Set the wake-up annotation: an update of a pending pod requeues it in kube-scheduler."""
        # The uid in the patch keeps us from touching a recreated pod of the same name.
        patch = {"metadata": {"uid": uid, "annotations": {WAKEUP_ANNOTATION: value}}}
        await self._run(
            "PATCH",
            _pod_path(namespace, name),
            patch,
            absent=(404, 409, 422),
            content_type="application/merge-patch+json",
        )

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a pod (graceful, uid-guarded): the rest of a gang evicted whole."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._run("DELETE", _pod_path(namespace, name), body, absent=(404, 409))

    async def _run(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        absent: tuple[int, ...] = (),
        content_type: str = "application/json",
    ) -> bytes | None:
        """Run one request on the pool; None when it answered one of the `absent` codes."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor,
            lambda: self._request(method, path, body, absent, content_type),
        )

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        absent: tuple[int, ...],
        content_type: str,
    ) -> bytes | None:
        try:
            return raw_request(
                self._client, method, path, body, content_type=content_type, timeout=self._timeout
            )
        except ApiException as err:
            if err.status in absent:
                return None  # gone, or a new pod reuses the name: nothing to do
            raise BindError(_reason_of(err.status or 0), _message_of(err)) from None
        except (HTTPError, OSError) as err:
            raise BindError("transient", f"API server unreachable: {err}") from None


def raw_request(
    client: k8s.ApiClient,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    content_type: str = "application/json",
    timeout: float = 10,
) -> bytes:
    """One HTTP request on the client's connection pool, credentials and TLS settings.

    The generated client methods validate every argument (pydantic) and
    build model objects, which cost more CPU than the request itself; a
    binding per pod, and Events and PodGroup status per gang, are the calls
    we make most (bench/e2e.py), and the threads making them compete with
    the event loop for the GIL. Failures are raised as the generated methods
    raise them: ApiException with the status and body, urllib3 errors as is.
    """
    headers = {**client.default_headers, "Accept": "application/json"}
    payload = None
    if body is not None:
        headers["Content-Type"] = content_type
        payload = orjson.dumps(body)
    client.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)
    response = client.rest_client.pool_manager.request(
        method,
        client.configuration.host + path,
        body=payload,
        headers=headers,
        timeout=urllib3.Timeout(total=timeout),
        preload_content=False,
    )
    data = read_and_release(response)
    status: int = response.status
    if not 200 <= status < 300:
        raise ApiException(
            status=status, reason=response.reason, body=data.decode("utf-8", "replace")
        )
    return data


def _pod_path(namespace: str, name: str, subresource: str = "") -> str:
    return (
        f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}{subresource}"
    )


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


def _reason_of(status: int) -> str:
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
        message = orjson.loads(err.body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"API server answered {err.status}: {message or err.reason}"
