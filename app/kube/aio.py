"""The verbs' API requests and the watches on the event loop: a small asyncio HTTP/1.1 client.

Why not `raw_request` (app/kube/client.py) on a thread pool: profiles of the
real kube-scheduler calling us (bench/e2e.py, plain pods: a filter, a
prioritize and a bind call each) spent 15-20% of the extender's CPU in
bindings. Each one handed a blocking urllib3/http.client request to one of
64 threads; those threads compete with the event loop for the GIL and so
delay the filter and prioritize calls kube-scheduler is waiting on, and
http.client parses headers with the email package, urllib3 adds its layers,
and the hand-off costs a thread wake-up each way. Here a request is a few
writes and reads on the loop (uvloop in production): the head is built by
hand, the body serialized with orjson and the response parsed by httptools.
A watch (`watch`) is the same on a connection of its own, its lines handed
to the reflector as they are parsed (app/kube/reflector.py says why).

What it keeps from the official client: the Configuration's host, TLS
settings (`ssl_ca_cert`/`ca_cert_data`, `cert_file`/`key_file`,
`verify_ssl`, `tls_server_name`, `assert_hostname=False`) and credentials,
computed per request by `update_params_for_auth` exactly as `raw_request`
does (`request_parts` in app/kube/client.py), so ServiceAccount token
rotation and exec/refresh hooks keep working. A refresh hook runs on the
loop: the in-cluster one rereads the token file once a minute; an exec
plugin's, when its token expires, blocks the loop for as long as the plugin
runs. What it cannot do is talk through a proxy: when the Configuration
has one (`uses_proxy`), app/server.py keeps the threaded urllib3 path
(`ThreadedRequests` in app/kube/client.py) instead, chosen once at start.

At most `max_in_flight` requests are under way at once (the others wait
for a slot); connections are kept alive in a bounded pool (`max_idle`, as
many by default: a connection closed after a busy moment is a TLS handshake
for both sides at the next one; with fewer, the bench's bind waves opened
and closed connections all the time).
A connection whose answer was not read whole (timeout, cancellation, bad
framing) is closed, never reused; an idle one older than `idle_seconds` is
closed rather than reused. A reused connection the server closed before any
byte of the answer arrived (it timed it out while idle) did not process the
request: it is retried once on a new connection. Errors are those of
app/kube/errors.py: the ApiError of a non-2xx status, Transient when there
is no answer (refused, reset, TLS failure, timeout).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
from kubernetes import client as k8s
from kubernetes.client.rest import should_bypass_proxies

from app.core.clock import monotonic
from app.kube.client import LineBuffer, request_parts
from app.kube.errors import Transient, error_for

_CRLF_CHARS = frozenset("\r\n")


def uses_proxy(configuration: k8s.Configuration) -> bool:
    """True if the official client would reach the API server through a proxy.

    The same test as its REST client (kubernetes.client.rest), so the two
    never disagree about which path a request takes.
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


class _ConnectionLost(Exception):
    """The connection ended before the answer was complete."""

    def __init__(self, received: bool, cause: BaseException | None) -> None:
        what = "after part of the answer" if received else "before any answer"
        super().__init__(f"connection closed {what}" + (f": {cause}" if cause else ""))
        self.received = received


class _BadAnswer(Exception):
    """The bytes on the connection are not an HTTP/1.1 response."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._received = False
        self._headers_done = False
        self._framed = False  # Content-Length or Transfer-Encoding: the end is not the EOF
        self._complete = False
        self._keep_alive = False
        self._reason = b""
        self._body: list[bytes] = []
        self.status = 0

    # Requests ---------------------------------------------------------------

    async def exchange(self, request: bytes) -> tuple[int, bytes, bytes]:
        """Send `request`, wait for the whole answer: (status, reason, body)."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise _ConnectionLost(False, None)
        self._received = self._headers_done = self._framed = self._complete = False
        self._keep_alive = False
        self._reason = b""
        self._body = []
        self.status = 0
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            transport.write(request)
            await waiter
        finally:
            self._waiter = None
        return self.status, self._reason, b"".join(self._body)

    @property
    def reusable(self) -> bool:
        """The last answer was read whole and the server keeps the connection open."""
        return self._complete and self._keep_alive and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the stream is out of step
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            self._fail(_BadAnswer(f"malformed answer: {err!r}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self._headers_done and not self._framed:
            self._complete = True  # a body that ends with the connection
            waiter.set_result(None)
        else:
            waiter.set_exception(_ConnectionLost(self._received, exc))

    def _fail(self, err: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(err)

    # httptools callbacks ----------------------------------------------------

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


LineHandler = Callable[[bytes], None]
"""Called on the loop with each line of a watch, in order; what it raises ends the watch."""


class _Stream(asyncio.Protocol):
    """One watch: a GET whose answer is a stream of lines, each handed over as it arrives.

    The lines are handled inside data_received, on the loop, with nothing
    queued in between: a watch event costs its parse and its handling, no
    thread and no task. A handler's exception stops the stream and is what
    `done` raises.
    """

    def __init__(self, on_line: LineHandler) -> None:
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        # (status, reason) once the head arrived; `done` once the answer ended.
        self.head: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self._on_line = on_line
        self._parser = httptools.HttpResponseParser(self)
        self._reason = b""
        self._status = 0
        self._lines = LineBuffer()
        self._received = False
        self.error_body: list[bytes] = []

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            if not self.done.done():  # else: a handler failed and said why
                self._end(_BadAnswer(f"malformed answer: {err!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(_ConnectionLost(self._received, exc))

    def _end(self, err: BaseException | None) -> None:
        """The stream is over: `done` says how (the head is there, or fails alike)."""
        if err is None:
            if not self.done.done():
                self.done.set_result(None)
        else:
            for future in (self.head, self.done):
                if not future.done():
                    future.set_exception(err)
                    # Whoever waits reads one of the two: no "never retrieved" for the other.
                    future.exception()
        self.close()

    # httptools callbacks ----------------------------------------------------

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        if not self.head.done():
            self.head.set_result((self._status, self._reason))

    def on_body(self, body: bytes) -> None:
        if self._status != 200:
            self.error_body.append(body)
            return
        self._deliver(self._lines.feed(body))

    def on_message_complete(self) -> None:
        self._deliver(self._lines.rest())
        self._end(None)

    def _deliver(self, lines: list[bytes]) -> None:
        for line in lines:
            if self.done.done():
                return
            try:
                self._on_line(line)
            except Exception as err:
                self._end(err)


@dataclass(frozen=True, slots=True)
class _Target:
    """The API server's address and TLS settings, and how a request to it is written."""

    host: str
    port: int
    prefix: str  # a path the host names (a proxy in front of the API server), or ""
    host_header: str
    tls: ssl.SSLContext | None
    server_hostname: str | None

    def encode(self, method: str, path: str, headers: dict[str, str], payload: bytes) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}"]
        for name, value in headers.items():
            if not _CRLF_CHARS.isdisjoint(value):
                raise ValueError(f"header {name} contains a line break")
            lines.append(f"{name}: {value}")
        if payload or method not in ("GET", "HEAD"):
            lines.append(f"Content-Length: {len(payload)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


class AsyncApiClient:
    """HTTP/1.1 requests to the API server of `client`'s Configuration, on the running loop.

    Build it anywhere; use it on one event loop; `close()` at shutdown.
    """

    def __init__(
        self,
        client: k8s.ApiClient,
        *,
        max_idle: int | None = None,
        idle_seconds: float = 30.0,
        max_in_flight: int = 32,
    ) -> None:
        if uses_proxy(client.configuration):
            raise ValueError("AsyncApiClient cannot use a proxy: use ThreadedRequests")
        self._client = client
        self._name = client.configuration.host
        # Where and how to connect, read from the Configuration at the first request
        # (tests and tools build the extender with an empty one).
        self._target: _Target | None = None
        # As many idle connections as requests may be under way: one closed
        # after a busy moment is a TLS handshake at the next (1.3 ms of our CPU
        # against 0.1 ms for a request on a kept-alive connection).
        self._max_idle = max_in_flight if max_idle is None else max_idle
        # Requests beyond this wait here (--api-max-in-flight): bind waves of
        # hundreds of gangs must not reach the API server at once. Unbounded,
        # bench/e2e.py saw its binding p50 at 1.6 s and our RSS double. With
        # 128, a burst of plain pods opened 128 connections (128 handshakes,
        # a tenth of our CPU per pod) and the API server took 100-400 ms per
        # binding; with 32 it took 25-45 ms and kube-scheduler's bind calls
        # were answered sooner, queueing here included.
        self._slots = asyncio.Semaphore(max_in_flight)
        self._idle_seconds = idle_seconds
        self._idle: deque[_Connection] = deque()
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

        `timeout_seconds` bounds the whole request: connecting, TLS, sending, the answer.
        """
        headers, payload = request_parts(self._client, method, path, body, content_type)
        try:
            target = self._target or self._resolve()
            request = target.encode(method, path, headers, payload or b"")
            async with self._slots, asyncio.timeout(timeout_seconds):
                status, reason, data = await self._exchange(target, request)
        except TimeoutError:
            raise Transient(
                f"API server {self._name} did not answer {method} in {timeout_seconds:g}s"
            ) from None
        except (OSError, _ConnectionLost, _BadAnswer) as err:
            raise Transient(f"API server {self._name} unreachable: {err}") from None
        except ValueError as err:  # no usable address
            raise Transient(f"API server {self._name!r}: {err}") from None
        if not 200 <= status < 300:
            raise error_for(status, reason.decode("latin-1"), data)
        return data

    async def watch(
        self,
        path: str,
        on_line: LineHandler,
        *,
        on_open: Callable[[], None] = lambda: None,
        timeout_seconds: float,
        connect_timeout_seconds: float = 10,
    ) -> None:
        """GET `path` (a watch) and hand each line of the answer to `on_line`, on the loop.

        `on_open` is called once the API server answered 200. Returns when
        the server ends the answer (its timeoutSeconds). Raises what
        `on_line` raised, the ApiError of a status other than 200, or
        Transient when the connection fails, breaks off, or the answer has
        not ended `timeout_seconds` after it began. A watch has a connection
        of its own, outside the pool and the in-flight limit (it is open for
        minutes); cancelling the call closes it.
        """
        headers, _payload = request_parts(self._client, "GET", path, None, "application/json")
        try:
            target = self._target or self._resolve()
        except ValueError as err:  # no usable address
            raise Transient(f"API server {self._name!r}: {err}") from None
        request = target.encode("GET", path, headers, b"")
        stream: _Stream | None = None
        try:
            async with asyncio.timeout(connect_timeout_seconds):
                _transport, stream = await asyncio.get_running_loop().create_connection(
                    lambda: _Stream(on_line),
                    target.host,
                    target.port,
                    ssl=target.tls,
                    server_hostname=target.server_hostname,
                )
                assert stream.transport is not None
                stream.transport.write(request)
                status, reason = await stream.head
            if status != 200:
                await stream.done
                raise error_for(status, reason.decode("latin-1"), b"".join(stream.error_body))
            on_open()
            async with asyncio.timeout(timeout_seconds):
                await stream.done
        except TimeoutError:
            raise Transient(
                f"API server {self._name} did not answer or end the watch of {path} in time"
            ) from None
        except (OSError, _ConnectionLost, _BadAnswer) as err:
            raise Transient(f"watch of {path} on {self._name} broke off: {err}") from None
        finally:
            if stream is not None:
                stream.close()

    async def close(self) -> None:
        """Close the idle connections; those in use close when their request ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def _resolve(self) -> _Target:
        configuration = self._client.configuration
        url = urlsplit(configuration.host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("the address is not http(s)://HOST[:PORT]")
        tls = ssl_context(configuration) if url.scheme == "https" else None
        self._target = _Target(
            host=url.hostname,
            port=url.port or (443 if tls else 80),
            prefix=url.path.rstrip("/"),
            host_header=url.netloc.rpartition("@")[2],
            tls=tls,
            server_hostname=(configuration.tls_server_name or url.hostname) if tls else None,
        )
        return self._target

    async def _exchange(self, target: _Target, request: bytes) -> tuple[int, bytes, bytes]:
        connection = self._take_idle()
        if connection is not None:
            try:
                return await self._on(connection, request)
            except _ConnectionLost as lost:
                if lost.received:
                    raise
                # The server closed it while idle: the request was not processed.
        return await self._on(await self._connect(target), request)

    async def _on(self, connection: _Connection, request: bytes) -> tuple[int, bytes, bytes]:
        try:
            answer = await connection.exchange(request)
        except BaseException:
            connection.close()  # the answer was not read whole: never reuse it
            raise
        self._give_back(connection)
        return answer

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        _transport, connection = await loop.create_connection(
            _Connection,
            target.host,
            target.port,
            ssl=target.tls,
            server_hostname=target.server_hostname,
        )
        return connection

    def _take_idle(self) -> _Connection | None:
        now = monotonic()
        idle = self._idle
        # The oldest sit at the left: drop those past their age first.
        while idle and now - idle[0].idle_since > self._idle_seconds:
            idle.popleft().close()
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if not connection.closed and transport is not None and not transport.is_closing():
                return connection
            connection.close()
        return None

    def _give_back(self, connection: _Connection) -> None:
        if self._closed or not connection.reusable or len(self._idle) >= self._max_idle:
            connection.close()
            return
        connection.idle_since = monotonic()
        self._idle.append(connection)
