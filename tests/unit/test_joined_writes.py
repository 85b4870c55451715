"""app/web/joined_writes.py: each answer in one write, on a real uvicorn server and alone."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from app.web.joined_writes import JoinedWrites, JoinedWritesProtocol


class Recording(asyncio.Transport):
    """What JoinedWrites hands on: every write as it reaches the transport, and the closing."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


async def a_turn() -> None:
    """Lets the event loop run what was scheduled with call_soon."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_a_lone_write_leaves_on_the_loops_next_turn() -> None:
    real = Recording()
    joined = JoinedWrites(real, asyncio.get_running_loop())
    joined.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert real.writes == []
    assert joined.get_write_buffer_size() == len(b"HTTP/1.1 100 Continue\r\n\r\n")
    await a_turn()
    assert real.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    assert joined.get_write_buffer_size() == 0


async def test_two_writes_of_one_step_leave_at_once_as_one() -> None:
    real = Recording()
    joined = JoinedWrites(real, asyncio.get_running_loop())
    joined.write(b"head\r\n\r\n")
    joined.write(memoryview(b"body"))
    assert real.writes == [b"head\r\n\r\nbody"]
    joined.write(b"next head")
    assert real.writes == [b"head\r\n\r\nbody"]
    await a_turn()
    assert real.writes == [b"head\r\n\r\nbody", b"next head"]


async def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    real = Recording()
    joined = JoinedWrites(real, loop)
    joined.write(b"last chunk")
    joined.close()
    assert (real.writes, real.closed) == ([b"last chunk"], True)
    await a_turn()
    assert real.writes == [b"last chunk"]

    real = Recording()
    joined = JoinedWrites(real, loop)
    joined.write(b"never sent")
    joined.abort()
    await a_turn()
    assert (real.writes, real.aborted) == ([], True)


async def test_nothing_is_written_to_a_connection_that_closed_meanwhile() -> None:
    real = Recording()
    joined = JoinedWrites(real, asyncio.get_running_loop())
    joined.write(b"held")
    real.close()  # the peer went away: uvicorn's connection_lost, the transport closing
    await a_turn()
    assert real.writes == []


# ---- on a real uvicorn server ----------------------------------------------------------


@dataclass
class Server:
    port: int
    # The writes that reached each connection's socket transport, per connection.
    writes: list[list[bytes]] = field(default_factory=list)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """/answer: one body (as the verbs answer); /stream: three chunks, a turn apart."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    answer = b"got " + body
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    served = Server(port=0)

    class Counted(JoinedWritesProtocol):
        """The product's protocol, with the transport under it recording what it sends."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            writes: list[bytes] = []
            served.writes.append(writes)
            real_write = transport.write  # type: ignore[attr-defined]

            def write(data: Any) -> None:
                writes.append(bytes(data))
                real_write(data)

            transport.write = write  # type: ignore[attr-defined]
            super().connection_made(transport)

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=Counted, log_config=None, lifespan="off"
    )
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve())
    while not uv.started:  # noqa: ASYNC110 - uvicorn offers only this flag
        await asyncio.sleep(0.01)
    served.port = uv.servers[0].sockets[0].getsockname()[1]
    yield served
    uv.should_exit = True
    await asyncio.wait_for(task, 10)


async def head_and_body(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await asyncio.wait_for(reader.readexactly(length), 5)


async def test_each_answer_on_a_kept_alive_connection_is_one_write(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for body in (b"first", b"second", b"third"):
        writer.write(b"POST /answer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body))
        writer.write(body)
        head, answer = await head_and_body(reader)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert answer == b"got " + body
    writer.close()
    (writes,) = server.writes
    assert len(writes) == 3, [w[:40] for w in writes]
    assert all(
        w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b"\r\n\r\ngot " + b)
        for w, b in zip(writes, (b"first", b"second", b"third"), strict=True)
    )


async def test_a_streamed_answer_arrives_whole_and_in_order(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"transfer-encoding: chunked" in head.lower()
    chunked = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
    assert chunked == b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n"
    writer.close()


async def test_expect_100_continue_is_answered_before_the_body_is_sent(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /answer HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"data")
    _, answer = await head_and_body(reader)
    assert answer == b"got data"
    writer.close()
