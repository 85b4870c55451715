"""The watch stream of app/kube/http.py.

Against a real HTTP server started in the test, which answers a watch the
way the API server does (chunked, one JSON event per line, flushed as events
happen) from a script: bytes to send, pauses, and where to cut the connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import pytest
from kubernetes import client as k8s

from app.kube.errors import Gone, NotFound, Transient
from app.kube.http import AsyncApiClient
from app.kube.watch_stream import WATCH_SLICE_SECONDS


class Pause:
    """A script step: wait this long before the next one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


CUT = object()  # a script step: close the connection here
END = b"0\r\n\r\n"  # the last chunk: the server ends the watch
Step = bytes | Pause | object


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(kind: str, name: str, rv: str) -> bytes:
    meta = {"name": name, "resourceVersion": rv}
    return orjson.dumps({"type": kind, "object": {"metadata": meta}}) + b"\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


@dataclass
class WatchServer:
    script: list[Step]
    port: int = 0
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
        self.paths.append(request_line.split(" ")[1])
        self.headers.append(
            {n.strip().lower(): v.strip() for n, _, v in (x.partition(":") for x in lines)}
        )
        try:
            for step in self.script:
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                elif step is CUT:
                    break
                elif isinstance(step, bytes):
                    writer.write(step)
                    await writer.drain()
            else:
                # Script done without a cut: wait for the client to hang up.
                if await reader.read() == b"":
                    self.closed_by_client.set()
        except ConnectionError:
            self.closed_by_client.set()
        finally:
            writer.close()


class Watch(Protocol):
    def __call__(
        self,
        path: str,
        on_line: Callable[[bytes], None],
        *,
        on_open: Callable[[], None] = ...,
        timeout_seconds: float,
        connect_timeout_seconds: float = ...,
    ) -> Coroutine[Any, Any, None]: ...


Serve = Callable[[list[Step]], Awaitable[tuple[WatchServer, Watch]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a WatchServer; the client's watch call against it."""
    listeners: list[asyncio.Server] = []
    clients: list[AsyncApiClient] = []

    async def start(script: list[Step]) -> tuple[WatchServer, Watch]:
        server = WatchServer(script)
        listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        listeners.append(listener)
        server.port = listener.sockets[0].getsockname()[1]
        configuration = k8s.Configuration(host=f"http://127.0.0.1:{server.port}")
        configuration.api_key = {"authorization": "token-1"}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        client = AsyncApiClient(configuration)
        clients.append(client)
        return server, client.watch

    yield start
    for client in clients:
        await client.close()
    for listener in listeners:
        listener.close()


class Lines:
    """An on_line that keeps what it was given, and on_open's calls among them."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.seen: list[Any] = []
        self._fail_on = fail_on

    def line(self, line: bytes) -> None:
        if self._fail_on is not None and self._fail_on in line:
            raise ValueError("the handler refused " + line.decode())
        self.seen.append(orjson.loads(line)["object"]["metadata"]["name"])

    def opened(self) -> None:
        self.seen.append("<open>")


async def test_lines_arrive_whole_and_in_order_however_the_chunks_cut_them(serve: Serve) -> None:
    a, b, c = event("ADDED", "a", "1"), event("MODIFIED", "b", "2"), event("DELETED", "c", "3")
    server, watch = await serve(
        [
            HEAD,
            chunk(a[:10]),
            Pause(0.02),
            chunk(a[10:] + b[:5]),
            chunk(b[5:]),
            chunk(b"\n"),  # a blank line (keep-alive) is no event
            chunk(c),
            END,
        ]
    )
    lines = Lines()
    await asyncio.wait_for(
        watch("/api/v1/pods?watch=true", lines.line, on_open=lines.opened, timeout_seconds=5), 5
    )
    assert lines.seen == ["<open>", "a", "b", "c"]
    assert server.paths == ["/api/v1/pods?watch=true"]
    assert server.headers[0]["authorization"] == "Bearer token-1"
    assert server.headers[0]["accept"] == "application/json"


async def test_a_last_line_without_newline_is_still_delivered(serve: Serve) -> None:
    _server, watch = await serve([HEAD, chunk(event("ADDED", "a", "1").rstrip(b"\n")), END])
    lines = Lines()
    await asyncio.wait_for(watch("/w", lines.line, timeout_seconds=5), 5)
    assert lines.seen == ["a"]


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [(410, Gone, "too old resource version"), (404, NotFound, "the server could not find")],
)
async def test_an_error_status_raises_its_api_error(
    serve: Serve, status: int, error: type[Exception], message: str
) -> None:
    body = orjson.dumps({"kind": "Status", "code": status, "message": message})
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    _server, watch = await serve([head + body])
    lines = Lines()
    with pytest.raises(error, match=f"answered {status}: {message}"):
        await asyncio.wait_for(watch("/w", lines.line, on_open=lines.opened, timeout_seconds=5), 5)
    assert lines.seen == []  # not opened


async def test_a_connection_cut_mid_stream_is_transient_after_the_lines_before_it(
    serve: Serve,
) -> None:
    _server, watch = await serve([HEAD, chunk(event("ADDED", "a", "1")), Pause(0.05), CUT])
    lines = Lines()
    with pytest.raises(Transient, match="broke off"):
        await asyncio.wait_for(watch("/w", lines.line, timeout_seconds=5), 5)
    assert lines.seen == ["a"]


async def test_what_the_handler_raises_ends_the_watch_and_closes_the_connection(
    serve: Serve,
) -> None:
    server, watch = await serve(
        [
            HEAD,
            chunk(event("ADDED", "a", "1")),
            Pause(0.05),
            chunk(event("ADDED", "bad", "2") + event("ADDED", "c", "3")),
            Pause(0.05),
            chunk(event("ADDED", "d", "4")),
        ]
    )
    lines = Lines(fail_on=b'"bad"')
    with pytest.raises(ValueError, match="the handler refused"):
        await asyncio.wait_for(watch("/w", lines.line, timeout_seconds=5), 5)
    assert lines.seen == ["a"]  # nothing after the line that failed
    await asyncio.wait_for(server.closed_by_client.wait(), 5)


async def test_cancelling_the_watch_closes_its_connection(serve: Serve) -> None:
    server, watch = await serve([HEAD, chunk(event("ADDED", "a", "1"))])
    lines = Lines()
    task = asyncio.create_task(watch("/w", lines.line, timeout_seconds=30))
    deadline = asyncio.get_running_loop().time() + 5
    while lines.seen != ["a"]:
        assert asyncio.get_running_loop().time() < deadline, "no line arrived"
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(server.closed_by_client.wait(), 5)


async def test_no_answer_in_time_is_transient() -> None:
    """The head within connect_timeout_seconds, the whole stream within timeout_seconds."""
    silent = WatchServer([Pause(10)])
    listener = await asyncio.start_server(silent.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    api = AsyncApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port}"))
    with pytest.raises(Transient, match="did not answer or end the watch of /w in time"):
        await api.watch("/w", lambda _: None, timeout_seconds=5, connect_timeout_seconds=0.2)
    endless = WatchServer([HEAD, chunk(event("ADDED", "a", "1")), Pause(10)])
    listener2 = await asyncio.start_server(endless.serve, "127.0.0.1", 0)
    port2 = listener2.sockets[0].getsockname()[1]
    api2 = AsyncApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port2}"))
    seen: list[bytes] = []
    with pytest.raises(Transient, match="in time"):
        await api2.watch("/w", seen.append, timeout_seconds=0.3)
    assert len(seen) == 1
    await api.close()
    await api2.close()
    listener.close()
    listener2.close()


async def test_a_watch_silent_for_its_idle_limit_is_transient() -> None:
    """A peer gone without closing (a half-open connection) is noticed within idle_seconds,
    not after the whole watch's timeout: bytes that keep coming keep it open."""
    script: list[Step] = [HEAD]
    for i in range(6):
        script += [chunk(event("ADDED", f"p{i}", str(i))), Pause(0.1)]
    talking = WatchServer([*script, END])
    silent = WatchServer([HEAD, chunk(event("ADDED", "a", "1")), Pause(10)])
    apis = []
    for server in (talking, silent):
        listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        apis.append((AsyncApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port}")), listener))
    seen: list[bytes] = []
    await apis[0][0].watch("/w", seen.append, timeout_seconds=5, idle_seconds=0.4)
    assert len(seen) == 6  # 0.6 s in all, never 0.4 s without a byte
    start = time.monotonic()
    with pytest.raises(Transient, match=r"sent nothing on the watch of /w for 0\.3s"):
        await apis[1][0].watch("/w", seen.append, timeout_seconds=5, idle_seconds=0.3)
    assert time.monotonic() - start < 2
    for api, listener in apis:
        await api.close()
        listener.close()


async def test_a_burst_of_events_in_one_chunk_gives_the_event_loop_back_between_them(
    serve: Serve,
) -> None:
    """A verb that arrives during a burst is answered before the burst is all applied."""
    burst = b"".join(event("ADDED", f"p{i}", str(i)) for i in range(40))
    _server, watch = await serve([HEAD, chunk(burst), END])
    lines = Lines()
    ticks: list[int] = []  # how many events were applied each time the other task ran

    def slow(line: bytes) -> None:
        lines.line(line)
        until = time.perf_counter() + WATCH_SLICE_SECONDS / 2
        while time.perf_counter() < until:  # each event takes half a slice
            pass

    async def other_task() -> None:
        while len(lines.seen) < 40:
            ticks.append(len(lines.seen))
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    await asyncio.wait_for(watch("/w", slow, timeout_seconds=5), 5)
    await other
    assert lines.seen == [f"p{i}" for i in range(40)]  # all of them, in order
    assert len({t for t in ticks if 0 < t < 40}) >= 5  # it ran again and again mid-burst
