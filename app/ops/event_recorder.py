"""The Event runner: writes what app/core/events.py decided, from worker threads.

`record` is called on the event loop and never blocks or raises: it asks
the EventAggregator what the occurrence becomes, then hands the write to a
thread pool. A write that fails is logged and counted, never raised into
the verbs. While a write for an Event is in flight, further increments are
folded into the next one, so a burst costs at most two calls per Event.
The API writer itself is app/kube/events.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from app.core.clock import Clock, wall
from app.core.events import EventAggregator, EventEntry, ObjectRef, event_body
from app.kube.errors import NotFound
from app.ops.metrics import Metrics

log = logging.getLogger(__name__)


class EventWriter(Protocol):
    """Blocking API calls; the recorder runs them on worker threads."""

    def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Merge-patch an Event; raise NotFound when it no longer exists."""


Submit = Callable[[Callable[[], None]], object]
"""Runs a blocking call elsewhere (ThreadPoolExecutor.submit in production)."""


class EventRecorder:
    def __init__(
        self,
        writer: EventWriter,
        submit: Submit,
        metrics: Metrics,
        *,
        clock: Clock = wall,
        window_seconds: float = 600.0,
        burst: int = 25,
        refill_seconds: float = 300.0,
        cache_size: int = 4096,
    ) -> None:
        self._writer = writer
        self._submit = submit
        self._metrics = metrics
        self._clock = clock
        # Touched from the event loop (record) and worker threads (_send).
        self._lock = threading.Lock()
        self._aggregator = EventAggregator(
            window_seconds=window_seconds,
            burst=burst,
            refill_seconds=refill_seconds,
            cache_size=cache_size,
        )

    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Queue an Event (or a count increment of an identical one); never blocks or raises."""
        now = self._clock()
        with self._lock:
            outcome, entry = self._aggregator.add(ref, type_, reason, message, now)
            self._metrics.events.labels(outcome).inc()
            if entry is None:
                log.debug("event %s on %s %s dropped (rate limit)", reason, ref.kind, ref.name)
                return
            if entry.in_flight:
                return  # the running _send picks the new count up
            entry.in_flight = True
        try:
            self._submit(lambda: self._send(entry))
        except RuntimeError as err:  # the executor is shut down: we are stopping
            log.debug("event %s not written: %s", reason, err)
            with self._lock:
                entry.in_flight = False

    def _send(self, entry: EventEntry) -> None:
        while True:
            with self._lock:
                if entry.sent_count == entry.count:
                    entry.in_flight = False
                    return
                count, create = entry.count, not entry.created
                body = event_body(entry)
            try:
                if create:
                    self._writer.create(entry.ref.namespace, body)
                else:
                    try:
                        self._writer.patch(
                            entry.ref.namespace,
                            entry.name,
                            {"count": body["count"], "lastTimestamp": body["lastTimestamp"]},
                        )
                    except NotFound:  # events expire after an hour
                        self._writer.create(entry.ref.namespace, body)
            except Exception as err:
                self._metrics.events.labels("failed").inc()
                log.warning(
                    "writing event %s on %s %s/%s failed: %s",
                    entry.reason,
                    entry.ref.kind,
                    entry.ref.namespace,
                    entry.ref.name,
                    err,
                )
                with self._lock:
                    entry.in_flight = False
                    # Give up on this count; the next identical event tries again.
                    entry.sent_count = entry.count
                return
            with self._lock:
                entry.created = True
                entry.sent_count = count
