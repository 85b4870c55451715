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

from app.debug import GangDebug, add_debug_routes
from app.extender import GangExtender
from app.metrics import Metrics
from app.wire import WireError, parse_binding_args, parse_extender_args, parse_preempt_args

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def _json(payload: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS),
        status_code=status,
        media_type="application/json",
    )


def create_app(
    extender: GangExtender | None,
    metrics: Metrics,
    *,
    url_prefix: str,
    ready: Callable[[], tuple[bool, str]],
    lifespan: Lifespan | None = None,
    debug: GangDebug | None = None,
) -> FastAPI:
    """An ASGI app with the verbs (when `extender` is given) and the operations routes.

    With --ops-port the process runs two of these: one with the verbs (and
    the lifespan that starts the watches), one with only the operations
    routes; otherwise one app serves both.
    """
    app = FastAPI(
        title="gang-extender",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    if extender is not None:
        _add_verbs(app, extender, metrics, url_prefix)
    _add_operations(app, metrics, ready)
    if debug is not None:
        add_debug_routes(app, debug)
    return app


def _add_verbs(app: FastAPI, extender: GangExtender, metrics: Metrics, url_prefix: str) -> None:
    def verb(name: str, handle: Callable[[bytes], Awaitable[Any]]) -> None:
        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            body = await request.body()
            try:
                response = _json(await handle(body))
            except WireError as err:
                log.warning("bad %s request: %s", name, err, extra={"verb": name})
                response = _json({"Error": f"bad {name} request: {err}"}, 400)
            except Exception:
                log.exception("%s failed", name, extra={"verb": name})
                response = _json({"Error": f"internal error in {name}; see extender logs"}, 500)
            metrics.requests.labels(name, str(response.status_code)).inc()
            metrics.request_duration.labels(name).observe(time.perf_counter() - start)
            return response

        # A plain Starlette route: FastAPI's request handling (dependency
        # solving, response validation) buys nothing for a raw-bytes endpoint
        # and kube-scheduler calls these for every pod.
        app.add_route(f"{url_prefix}/{name}", endpoint, methods=["POST"], name=name)

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
