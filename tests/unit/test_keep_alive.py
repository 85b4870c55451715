"""Idle connections: the client closes them, never our servers (app/cli.py KEEP_ALIVE_SECONDS).

A server closing an idle keep-alive connection races the client's next
request on it. The API server's webhook client and kube-scheduler's extender
client keep idle connections for 90 s and retry no POST that meets EOF; with
uvicorn's default of 5 s, a webhook call 5 s after the one before failed
open and the pod was refused by the member-mark policy (make test, under
load). A request on a connection idle longer than uvicorn's default must be
answered.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import MutableMapping
from types import SimpleNamespace
from typing import Any, cast

from app.cli import KEEP_ALIVE_SECONDS, _server

# uvicorn's own default, which the servers must outlast.
UVICORN_DEFAULT_KEEP_ALIVE = 5.0
GO_IDLE_CONN_TIMEOUT = 90.0


async def ok(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


REQUEST = b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


async def test_a_request_on_a_connection_idle_past_uvicorns_default_is_answered() -> None:
    assert KEEP_ALIVE_SECONDS > GO_IDLE_CONN_TIMEOUT
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    apps = SimpleNamespace(begin_shutdown=lambda: None)
    settings = SimpleNamespace(shutdown_grace_seconds=1)
    server = _server(
        cast(Any, apps), ok, cast(Any, settings), host="127.0.0.1", port=port, lifespan="off"
    )
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(REQUEST)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert await reader.readexactly(2) == b"ok"
            await asyncio.sleep(UVICORN_DEFAULT_KEEP_ALIVE + 1)  # idle, as between two pods
        writer.close()
    finally:
        server.should_exit = True
        await serving
