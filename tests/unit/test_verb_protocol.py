"""The verbs' HTTP fast path (app/web/verb_protocol.py) on a real uvicorn server and socket."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import uvicorn

from app.ops.metrics import Metrics
from app.web.routes import VerbEndpoint, VerbGuard, create_app
from app.web.verb_protocol import verb_protocol
from app.web.wire import WireError

LIMIT = 1000


@dataclass
class Served:
    port: int
    release: asyncio.Event
    metrics: Metrics
    server: uvicorn.Server


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    metrics = Metrics()
    guard = VerbGuard(max_request_bytes=LIMIT)
    release = asyncio.Event()

    def echo(body: bytes) -> Any:
        return {"got": len(body), "first": body[:8].decode()}

    async def slow(body: bytes) -> Any:
        await release.wait()
        return {"slow": True}

    def bad(body: bytes) -> Any:
        raise WireError("not valid JSON")

    verbs = {
        "/v/echo": VerbEndpoint("echo", echo, metrics, guard),
        "/v/slow": VerbEndpoint("slow", slow, metrics, guard, waits=True),
        "/v/bad": VerbEndpoint("bad", bad, metrics, guard),
    }
    app = create_app(None, metrics, url_prefix="/v", ready=lambda: (True, "ok"))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=verb_protocol(verbs), log_config=None, lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers only this flag
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield Served(port, release, metrics, server)
    release.set()
    server.should_exit = True
    await asyncio.wait_for(task, 10)


def request(path: str, body: bytes = b"", *, version: str = "1.1", method: str = "POST") -> bytes:
    return (
        f"{method} {path} HTTP/{version}\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status_line, *lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines if line)
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 5) == b""


async def test_verbs_and_other_routes_share_one_kept_alive_connection(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    for body in (b'{"a": 1}', b'{"bb": 22}'):
        writer.write(request("/v/echo", body))
        status, headers, answer = await response(reader)
        assert status == 200
        assert headers["content-type"] == "application/json"
        assert orjson.loads(answer) == {"got": len(body), "first": body[:8].decode()}
    writer.write(request("/healthz", method="GET"))
    status, _, answer = await response(reader)
    assert (status, answer) == (200, b"ok")
    writer.close()
    count = served.metrics.registry.get_sample_value(
        "gang_extender_requests_total", {"verb": "echo", "code": "200"}
    )
    assert count == 2


async def test_a_chunked_body_is_read_whole(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(
        b"POST /v/echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        b'4\r\n{"x"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n'
    )
    status, _, answer = await response(reader)
    assert status == 200
    assert orjson.loads(answer)["got"] == len(b'{"x": 1}')
    writer.close()


async def test_bad_input_is_a_400_with_the_reason(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/bad", b"{oops"))
    status, _, answer = await response(reader)
    assert status == 400
    assert orjson.loads(answer) == {"Error": "bad bad request: not valid JSON"}
    writer.close()


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_is_refused_with_413_and_the_connection_closed(
    served: Served, chunked: bool
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    big = b"x" * (LIMIT + 1)
    if chunked:
        writer.write(
            b"POST /v/echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            + f"{len(big):x}\r\n".encode()
            + big
            + b"\r\n0\r\n\r\n"
        )
    else:
        writer.write(request("/v/echo", big))
    status, headers, answer = await response(reader)
    assert status == 413
    assert headers["connection"] == "close"
    assert "--max-request-bytes=1000" in orjson.loads(answer)["Error"]
    assert await closed(reader)


async def test_http_1_0_gets_its_answer_then_the_connection_closes(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/echo", b"{}", version="1.0"))
    status, _, _ = await response(reader)
    assert status == 200
    assert await closed(reader)


async def test_pipelined_requests_that_need_no_wait_are_answered_in_order(
    served: Served,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/echo", b"[1]") + request("/v/echo", b"[22]"))
    for body in (b"[1]", b"[22]"):
        status, headers, answer = await response(reader)
        assert (status, orjson.loads(answer)["got"]) == (200, len(body))
        assert "connection" not in headers
    writer.close()


async def test_a_request_pipelined_behind_a_wait_is_dropped_and_the_connection_closed(
    served: Served,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/slow", b"{}") + request("/v/echo", b"{}"))
    await asyncio.sleep(0.1)
    served.release.set()
    status, headers, answer = await response(reader)
    assert (status, orjson.loads(answer)) == (200, {"slow": True})
    assert headers["connection"] == "close"
    assert await closed(reader)


async def test_shutdown_waits_for_an_answer_in_progress(served: Served) -> None:
    """A bind held in the gate is answered before the server goes, not cut off."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/slow", b"{}"))
    await asyncio.sleep(0.1)
    served.server.should_exit = True
    await asyncio.sleep(0.2)
    served.release.set()
    status, headers, _ = await response(reader)
    assert status == 200
    assert headers["connection"] == "close"
    assert await closed(reader)
