"""The extender keeps its caches out of full GC passes once they are listed (app/server.py)."""

import asyncio
import gc
from dataclasses import dataclass
from typing import Any, cast

from app.ops.heap import freeze_heap_when_synced


@dataclass
class FakeReflector:
    synced: bool = False


async def test_the_heap_is_frozen_once_every_cache_is_listed() -> None:
    gc.unfreeze()
    reflectors = [FakeReflector(), FakeReflector()]
    try:
        task = asyncio.create_task(freeze_heap_when_synced(cast(Any, reflectors), 0.01))
        await asyncio.sleep(0.05)
        assert gc.get_freeze_count() == 0  # one cache is still listing
        reflectors[0].synced = True
        await asyncio.sleep(0.05)
        assert gc.get_freeze_count() == 0
        reflectors[1].synced = True
        await asyncio.wait_for(task, 1)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


async def test_caches_that_never_list_freeze_nothing() -> None:
    gc.unfreeze()
    await freeze_heap_when_synced(cast(Any, [FakeReflector()]), 0.01, give_up_seconds=0.03)
    assert gc.get_freeze_count() == 0
