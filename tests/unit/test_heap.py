"""The extender keeps its caches out of full GC passes once listed, and runs those on its clock."""

import asyncio
import gc
from dataclasses import dataclass
from typing import Any, cast

import pytest

from app.ops.heap import (
    collect_fully_every,
    freeze_heap_when_synced,
    full_collections_deferred,
    keep_heap,
)


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


def test_full_collections_deferred_stops_pythons_own_and_restores_them() -> None:
    before = gc.get_threshold()
    with full_collections_deferred():
        young, middle, full = gc.get_threshold()
        assert (young, middle) == before[:2]
        assert full > 10**8  # never reached: no full pass of Python's own
    assert gc.get_threshold() == before


async def test_full_passes_run_on_their_own_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []

    def collect(*generation: int) -> int:
        calls.append(generation)
        return 0

    before = gc.get_threshold()
    monkeypatch.setattr(gc, "collect", collect)
    task = asyncio.create_task(collect_fully_every(0.01))
    await asyncio.sleep(0.1)
    assert gc.get_threshold()[2] > 10**8  # deferred while the task runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) >= 3  # a full pass (no generation argument) every 10 ms
    assert all(call == () for call in calls)
    assert gc.get_threshold() == before  # and Python's own rule back once cancelled


async def test_keep_heap_freezes_then_collects_on_its_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc.unfreeze()
    seen: list[str] = []

    def collect(*generation: int) -> int:
        seen.append("collect")
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(gc, "freeze", lambda: seen.append("freeze"))
    task = asyncio.create_task(keep_heap(cast(Any, [FakeReflector(synced=True)]), 0.01))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen[:2] == ["collect", "freeze"]
    assert seen.count("collect") >= 3  # then the periodic passes


async def test_keep_heap_with_interval_zero_leaves_pythons_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    monkeypatch.setattr(gc, "freeze", lambda: None)
    await asyncio.wait_for(keep_heap(cast(Any, [FakeReflector(synced=True)]), 0), 1)
    assert gc.get_threshold() == before
