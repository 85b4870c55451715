"""Volcano Queues' status counts (pending, inqueue, running, allocated), written by the leader.

Volcano's Queue CRD has a status subresource; without Volcano's controller
nobody else fills it, and `kubectl get queue -o yaml` is where an admin
looks first. Every INTERVAL_SECONDS the counts are taken from the queue book
(app/runtime/queues/book.py) and only a Queue whose status, as the watch shows it,
differs is patched (`status.state` is left to its owner): a Queue deleted and
created again under the same name, or edited by hand, is written again.
Writes are awaited on the event loop, one Queue after the other. Between
ticks the writer keeps the book's tally current in slices (QueueBook.catch_up).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from app.base.tasks import Periodic
from app.core.contention import Holder
from app.kube.errors import ApiError
from app.runtime.queues.book import QueueBook

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 2.0
# How often the queues' tally is brought up to date in slices between ticks.
WARM_SECONDS = 0.25


class QueueStatusPatch(Protocol):
    async def patch(self, name: str, status: dict[str, Any]) -> None: ...


class QueueStatusWriter:
    def __init__(
        self,
        book: QueueBook,
        holders: Callable[[], Sequence[Holder]],
        api: QueueStatusPatch,
        is_leader: Callable[[], bool],
        *,
        interval_seconds: float = INTERVAL_SECONDS,
    ) -> None:
        self._book = book
        self._holders = holders
        self._api = api
        self._is_leader = is_leader
        # Between ticks the tally is kept current a slice at a time (every WARM_SECONDS), so
        # that neither a tick nor a verb's admission walks every pod at once on the event
        # loop (after a start or a relist: most of a second): a tick every `_steps` turns.
        self._steps = max(1, round(interval_seconds / WARM_SECONDS))
        self._turns = 0
        self._loop = Periodic(
            self._turn,
            interval_seconds / self._steps,
            name="queue-status",
            logger=log,
            failure="Queue status upkeep failed",
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _turn(self) -> None:
        """Catch the tally up; once `_steps` turns (sleeps) have passed since the last tick
        (or the start), tick too and catch up again after the tick's writes."""
        await self._book.catch_up()
        self._turns += 1
        if self._turns > self._steps:
            self._turns = 1
            await self.tick()
            await self._book.catch_up()

    async def tick(self) -> None:
        """Patch every Queue whose status shows other counts than the book's."""
        if not self._book.active or not self._is_leader():
            return
        for name, status in self._book.statuses(self._holders()).items():
            if self._book.observed_status(name) == status:
                continue
            try:
                await self._api.patch(name, status)
            except ApiError as err:  # logged; tried again on the next tick
                log.warning("Queue %s status not written: %s", name, err, extra={"queue": name})
