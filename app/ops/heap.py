"""Keeping the garbage collector's full passes out of the verbs.

Two measures, both about the collector's full (generation 2) passes, which
walk every container object not frozen and run inside whichever verb call
happens to allocate at that moment:

- The watch caches are frozen once first listed (freeze_heap_when_synced).
- Python's own full passes are then replaced by one every
  --full-gc-interval-seconds (collect_fully_every). Python starts a full
  pass when the objects promoted since the last one exceed a quarter of
  the long-lived ones, but frozen objects do not count as long-lived: with
  the caches frozen, every tenth generation-1 pass became a full one. Each
  walked what was built after the freeze (a record per pod changed since,
  the free room kept per node: at 5,000 nodes about 1 ms idle and up to
  4 ms inside a preempt call), so about one preempt call in ten paid for it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from app.core.clock import monotonic
from app.kube.reflector import Reflector

log = logging.getLogger(__name__)

# Generation-1 passes before Python would consider a full one: never, in practice.
_NEVER = 1_000_000_000


async def keep_heap(reflectors: Sequence[Reflector], full_gc_interval_seconds: float) -> None:
    """Freeze the caches once listed, then run the full passes on our own clock (0: Python's)."""
    await freeze_heap_when_synced(reflectors)
    if full_gc_interval_seconds > 0:
        await collect_fully_every(full_gc_interval_seconds)


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
    freeze_heap()
    log.info("caches listed: %d objects frozen", gc.get_freeze_count(), extra={"verb": None})


def freeze_heap() -> None:
    """Collect, then freeze what is alive: nothing cyclic that was already garbage stays."""
    gc.collect()
    gc.freeze()


@contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Python starts no full pass of its own meanwhile; generations 0 and 1 run as before.

    Cyclic garbage that outlives a generation-1 pass then waits for the next
    gc.collect(): the caller owes one now and then (collect_fully_every).
    """
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, full)


async def collect_fully_every(seconds: float) -> None:
    """A full pass every `seconds`, and none of Python's own in between; runs until cancelled.

    A pass still blocks the loop for as long as it walks, but once in
    `seconds` rather than after every ten generation-1 passes (about 70,000
    container objects allocated: in bench/run.py, every eleventh preempt
    call at 5,000 nodes).
    """
    with full_collections_deferred():
        while True:
            await asyncio.sleep(seconds)
            started = monotonic()
            freed = gc.collect()
            log.debug(
                "full garbage collection: %d objects freed in %.1f ms",
                freed,
                (monotonic() - started) * 1000,
                extra={"verb": None},
            )
