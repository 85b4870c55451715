"""The Event runner: writes what app/core/events.py decided, in tasks on the event loop.

`record` is called on the event loop and never blocks or raises: it asks
the EventAggregator what the occurrence becomes, then starts a task that
writes it. A write that fails is logged and counted, never raised into
the verbs. While a write for an Event is in flight, further increments are
folded into the next one, so a burst costs at most two calls per Event.
The API writer itself is app/kube/events.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from app.base.metrics import Metrics
from app.base.tasks import TaskSet
from app.core.clock import Clock, wall
from app.core.event_aggregation import EventAggregator, EventEntry, ObjectRef, event_body
from app.kube.errors import NotFound
from app.ops.writes import finish_writes

log = logging.getLogger(__name__)


class EventWriter(Protocol):
    """The API calls; the recorder awaits them in its tasks."""

    async def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Merge-patch an Event; raise NotFound when it no longer exists."""


def default_aggregator() -> EventAggregator:
    """client-go's EventCorrelator limits, so our Events read like the rest of the cluster's:
    an identical Event within 10 minutes is a count on the first; each object and reason
    may record 25 occurrences at once, then one every 5 minutes."""
    return EventAggregator(window_seconds=600.0, burst=25, refill_seconds=300.0, cache_size=4096)


class EventRecorder:
    def __init__(
        self,
        writer: EventWriter,
        metrics: Metrics,
        *,
        clock: Clock = wall,
        aggregator: EventAggregator | None = None,
    ) -> None:
        """aggregator: which Event an occurrence becomes (default_aggregator() if None)."""
        self._writer = writer
        self._metrics = metrics
        self._clock = clock
        self._sends = TaskSet()
        self._aggregator = aggregator if aggregator is not None else default_aggregator()

    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Queue an Event (or a count increment of an identical one); never blocks or raises."""
        outcome, entry = self._aggregator.add(ref, type_, reason, message, self._clock())
        self._metrics.events.labels(outcome).inc()
        if entry is None:
            log.debug("event %s on %s %s dropped (rate limit)", reason, ref.kind, ref.name)
            return
        if entry.in_flight:
            return  # the running _send picks the new count up
        try:
            asyncio.get_running_loop()
        except RuntimeError as err:  # no loop: we are stopping
            log.debug("event %s not written: %s", reason, err)
            return
        entry.in_flight = True
        self._sends.spawn(self._send(entry))

    async def drain(self) -> None:
        """Wait for the writes under way (tests; shutdown uses stop)."""
        await self._sends.drain()

    async def stop(self) -> None:
        await finish_writes(self._sends, "events")

    async def _send(self, entry: EventEntry) -> None:
        while entry.sent_count != entry.count:
            count, create = entry.count, not entry.created
            body = event_body(entry)
            try:
                await self._write(entry, body, create)
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
                # Give up on this count; the next identical event tries again.
                entry.sent_count = entry.count
                break
            entry.created = True
            entry.sent_count = count
        entry.in_flight = False

    async def _write(self, entry: EventEntry, body: dict[str, Any], create: bool) -> None:
        if create:
            await self._writer.create(entry.ref.namespace, body)
            return
        try:
            await self._writer.patch(
                entry.ref.namespace,
                entry.name,
                {"count": body["count"], "lastTimestamp": body["lastTimestamp"]},
            )
        except NotFound:  # events expire after an hour
            await self._writer.create(entry.ref.namespace, body)
