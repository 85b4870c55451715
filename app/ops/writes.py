"""Shutdown of the API writers (Events, PodGroup status): finish what is under way, briefly.

One rule for every writer, so that none holds shutdown up longer than the
others: an unreachable API server would otherwise keep the process alive for
all of the client's retries.
"""

from __future__ import annotations

import asyncio
import logging

from app.base.tasks import TaskSet

log = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 5.0


async def finish_writes(writes: TaskSet, what: str) -> None:
    """Wait for `writes` for STOP_WAIT_SECONDS at most; what is left then is dropped."""
    try:
        await asyncio.wait_for(writes.drain(), STOP_WAIT_SECONDS)
    except TimeoutError:
        log.debug("%s still being written at shutdown were dropped", what)
