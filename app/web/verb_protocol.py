"""The verbs' HTTP fast path: kube-scheduler's POSTs answered by the HTTP protocol itself.

kube-scheduler waits for our filter and prioritize answers before it
schedules its next pod, and sends a bind for every pod, so what each request
costs us beyond the verb itself is paid three times per pod, on the 2 cores
we share with the control plane. Through uvicorn's ASGI machinery a request
costs a task, an event, a scope, a request-response cycle, and two socket
writes (head, then body); measured with a Go client on this machine, 120 µs
of our CPU and 235 µs per round trip, against 48 µs and 160 µs when the
protocol answers the request itself in one write.

So `gang-extender serve` runs uvicorn with this subclass of its httptools
protocol: a POST to a verb path is collected from the parser and answered
by the verb's VerbEndpoint (app/web/routes.py, the same code as the ASGI route),
head and body in one write. Filter, prioritize and preempt never wait, so
they are answered right in the parser's callback, without a task; bind
(which may wait in the permit gate) gets a task. Everything else (other
paths, `Expect: 100-continue`, upgrades) is uvicorn's as before.

HTTP/1.1 pipelining is not something kube-scheduler (Go's net/http) does;
a request that arrives on the connection while a bind is still waiting is
dropped and the connection closed after the bind's answer, which RFC 9112
(9.3.2) tells pipelining clients to expect and retry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.core.clock import monotonic
from app.web.routes import BodyTooLarge, VerbEndpoint

log = logging.getLogger(__name__)


# The status line and content type of every answer a VerbEndpoint gives.
_HEADS = {
    status: b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
    % (status, HTTPStatus(status).phrase.encode())
    for status in (200, 400, 413, 500, 503)
}


def verb_protocol(verbs: Mapping[str, VerbEndpoint]) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, answering POSTs to `verbs` (path -> endpoint) itself."""
    by_path = {path.encode(): endpoint for path, endpoint in verbs.items()}

    class VerbHttpProtocol(_VerbHttpProtocol):
        _verbs = by_path

    return VerbHttpProtocol


class _VerbHttpProtocol(HttpToolsProtocol):
    _verbs: Mapping[bytes, VerbEndpoint] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The verb request being read: its endpoint, body so far, and when it began.
        self._verb: VerbEndpoint | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._started = 0.0
        self._keep_alive = True
        # An answer is being computed; what arrives meanwhile is dropped (see above).
        self._answering = False
        self._discard = False
        self._close_after = False

    # ---- parser callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._answering or self._discard:
            self._discard = True
            self._close_after = True
            return
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if not self._discard:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._discard:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._discard:
            return
        verb = None
        if self.parser.get_method() == b"POST" and not self.expect_100_continue:
            verb = self._verbs.get(httptools.parse_url(self.url).path)
        if verb is None:
            super().on_headers_complete()
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # Pipelined behind a request uvicorn is still answering (see above).
            self._discard = True
            self.cycle.keep_alive = False
            return
        self._verb = verb
        self._chunks = []
        self._size = 0
        self._started = monotonic()
        self._keep_alive = (
            self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        )
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit():
                self._check_size(int(value), declared=True)
                break

    def on_body(self, body: bytes) -> None:
        if self._discard:
            return
        if self._verb is None:
            super().on_body(body)
            return
        self._chunks.append(body)
        self._check_size(self._size + len(body), declared=False)
        self._size += len(body)

    def on_message_complete(self) -> None:
        if self._discard:
            return
        verb = self._verb
        if verb is None:
            super().on_message_complete()
            return
        self._verb = None
        body = b"".join(self._chunks)
        self._chunks = []
        if not verb.waits:
            status, payload = verb.answer_now(body, self._started)
            self._write(status, payload, close=not self._keep_alive)
            return
        self._answering = True
        task = self.loop.create_task(self._answer(verb, body, self._started, self._keep_alive))
        # uvicorn waits for these on shutdown, as for its own request tasks.
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ---- connection ---------------------------------------------------------------------

    def shutdown(self) -> None:
        if self._answering:
            self._close_after = True  # answer first, then close
            return
        super().shutdown()

    # ---- answering ----------------------------------------------------------------------

    def _check_size(self, size: int, *, declared: bool) -> None:
        verb = self._verb
        assert verb is not None
        limit = verb.guard.max_request_bytes
        if size <= limit:
            return
        err = BodyTooLarge(limit, size if declared else None)
        status, payload = verb.too_large(err, self._started)
        self._verb = None
        self._chunks = []
        self._discard = True  # the rest of this body, and anything after it
        self._write(status, payload, close=True)

    async def _answer(self, verb: VerbEndpoint, body: bytes, started: float, keep: bool) -> None:
        try:
            status, payload = await verb.answer(body, started)
        finally:
            self._answering = False
        if self.transport.is_closing():
            verb.caller_gone()
            return
        self._write(status, payload, close=not keep or self._close_after)

    def _write(self, status: int, payload: bytes, *, close: bool) -> None:
        head = b"%scontent-length: %d\r\n%s\r\n" % (
            _HEADS[status],
            len(payload),
            b"connection: close\r\n" if close else b"",
        )
        self.transport.write(head + payload)
        if close:
            self.transport.close()
        else:
            # Counts the request and arms uvicorn's keep-alive timeout.
            self.on_response_complete()
