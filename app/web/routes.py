"""HTTP routes: the four verbs under the URL prefix, health, readiness and metrics.

Bodies are decoded by hand (app/web/wire.py) rather than through FastAPI models:
a filter call can carry thousands of Node objects, and only a few fields of
them matter. The verbs are answered by app/web/verbs_asgi.py's VerbRouter,
ahead of FastAPI's routing; everything else is FastAPI's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp

from app.base.metrics import Metrics
from app.ops.debug import GangDebug, add_debug_routes
from app.web.extender import GangExtender
from app.web.verbs_asgi import VerbEndpoint, VerbGuard, VerbRouter
from app.web.wire import ExtenderArgsReader, parse_binding_args, parse_preempt_args

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def create_app(
    extender: GangExtender | None,
    metrics: Metrics,
    *,
    url_prefix: str,
    ready: Callable[[], tuple[bool, str]],
    lifespan: Lifespan | None = None,
    debug: GangDebug | None = None,
    guard: VerbGuard | None = None,
) -> FastAPI:
    """An ASGI app with the verbs (when `extender` is given) and the operations routes.

    With --ops-port the process runs two of these: one with the verbs (and
    the lifespan that starts the watches), one with only the operations
    routes; otherwise one app serves both.
    """
    verbs = (
        verb_endpoints(extender, metrics, url_prefix, guard or VerbGuard())
        if extender is not None
        else {}
    )
    app = _App(
        verbs,
        title="gang-extender",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        # Our metrics are Prometheus (app/base/metrics.py) and no OpenTelemetry provider is
        # set up: FastAPI's per-request look for one cost a filter call about 15 µs.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    _add_operations(app, metrics, ready)
    if debug is not None:
        add_debug_routes(app, debug)
    return app


class _App(FastAPI):
    """FastAPI, with the verbs' VerbRouter on top of its middleware stack.

    Added as ordinary middleware it would sit under FastAPI's own (its 500
    page, its exception telemetry, its body limit): three more calls on every
    verb request, and a wrapper on each of its sends, for errors the verbs
    already answer themselves. Every other route goes through all of it.
    """

    def __init__(self, verbs: Mapping[str, VerbEndpoint], **settings: Any) -> None:
        """verbs: URL path -> endpoint; none: an app of the operations routes only."""
        super().__init__(**settings)
        self._verbs = verbs

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        return VerbRouter(stack, self._verbs) if self._verbs else stack


def verb_endpoints(
    extender: GangExtender, metrics: Metrics, url_prefix: str, guard: VerbGuard
) -> dict[str, VerbEndpoint]:
    """URL path -> endpoint of each of the four verbs."""
    read_args = ExtenderArgsReader()  # prioritize often repeats filter's body
    handlers: dict[str, Callable[[bytes], Any]] = {
        "filter": lambda body: extender.filter(read_args(body)),
        "prioritize": lambda body: extender.prioritize(read_args(body)),
        "preempt": lambda body: extender.preempt(parse_preempt_args(body)),
        "bind": lambda body: extender.bind(parse_binding_args(body)),
    }
    return {
        f"{url_prefix}/{name}": VerbEndpoint(name, handle, metrics, guard, waits=name == "bind")
        for name, handle in handlers.items()
    }


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
