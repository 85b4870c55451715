#!/usr/bin/env python3
"""bench.verbcost's floors: what a verb call costs a server with nothing behind it.

Both servers answer `POST /scheduler/filter` and `/scheduler/prioritize`
with the least a verb can do (every offered node passes; every offered node
scores 0, which a HostPriorityList says by naming none), decoding the
request with orjson as gang-extender does, and `GET /healthz` for the
bench's readiness check:

- `uvicorn`: the answer as an ASGI app on uvicorn, with the settings of
  gang-extender's verbs port (app/cli.py `verbs_http`), on uvloop;
- `bare`: an asyncio protocol on uvloop over httptools' parser that answers
  from `data_received` in one write, as old main's hand-written protocol
  did (issue 22 replaced it with FastAPI on uvicorn).

gang-extender's CPU per call less the `uvicorn` floor's is what its own
verb code costs; the `uvicorn` floor less the `bare` one is what uvicorn's
per-request machinery costs (scope, request cycle, task, send calls), which
no change to the verbs can take back.

    python -m bench.verbfloor --server uvicorn|bare --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

import httptools
import orjson
import uvicorn
import uvloop
from starlette.types import Receive, Scope, Send

from app.cli import verbs_http

SERVERS = ("uvicorn", "bare")


def answer(path: bytes, body: bytes) -> tuple[int, bytes]:
    """(status, JSON body) of a pass-through verb, or 404 for anything else."""
    if path == b"/healthz":
        return 200, b'"ok"'
    if path not in (b"/scheduler/filter", b"/scheduler/prioritize"):
        return 404, b'{"Error":"no such verb"}'
    args = orjson.loads(body)
    if path == b"/scheduler/prioritize":
        return 200, b"[]"
    names: list[str] = args.get("NodeNames") or []
    result = {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}}
    return 200, orjson.dumps(result)


async def asgi_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The pass-through verbs as ASGI (lifespan off: uvicorn is told so)."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    status, payload = answer(scope["path"].encode(), b"".join(chunks))
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class BareProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive over httptools, each answer written from the parser's callback."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status, payload = answer(httptools.parse_url(self._url).path, b"".join(self._body))
        self._url, self._body = b"", []
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        reason = b"OK" if status == 200 else b"Not Found"
        assert self._transport is not None
        self._transport.write(head % (status, reason, len(payload)) + payload)
        if not self._parser.should_keep_alive():
            self._transport.close()


async def _serve_bare(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(BareProtocol, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=SERVERS, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        if args.server == "bare":
            runner.run(_serve_bare(args.port))
        else:
            config = uvicorn.Config(
                asgi_app,
                host="127.0.0.1",
                port=args.port,
                lifespan="off",
                log_config=None,
                access_log=False,
                **verbs_http(),
            )
            runner.run(uvicorn.Server(config).serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
