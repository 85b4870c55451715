"""HTTP routes: the four verbs under the URL prefix, health, readiness and metrics.

Bodies are decoded by hand (app/web/wire.py) rather than through FastAPI models:
a filter call can carry thousands of Node objects, and only a few fields of
them matter. A malformed request gets HTTP 400 with {"Error": "..."}, which
kube-scheduler shows in the pod's events; nothing here answers 500 for bad input.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Message, Receive, Scope, Send

from app.core.clock import monotonic
from app.ops.debug import GangDebug, add_debug_routes
from app.ops.metrics import Metrics
from app.web.extender import GangExtender
from app.web.wire import ExtenderArgsReader, WireError, parse_binding_args, parse_preempt_args

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024


class BodyTooLarge(Exception):
    """The request body exceeds --max-request-bytes; answered with HTTP 413."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        """declared: the Content-Length; None when the body was found too long as it arrived."""
        size = f"of {declared} bytes" if declared is not None else f"of more than {limit} bytes"
        super().__init__(f"request body {size} exceeds --max-request-bytes={limit}")


@dataclass
class VerbGuard:
    """What every verb checks before decoding: body size, and whether we are shutting down.

    `stopping` is set on SIGTERM (app/cli.py): from then on every verb is
    refused with 503, so kube-scheduler retries the pod against the next
    extender process instead of waiting on this one.
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    stopping: str | None = None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None if the caller went away.

    Refuses (without reading it all) anything larger than `limit`: by the
    declared Content-Length first, then by what actually arrives.
    """
    for header, value in scope.get("headers") or ():
        if header == b"content-length":
            try:
                size = int(value)
            except ValueError:
                size = -1
            if size > limit:
                raise BodyTooLarge(limit, size)
            break
    chunks: list[bytes] = []
    received = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class VerbEndpoint:
    """One verb: decode the body, answer, count; for the ASGI route and the fast path alike.

    app/web/verb_protocol.py answers kube-scheduler's POSTs straight from the
    HTTP parser, and ExtenderApp answers the same paths for every other
    ASGI server (tests use httpx's ASGI transport); both go through here, so
    the answer, the error handling and the metrics are the same.
    """

    def __init__(
        self,
        name: str,
        handle: Callable[[bytes], Any],
        metrics: Metrics,
        guard: VerbGuard,
        *,
        waits: bool = False,
    ) -> None:
        """handle: body -> answer; with `waits`, body -> awaitable answer (bind: the gate)."""
        self.name = name
        self.guard = guard
        self.waits = waits
        self._handle = handle
        self._requests = {
            code: metrics.requests.labels(name, str(code))
            for code in (200, 400, 413, 499, 500, 503)
        }
        self._duration = metrics.request_duration.labels(name)

    async def answer(self, body: bytes, started: float) -> tuple[int, bytes]:
        """(HTTP status, JSON answer) for a request body read whole since `started`."""
        if not self.waits:
            return self.answer_now(body, started)
        if self.guard.stopping is not None:
            return self._count(*self._refusal(), started)
        try:
            payload = await self._handle(body)
        except Exception as err:
            return self._count(*self._failure(err), started)
        return self._count(200, payload, started)

    def answer_now(self, body: bytes, started: float) -> tuple[int, bytes]:
        """answer() of a verb that never waits (filter, prioritize, preempt), without a task.

        These are answered while kube-scheduler's scheduling cycle waits;
        a task per request is a measurable share of their cost.
        """
        assert not self.waits, f"{self.name} waits: use answer()"
        if self.guard.stopping is not None:
            return self._count(*self._refusal(), started)
        try:
            payload = self._handle(body)
        except Exception as err:
            return self._count(*self._failure(err), started)
        return self._count(200, payload, started)

    def _refusal(self) -> tuple[int, Any]:
        return 503, {"Error": f"{self.name} refused: {self.guard.stopping}"}

    def _failure(self, err: Exception) -> tuple[int, Any]:
        name = self.name
        if isinstance(err, WireError):
            log.warning("bad %s request: %s", name, err, extra={"verb": name})
            return 400, {"Error": f"bad {name} request: {err}"}
        log.error("%s failed", name, exc_info=err, extra={"verb": name})
        return 500, {"Error": f"internal error in {name}; see extender logs"}

    def too_large(self, err: BodyTooLarge, started: float) -> tuple[int, bytes]:
        log.warning("bad %s request: %s", self.name, err, extra={"verb": self.name})
        return self._count(413, {"Error": f"bad {self.name} request: {err}"}, started)

    def caller_gone(self) -> None:
        # Nobody reads this answer; 499 (nginx's "client closed request")
        # keeps it apart from real errors in the metrics.
        self._requests[499].inc()

    async def answer_asgi(self, scope: Scope, receive: Receive) -> tuple[int, bytes] | None:
        """answer() for an ASGI request; None if the caller went away before its body arrived."""
        started = monotonic()
        try:
            body = await read_body(scope, receive, self.guard.max_request_bytes)
        except BodyTooLarge as err:
            return self.too_large(err, started)
        if body is None:
            self.caller_gone()
            return None
        return await self.answer(body, started)

    def _count(self, status: int, payload: Any, started: float) -> tuple[int, bytes]:
        encoded = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
        self._requests[status].inc()
        self._duration.observe(monotonic() - started)
        return status, encoded


class ExtenderApp(FastAPI):
    """FastAPI, with the verbs answered before the framework's middleware and routing.

    kube-scheduler calls filter and prioritize one after the other for every
    pod, waiting for each answer before it schedules the next pod, so the
    time we take per call is the scheduler's throughput (bench/e2e.py). The
    error, telemetry and exception middlewares and the route
    table add nothing to these raw-bytes endpoints, whose handler already
    answers every failure itself. Everything else goes through FastAPI.
    (`gang-extender serve` goes further: app/web/verb_protocol.py.)
    """

    verb_paths: dict[str, VerbEndpoint]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            verb = self.verb_paths.get(scope["path"])
            if verb is not None:
                answered = await verb.answer_asgi(scope, receive)
                if answered is None:
                    return  # the caller went away
                status, payload = answered
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


def create_app(
    extender: GangExtender | None,
    metrics: Metrics,
    *,
    url_prefix: str,
    ready: Callable[[], tuple[bool, str]],
    lifespan: Lifespan | None = None,
    debug: GangDebug | None = None,
    guard: VerbGuard | None = None,
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
        _add_verbs(app, extender, metrics, url_prefix, guard or VerbGuard())
    _add_operations(app, metrics, ready)
    if debug is not None:
        add_debug_routes(app, debug)
    return app


def _add_verbs(
    app: ExtenderApp, extender: GangExtender, metrics: Metrics, url_prefix: str, guard: VerbGuard
) -> None:
    def verb(name: str, handle: Callable[[bytes], Any], *, waits: bool = False) -> None:
        endpoint = VerbEndpoint(name, handle, metrics, guard, waits=waits)

        async def route(request: Request) -> Response:
            # Reached only through FastAPI's own routing (ExtenderApp answers first).
            answered = await endpoint.answer_asgi(request.scope, request.receive)
            if answered is None:
                return Response(status_code=499)
            status, payload = answered
            return Response(payload, status_code=status, media_type="application/json")

        path = f"{url_prefix}/{name}"
        app.verb_paths[path] = endpoint
        app.add_route(path, route, methods=["POST"], name=name)

    read_args = ExtenderArgsReader()  # prioritize often repeats filter's body
    verb("filter", lambda body: extender.filter(read_args(body)))
    verb("prioritize", lambda body: extender.prioritize(read_args(body)))
    verb("preempt", lambda body: extender.preempt(parse_preempt_args(body)))
    verb("bind", lambda body: extender.bind(parse_binding_args(body)), waits=True)


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
