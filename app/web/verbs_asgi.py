"""The verbs as plain ASGI: kube-scheduler's POSTs answered before FastAPI's routing.

kube-scheduler waits for our filter and prioritize answers before it
schedules its next pod, and sends a bind for every pod, so what each request
costs beyond the verb itself is paid three times per pod, on the 2 cores we
share with the control plane. The verbs take raw bytes and answer every
failure themselves (400 with {"Error": ...}, which kube-scheduler shows in the
pod's events; never a 500 for bad input), so FastAPI's exception handling,
route table and request objects add nothing to them. VerbRouter is the top
of FastAPI's middleware stack (app/web/routes.py): FastAPI hands it every
request ahead of its own middleware and routing; it answers the verbs and
passes the rest on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.base.metrics import Metrics
from app.core.clock import monotonic
from app.web.wire import WireError

log = logging.getLogger(__name__)

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
    for header, value in scope["headers"]:
        if header == b"content-length":
            size = int(value) if value.isdigit() else -1
            if size > limit:
                raise BodyTooLarge(limit, size)
            break
    message: Message = await receive()
    if not message.get("more_body", False):  # the usual case: the body came in one piece
        if message["type"] == "http.disconnect":
            return None
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge(limit)
        return body
    chunks: list[bytes] = []
    received = 0
    while True:
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()


class VerbEndpoint:
    """One verb: decode the body, answer, count.

    The answer of every verb goes through here, so the error handling and
    the metrics are the same for filter, prioritize, preempt and bind.
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
        """answer() of a verb that never waits (filter, prioritize, preempt), without awaiting.

        These are answered while kube-scheduler's scheduling cycle waits;
        a coroutine per request is a measurable share of their cost.
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

    def _count(self, status: int, payload: Any, started: float) -> tuple[int, bytes]:
        encoded = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
        self._requests[status].inc()
        self._duration.observe(monotonic() - started)
        return status, encoded


_JSON = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")
_NOT_ALLOWED = orjson.dumps({"detail": "Method Not Allowed"})


class VerbRouter:
    """ASGI middleware: POSTs to the verb paths answered here, everything else by `app`.

    A verb answer is two sends (head, then body) and no task of its own; a
    verb that waits (bind) asks, once answered, whether the caller is still
    there to read it. A body over the limit is refused with the connection
    closed: the rest of it is never read.
    """

    def __init__(self, app: ASGIApp, verbs: Mapping[str, VerbEndpoint]) -> None:
        """verbs: URL path -> endpoint."""
        self.app = app
        self.verbs = dict(verbs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            # As FastAPI answers a known path with another method.
            await _respond(send, 405, _NOT_ALLOWED, (b"allow", b"POST"))
            return
        started = monotonic()
        try:
            body = await read_body(scope, receive, verb.guard.max_request_bytes)
        except BodyTooLarge as err:
            await _respond(send, *verb.too_large(err, started), _CLOSE)
            return
        if body is None:
            verb.caller_gone()
        elif not verb.waits:
            await _respond(send, *verb.answer_now(body, started))
        elif (answered := await _answer_unless_gone(verb, body, started, receive)) is not None:
            await _respond(send, *answered)


async def _answer_unless_gone(
    verb: VerbEndpoint, body: bytes, started: float, receive: Receive
) -> tuple[int, bytes] | None:
    """verb.answer(), or None (counted) if the caller went away while it waited."""
    answered = await verb.answer(body, started)
    if _caller_gone(receive):
        verb.caller_gone()
        return None
    return answered


def _caller_gone(receive: Receive) -> bool:
    """Whether the caller has gone, found out without waiting.

    Once the body is read, the next message the server has for us is
    http.disconnect, and a server that saw the caller go has it at once
    (uvicorn, httpx's ASGI transport): one step of receive() tells. A
    receive() that would wait means the caller is still there; it is closed
    unawaited. (A task awaiting receive() through the wait cost every bind a
    task, and each gang member waiting in the gate about 1 KB.)
    """
    step = receive()
    if not isinstance(step, Coroutine):
        return False  # a server of another kind: the 499 is not counted, nothing else differs
    try:
        step.send(None)
    except StopIteration as done:
        message = done.value
        return isinstance(message, dict) and message.get("type") == "http.disconnect"
    except Exception:  # the server's own trouble: the answer is sent all the same
        log.debug("receive() failed while asking whether the caller is there", exc_info=True)
        return False
    step.close()
    return False


async def _respond(send: Send, status: int, payload: bytes, *extra: tuple[bytes, bytes]) -> None:
    headers = [_JSON, (b"content-length", b"%d" % len(payload)), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
