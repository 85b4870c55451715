"""The API server connection: building the client, and one plain HTTP request on it.

Every writer in app/kube/ on a thread sends its requests through
`raw_request`, which turns a failed answer into an ApiError
(app/kube/errors.py). The verbs' pod calls and the watches
(app/kube/reflector.py) use app/kube/aio.py on the event loop instead, or
`ThreadedRequests` when the API server is behind a proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from urllib3.exceptions import HTTPError

from app.kube.errors import ApiError, Transient, error_for


class KubeConfigError(RuntimeError):
    """No way to reach the API server; the message says what to set."""


def api_client(kubeconfig: str | None, *, pool_size: int) -> k8s.ApiClient:
    """The client for `kubeconfig`, or the in-cluster ServiceAccount when there is none.

    pool_size: connections kept open; a request finding the pool empty opens
    a new TLS connection, so it should cover every thread making requests.
    """
    try:
        if kubeconfig:
            configuration = k8s.Configuration()
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            raise KubeConfigError(
                "no kubeconfig given and not running in a cluster: pass --kubeconfig PATH "
                "(or set GANG_EXTENDER_KUBECONFIG / KUBECONFIG)"
            )
    except k8s_config.ConfigException as err:
        raise KubeConfigError(f"cannot load Kubernetes client configuration: {err}") from None
    configuration.connection_pool_maxsize = pool_size
    return k8s.ApiClient(configuration)


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
    the event loop for the GIL. A non-2xx answer raises the ApiError of its
    status; no answer (connection refused, timeout) raises Transient.
    """
    headers, payload = request_parts(client, method, path, body, content_type)
    try:
        response = client.rest_client.pool_manager.request(
            method,
            client.configuration.host + path,
            body=payload,
            headers=headers,
            timeout=urllib3.Timeout(total=timeout),
            preload_content=False,
        )
        data = read_and_release(response)
    except (HTTPError, OSError) as err:
        raise Transient(f"API server unreachable: {err}") from None
    status: int = response.status
    if not 200 <= status < 300:
        raise error_for(status, response.reason, data)
    return data


def request_parts(
    client: k8s.ApiClient,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    content_type: str,
) -> tuple[dict[str, str], bytes | None]:
    """The headers (credentials computed now) and JSON body of one request.

    Credentials come from `update_params_for_auth` on every request, so a
    rotated ServiceAccount token or an exec/refresh hook's new token is used
    (app/kube/aio.py builds its requests with this too).
    """
    headers: dict[str, str] = {**client.default_headers, "Accept": "application/json"}
    payload = None
    if body is not None:
        headers["Content-Type"] = content_type
        payload = orjson.dumps(body)
    client.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)
    return headers, payload


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


class Requests(Protocol):
    """One API request, awaited: AsyncApiClient (app/kube/aio.py) or ThreadedRequests."""

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout_seconds: float = 10,
    ) -> bytes: ...


class LineBuffer:
    """A watch's answer, read in chunks, cut into its lines (one JSON event each).

    Both watch readers use it: AsyncApiClient's parser callbacks and
    ThreadedRequests' thread. Blank lines are dropped.
    """

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The lines `data` completes; a partial last line waits for the next chunk."""
        if b"\n" not in data:
            self._pending += data
            return []
        *lines, self._pending = (self._pending + data).split(b"\n")
        return [line for line in lines if line.strip()]

    def rest(self) -> list[bytes]:
        """The last line when the answer ended without a newline after it."""
        rest, self._pending = self._pending, b""
        return [rest] if rest.strip() else []


class ThreadedRequests:
    """`raw_request` on a thread pool, awaitable: the verbs' path when a proxy is configured.

    app/kube/aio.py (AsyncApiClient) serves the verbs on the event loop
    without threads, but it cannot go through a proxy; urllib3 can. Same
    `request` and `close` as AsyncApiClient, so app/kube/pods.py takes either.
    """

    def __init__(self, client: k8s.ApiClient, executor: ThreadPoolExecutor) -> None:
        self._client = client
        self._executor = executor

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout_seconds: float = 10,
    ) -> bytes:
        call = functools.partial(
            raw_request,
            self._client,
            method,
            path,
            body,
            content_type=content_type,
            timeout=timeout_seconds,
        )
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def watch(
        self,
        path: str,
        on_line: Callable[[bytes], None],
        *,
        on_open: Callable[[], None] = lambda: None,
        timeout_seconds: float,
        connect_timeout_seconds: float = 10,
    ) -> None:
        """AsyncApiClient.watch through urllib3 (and so through the proxy).

        The stream is read on a thread of its own (a watch is open for
        minutes: not one of the executor's); `on_open` and every line are
        handed to the loop, in order, and run there. `timeout_seconds` bounds
        each read. Cancelling the call cuts the read short.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        stopping = threading.Event()
        responses: list[Any] = []

        def stop() -> None:
            stopping.set()
            for response in responses:
                with contextlib.suppress(Exception):
                    response.shutdown()  # unblocks the thread's read

        def finish(err: BaseException | None) -> None:  # on the loop
            if done.done():
                return
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(err)

        def deliver(lines: list[bytes]) -> None:  # on the loop
            for line in lines:
                if done.done():
                    return
                try:
                    on_line(line)
                except Exception as err:
                    finish(err)
                    stop()
                    return

        def to_loop(fn: Callable[..., None], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(fn, *args)

        def read() -> None:  # on the thread
            try:
                headers, _payload = request_parts(
                    self._client, "GET", path, None, "application/json"
                )
                response = self._client.rest_client.pool_manager.request(
                    "GET",
                    self._client.configuration.host + path,
                    headers=headers,
                    timeout=urllib3.Timeout(connect=connect_timeout_seconds, read=timeout_seconds),
                    preload_content=False,
                )
                responses.append(response)
                if stopping.is_set():
                    response.shutdown()
                if response.status != 200:
                    raise error_for(response.status, response.reason, read_and_release(response))
                to_loop(on_open)
                buffer = LineBuffer()
                for chunk in response.stream(65536, decode_content=True):
                    if stopping.is_set():
                        return
                    lines = buffer.feed(chunk)
                    if lines:
                        to_loop(deliver, lines)
                to_loop(deliver, buffer.rest())
                to_loop(finish, None)
            except ApiError as err:
                to_loop(finish, err)
            except Exception as err:
                if not stopping.is_set():
                    to_loop(finish, Transient(f"watch of {path} broke off: {err}"))
            finally:
                for response in responses:
                    # A stream cut short still has unread bytes: never reuse its connection.
                    with contextlib.suppress(Exception):
                        response.close()
                        response.release_conn()

        threading.Thread(target=read, name="kube-watch", daemon=True).start()
        try:
            await done
        finally:
            stop()

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
