"""Keeping the watch caches out of the garbage collector's full passes."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Sequence

from app.core.clock import monotonic
from app.kube.reflector import Reflector

log = logging.getLogger(__name__)


async def freeze_heap_when_synced(
    reflectors: Sequence[Reflector], poll_seconds: float = 0.5, give_up_seconds: float = 600
) -> None:
    """Once every cache has its first list, keep what they hold out of full GC passes.

    The caches hold tens of thousands of long-lived objects (a record, its
    requests and labels per pod), and every full collection walks them all:
    40 ms with 50,000 pods, spent inside whichever verb call was running.
    gc.freeze() after the first lists moves them out of the collector's
    view; records replaced later are freed by reference counting as before.
    Once only: whatever is alive at that moment stays outside the collector
    for good, so freezing again and again would keep cyclic garbage of
    requests in flight at each freeze.
    """
    deadline = monotonic() + give_up_seconds
    while not all(r.synced for r in reflectors):
        if monotonic() > deadline:
            return
        await asyncio.sleep(poll_seconds)
    gc.collect()
    gc.freeze()
    log.info("caches listed: %d objects frozen", gc.get_freeze_count(), extra={"verb": None})
