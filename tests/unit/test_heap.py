"""The serve process keeps its long-lived caches out of full GC passes (app/cli.py)."""

import asyncio
import gc

from app.cli import freeze_heap_periodically


async def test_survivors_are_frozen_soon_after_start_and_again_later() -> None:
    gc.unfreeze()
    keeper = asyncio.create_task(freeze_heap_periodically(0.02))
    try:
        await asyncio.sleep(0.05)
        first = gc.get_freeze_count()
        assert first > 0
        kept = [object() for _ in range(10)]  # tracked survivors made after the first pass
        kept.append([kept])
        await asyncio.sleep(0.05)
        assert gc.get_freeze_count() > first
    finally:
        keeper.cancel()
        gc.unfreeze()
