"""The verbs' ASGI callable (app/web/verbs_asgi.py) in FastAPI, on a real uvicorn server."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest
import uvicorn

from app.base.metrics import Metrics
from app.web.joined_writes import JoinedWritesProtocol
from app.web.routes import create_app
from app.web.verbs_asgi import VerbEndpoint, VerbGuard, VerbRouter
from app.web.wire import WireError
from tests.unit.fakes import eventually

LIMIT = 1000


@dataclass
class Served:
    port: int
    release: asyncio.Event
    metrics: Metrics
    guard: VerbGuard
    server: uvicorn.Server
    http: str  # uvicorn's name of its HTTP implementation, or "joined" (the extender's)

    def count(self, verb: str, code: int) -> float | None:
        return self.metrics.registry.get_sample_value(
            "gang_extender_requests_total", {"verb": verb, "code": str(code)}
        )


# The callable is plain ASGI: it must behave the same on both of uvicorn's HTTP implementations,
# and on the one the extender serves with (httptools, each answer in one write).
PROTOCOLS: dict[str, str | type[asyncio.Protocol]] = {
    "httptools": "httptools",
    "h11": "h11",
    "joined": JoinedWritesProtocol,
}


@pytest.fixture(params=list(PROTOCOLS))
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
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
    app.add_middleware(VerbRouter, verbs=verbs)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        http=PROTOCOLS[request.param],
        log_config=None,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers only this flag
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield Served(port, release, metrics, guard, server, request.param)
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
    fields = (line.split(": ", 1) for line in lines if line)
    headers = {name.lower(): value for name, value in fields}
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
    assert served.count("echo", 200) == 2


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


async def test_another_method_on_a_verb_path_is_a_405(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/echo", method="GET"))
    status, headers, answer = await response(reader)
    assert (status, headers["allow"]) == (405, "POST")
    assert orjson.loads(answer)["detail"]
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
    assert served.count("echo", 413) == 1


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    served: Served,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(
        b"POST /v/echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
        + f"content-length: {LIMIT + 1}\r\n\r\n".encode()
    )
    status, _, answer = await response(reader)
    assert status == 413
    assert f"of {LIMIT + 1} bytes" in orjson.loads(answer)["Error"]
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


async def test_a_request_pipelined_behind_a_wait_is_answered_after_it(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/slow", b"{}") + request("/v/echo", b"{}"))
    await asyncio.sleep(0.1)
    served.release.set()
    status, _, answer = await response(reader)
    assert (status, orjson.loads(answer)) == (200, {"slow": True})
    status, _, answer = await response(reader)
    assert (status, orjson.loads(answer)["got"]) == (200, 2)
    writer.close()


async def test_a_caller_gone_during_a_wait_is_counted_as_499(served: Served) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(request("/v/slow", b"{}"))
    await asyncio.sleep(0.1)
    writer.close()
    await asyncio.sleep(0.1)
    served.release.set()
    # Counted as answered (200) as well: the answer was made, nobody read it.
    await eventually(lambda: served.count("slow", 499) == 1)


async def test_a_caller_gone_before_its_body_arrived_is_counted_as_499(served: Served) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(b"POST /v/echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{}")
    await asyncio.sleep(0.1)
    writer.close()
    await eventually(lambda: served.count("echo", 499) == 1)


async def test_a_stopping_extender_answers_503(served: Served) -> None:
    served.guard.stopping = "shutting down"
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    for path in ("/v/echo", "/v/slow"):
        writer.write(request(path, b"{}"))
        status, _, answer = await response(reader)
        assert (status, orjson.loads(answer)["Error"]) == (
            503,
            f"{path[3:]} refused: shutting down",
        )
    writer.close()


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
    if served.http != "h11":  # h11 closes without saying so first
        assert headers["connection"] == "close"
    assert await closed(reader)


def test_the_verbs_sit_on_top_of_fastapis_own_middleware() -> None:
    """FastAPI's 500 page, exception telemetry and body limit are for the other routes:
    the verbs answer their errors themselves, and each layer is work on every call."""
    from app.web.extender import GangExtender

    app = create_app(
        cast(GangExtender, object()), Metrics(), url_prefix="/v", ready=lambda: (True, "ok")
    )
    stack = app.build_middleware_stack()
    assert isinstance(stack, VerbRouter)
    assert set(stack.verbs) == {"/v/filter", "/v/prioritize", "/v/preempt", "/v/bind"}
    assert type(stack.app).__name__ == "ServerErrorMiddleware"  # the rest: FastAPI's own
    operations_only = create_app(None, Metrics(), url_prefix="/v", ready=lambda: (True, "ok"))
    assert not isinstance(operations_only.build_middleware_stack(), VerbRouter)


def test_asking_whether_the_caller_is_there_never_waits_nor_fails() -> None:
    from app.web.verbs_asgi import _caller_gone

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    waited: list[str] = []

    async def there() -> dict[str, Any]:
        try:
            await asyncio.Event().wait()  # the caller has not gone: receive() would wait
        finally:
            waited.append("closed")
        return {"type": "http.disconnect"}

    async def broken() -> dict[str, Any]:
        raise RuntimeError("the server's own trouble")

    assert _caller_gone(gone) is True
    assert _caller_gone(there) is False
    assert waited == ["closed"]  # the step that would wait is closed, nothing left pending
    assert _caller_gone(broken) is False  # the answer is sent all the same
