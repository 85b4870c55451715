"""HTTP routes: the four verbs under the URL prefix, health, readiness and metrics.

Bodies are decoded by hand (app/wire.py) rather than through FastAPI models:
a filter call can carry thousands of Node objects, and only a few fields of
them matter. A malformed request gets HTTP 400 with {"Error": "..."}, which
kube-scheduler shows in the pod's events; nothing here answers 500 for bad input.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from app.debug import GangDebug, add_debug_routes
from app.extender import GangExtender
from app.metrics import Metrics
from app.wire import WireError, parse_binding_args, parse_extender_args, parse_preempt_args

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


VerbHandler = Callable[[bytes], Awaitable[tuple[int, bytes]]]


class ExtenderApp(FastAPI):
    """FastAPI, with the verbs answered before the framework's middleware and routing.

    kube-scheduler calls filter and prioritize one after the other for every
    pod, waiting for each answer before it schedules the next pod, so the
    time we take per call is the scheduler's throughput (bench/e2e.py). The
    error, telemetry, body-limit and exception middlewares and the route
    table add nothing to these raw-bytes endpoints, whose handler already
    answers every failure itself. Everything else goes through FastAPI.
    """

    verb_paths: dict[str, VerbHandler]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.verb_paths.get(scope["path"])
            if handler is not None:
                body = await _read_body(receive)
                if body is None:
                    return  # the caller went away
                status, payload = await handler(body)
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": payload})
                return
        await super().__call__(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def create_app(
    extender: GangExtender | None,
    metrics: Metrics,
    *,
    url_prefix: str,
    ready: Callable[[], tuple[bool, str]],
    lifespan: Lifespan | None = None,
    debug: GangDebug | None = None,
) -> ExtenderApp:
    """An ASGI app with the verbs (when `extender` is given) and the operations routes.

    With --ops-port the process runs two of these: one with the verbs (and
    the lifespan that starts the watches), one with only the operations
    routes; otherwise one app serves both.
    """
    app = ExtenderApp(
        title="gang-extender",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.verb_paths = {}
    if extender is not None:
        _add_verbs(app, extender, metrics, url_prefix)
    _add_operations(app, metrics, ready)
    if debug is not None:
        add_debug_routes(app, debug)
    return app


def _add_verbs(app: ExtenderApp, extender: GangExtender, metrics: Metrics, url_prefix: str) -> None:
    def verb(name: str, handle: Callable[[bytes], Awaitable[Any]]) -> None:
        requests = {code: metrics.requests.labels(name, str(code)) for code in (200, 400, 500)}
        duration = metrics.request_duration.labels(name)

        async def answer(body: bytes) -> tuple[int, bytes]:
            start = time.perf_counter()
            try:
                status, payload = 200, await handle(body)
            except WireError as err:
                log.warning("bad %s request: %s", name, err, extra={"verb": name})
                status, payload = 400, {"Error": f"bad {name} request: {err}"}
            except Exception:
                log.exception("%s failed", name, extra={"verb": name})
                status, payload = 500, {"Error": f"internal error in {name}; see extender logs"}
            encoded = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
            requests[status].inc()
            duration.observe(time.perf_counter() - start)
            return status, encoded

        async def endpoint(request: Request) -> Response:
            # Reached only through FastAPI's own routing (ExtenderApp answers first).
            status, payload = await answer(await request.body())
            return Response(payload, status_code=status, media_type="application/json")

        path = f"{url_prefix}/{name}"
        app.verb_paths[path] = answer
        app.add_route(path, endpoint, methods=["POST"], name=name)

    async def do_filter(body: bytes) -> Any:
        return extender.filter(parse_extender_args(body))

    async def do_prioritize(body: bytes) -> Any:
        return extender.prioritize(parse_extender_args(body))

    async def do_preempt(body: bytes) -> Any:
        return extender.preempt(parse_preempt_args(body))

    async def do_bind(body: bytes) -> Any:
        return await extender.bind(parse_binding_args(body))

    verb("filter", do_filter)
    verb("prioritize", do_prioritize)
    verb("preempt", do_preempt)
    verb("bind", do_bind)


def _add_operations(app: FastAPI, metrics: Metrics, ready: Callable[[], tuple[bool, str]]) -> None:
    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        ok, detail = ready()
        return Response(detail, status_code=200 if ok else 503, media_type="text/plain")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
