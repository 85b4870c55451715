"""Every call to the API server, on the event loop: requests and watches over aiohttp.

Why on the loop and not on threads: profiles of the real kube-scheduler
calling us (bench/e2e.py) put the bindings' threads among the extender's
top costs: each one competes with the loop for the GIL and delays the
filter and prioritize calls kube-scheduler is waiting on. aiohttp parses
answers with its C parser, keeps connections alive, and talks through an
HTTP proxy (CONNECT for https), so one client serves the verbs, the
watches (app/kube/reflector.py) and every writer (Events, status, the
webhook's certificates, discovery).

What it takes from the official client's Configuration (app/kube/client.py
loads it): the host, TLS settings (`ssl_ca_cert`/`ca_cert_data`,
`cert_file`/`key_file`, `verify_ssl`, `tls_server_name`,
`assert_hostname=False`), the proxy (`proxy`, `no_proxy`, `proxy_headers`)
and the credentials, asked for on every request with
`get_api_key_with_prefix`, which runs `refresh_api_key_hook`: a rotated
ServiceAccount token or an exec plugin's new token is used as soon as it
exists. (The in-cluster hook rereads the token file once a minute; an exec
plugin's, when its token expired, blocks the loop while the plugin runs.)

At most `max_in_flight` requests are under way at once (--api-max-in-flight);
the others wait for a slot, outside their timeout. The connections they used
stay open for the next ones (`idle_seconds`), so the pool never holds more
idle connections than requests can be in flight, plus the watches' own. A
watch is outside the limit: it is open for minutes, on a connection of its own.
Errors are those of app/kube/errors.py: the ApiError of a non-2xx status,
Transient when there is no answer (refused, reset, TLS failure, timeout).
"""

from __future__ import annotations

import asyncio
import contextvars
import ssl
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import orjson
from kubernetes import client as k8s
from kubernetes.client.rest import should_bypass_proxies
from yarl import URL

from app import __version__
from app.kube.errors import Transient, error_for
from app.kube.watch_stream import LineHandler, WatchSilent, stream_lines

_USER_AGENT = f"gang-extender/{__version__}"
_WATCH_CHUNK = 65536


class Requests(Protocol):
    """One API request, awaited: AsyncApiClient, or a test's stand-in."""

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout_seconds: float = 10,
    ) -> bytes: ...


def uses_proxy(configuration: k8s.Configuration) -> bool:
    """True if the official client would reach the API server through a proxy.

    The same test as its REST client (kubernetes.client.rest), so kubectl's
    configuration means the same thing to both.
    """
    return bool(configuration.proxy) and not should_bypass_proxies(
        configuration.host, configuration.no_proxy or ""
    )


def ssl_context(configuration: k8s.Configuration) -> ssl.SSLContext:
    """The TLS settings the official client's urllib3 pool uses, as an SSLContext."""
    if configuration.verify_ssl:
        context = ssl.create_default_context(
            cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data
        )
        if configuration.assert_hostname is False:
            context.check_hostname = False
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


@dataclass(frozen=True, slots=True)
class _Target:
    """Where the API server is and how to reach it, read once from the Configuration."""

    base: str  # scheme://host[:port][/prefix], no trailing slash
    tls: ssl.SSLContext | None
    # The keyword arguments of every request: TLS name, proxy (made once, not per request).
    route: dict[str, Any]

    @classmethod
    def of(cls, configuration: k8s.Configuration) -> _Target:
        url = urlsplit(configuration.host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("the address is not http(s)://HOST[:PORT]")
        tls = ssl_context(configuration) if url.scheme == "https" else None
        route: dict[str, Any] = {
            "server_hostname": (configuration.tls_server_name or None) if tls else None
        }
        if uses_proxy(configuration):
            proxy = URL(str(configuration.proxy))
            if proxy.scheme not in ("http", "https"):
                raise ValueError(f"proxy {configuration.proxy}: only http(s) proxies are supported")
            route["proxy"] = proxy
            route["proxy_headers"] = dict(configuration.proxy_headers or {})
        return cls(base=configuration.host.rstrip("/"), tls=tls, route=route)


# Whether the connection a request got had served one before (see _Connector).
_reused: contextvars.ContextVar[bool] = contextvars.ContextVar("reused", default=False)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's pool, telling the request whether its connection is a kept-alive one.

    A kept-alive connection the server closed before any byte of the answer
    (it timed it out while idle) did not process the request, so it is sent
    again on a new one whatever its method; aiohttp itself retries only the
    idempotent ones.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._served: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: ASYNC109
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        _reused.set(protocol in self._served)
        self._served.add(protocol)
        return connection


class _Loop:
    """What one event loop's requests share: the session (its pool) and the slots."""

    def __init__(self, target: _Target, max_in_flight: int, idle_seconds: float) -> None:
        self.loop = asyncio.get_running_loop()
        connector = _Connector(limit=0, keepalive_timeout=idle_seconds, ssl=target.tls or True)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),  # ours: asyncio.timeout per call
            skip_auto_headers=("Accept-Encoding",),  # uncompressed: no CPU on either side
            auto_decompress=False,
            trust_env=False,  # the Configuration already took the environment's proxy
        )
        self.slots = asyncio.Semaphore(max_in_flight)


class AsyncApiClient:
    """Requests and watches to the API server of `configuration`, on the running loop.

    Build it anywhere, use it on one event loop, `close()` it at shutdown.
    Where and how to connect is read at the first call (tests and tools build
    the extender with an empty Configuration), and the session at the first
    call on a loop (an aiohttp session belongs to the loop it was made on).
    """

    def __init__(
        self,
        configuration: k8s.Configuration,
        *,
        max_in_flight: int = 32,
        idle_seconds: float = 30.0,
    ) -> None:
        self._configuration = configuration
        self._name = configuration.host
        # Requests beyond this wait for a slot (--api-max-in-flight): bind waves
        # of hundreds of gangs must not reach the API server at once. Unbounded,
        # 200 gangs at once took kube-apiserver 60-250 ms per binding; with 32
        # it took 25-45 ms and kube-scheduler's bind calls were answered sooner,
        # queueing here included.
        self._max_in_flight = max_in_flight
        # A connection closed after a busy moment is a TLS handshake at the next
        # request (1.3 ms of our CPU, against 0.1 ms on a kept-alive one).
        self._idle_seconds = idle_seconds
        self._target: _Target | None = None
        self._on: _Loop | None = None
        self._closed = False

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout_seconds: float = 10,
    ) -> bytes:
        """One request; the response body on 2xx, else the ApiError of its status.

        `timeout_seconds` bounds the request once it has its slot: connecting,
        TLS, sending, the whole answer.
        """
        headers = self._headers(content_type if body is not None else None)
        payload = orjson.dumps(body) if body is not None else None
        try:
            on, target = self._state()
            url = URL(target.base + path, encoded=True)
            async with on.slots, asyncio.timeout(timeout_seconds):
                status, reason, data = await self._send(on, target, method, url, headers, payload)
        except TimeoutError:
            raise Transient(
                f"API server {self._name} did not answer {method} in {timeout_seconds:g}s"
            ) from None
        except (OSError, aiohttp.ClientError) as err:
            raise Transient(f"API server {self._name} unreachable: {_why(err)}") from None
        except ValueError as err:  # no usable address, or closed
            raise Transient(f"API server {self._name!r}: {err}") from None
        if not 200 <= status < 300:
            raise error_for(status, reason, data)
        return data

    async def watch(
        self,
        path: str,
        on_line: LineHandler,
        *,
        on_open: Callable[[], None] = lambda: None,
        timeout_seconds: float,
        connect_timeout_seconds: float = 10,
        idle_seconds: float | None = None,
    ) -> None:
        """GET `path` (a watch) and hand each line of the answer to `on_line`, on the loop.

        `on_open` is called once the API server answered 200. Returns when
        the server ends the answer (its timeoutSeconds). Raises what
        `on_line` raised, the ApiError of a status other than 200, or
        Transient when the connection fails, breaks off, or the answer has
        not begun within `connect_timeout_seconds` or ended `timeout_seconds`
        after that, or nothing arrived for `idle_seconds` (a peer gone
        without closing the connection: the API server sends a watch with
        bookmarks allowed one a minute at least). Cancelling the call closes
        the connection.
        """
        headers = self._headers(None)
        try:
            on, target = self._state()
        except ValueError as err:
            raise Transient(f"API server {self._name!r}: {err}") from None
        url = URL(target.base + path, encoded=True)
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(connect_timeout_seconds):
                response = await on.session.get(url, headers=headers, **target.route)
                if response.status != 200:
                    raise error_for(response.status, response.reason, await response.read())
            on_open()
            async with asyncio.timeout(timeout_seconds):
                await stream_lines(response.content, on_line, idle_seconds)
        except WatchSilent:
            raise Transient(
                f"API server {self._name} sent nothing on the watch of {path} for "
                f"{idle_seconds:g}s (no event, no bookmark): a dead connection, watching again"
            ) from None
        except TimeoutError:
            raise Transient(
                f"API server {self._name} did not answer or end the watch of {path} in time"
            ) from None
        except (OSError, aiohttp.ClientError) as err:
            raise Transient(f"watch of {path} on {self._name} broke off: {_why(err)}") from None
        finally:
            if response is not None:
                response.close()  # never reused: a watch cut short has unread bytes

    async def close(self) -> None:
        """Close the session and its connections; later calls fail as Transient."""
        self._closed = True
        on, self._on = self._on, None
        if on is not None and not on.session.closed:
            await on.session.close()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        """Credentials as of now: the refresh hook may have rotated the token."""
        headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
        token = self._configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    def _state(self) -> tuple[_Loop, _Target]:
        if self._closed:
            raise ValueError("the client is closed")
        target = self._target or self._resolve()
        on = self._on
        if on is None or on.loop is not asyncio.get_running_loop():
            on = self._on = _Loop(target, self._max_in_flight, self._idle_seconds)
        return on, target

    def _resolve(self) -> _Target:
        self._target = _Target.of(self._configuration)
        return self._target

    async def _send(
        self,
        on: _Loop,
        target: _Target,
        method: str,
        url: URL,
        headers: dict[str, str],
        payload: bytes | None,
    ) -> tuple[int, str | None, bytes]:
        """The exchange; sent again once if a kept-alive connection was closed under it."""
        for attempt in (1, 2):
            _reused.set(False)
            try:
                async with on.session.request(
                    method, url, headers=headers, data=payload, **target.route
                ) as response:
                    return response.status, response.reason, await response.read()
            except aiohttp.ServerDisconnectedError:
                if attempt == 2 or not _reused.get():
                    raise
        raise AssertionError("unreachable")


def _why(err: BaseException) -> str:
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return "connection closed before any answer"
    if isinstance(err, aiohttp.ClientPayloadError):
        return f"connection closed after part of the answer: {err}"
    return str(err) or type(err).__name__
