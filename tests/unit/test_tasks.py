import asyncio

import pytest

from app.base.tasks import TaskSet


async def test_drain_waits_for_tasks_spawned_while_draining() -> None:
    tasks = TaskSet()
    done: list[str] = []

    async def second() -> None:
        await asyncio.sleep(0.01)
        done.append("second")

    async def first() -> None:
        await asyncio.sleep(0)
        tasks.spawn(second())
        done.append("first")

    tasks.spawn(first())
    assert len(tasks) == 1
    await tasks.drain()
    assert done == ["first", "second"] and len(tasks) == 0


async def test_a_failing_task_neither_stops_the_drain_nor_stays_held() -> None:
    tasks = TaskSet()
    finished = asyncio.Event()

    async def fails() -> None:
        raise RuntimeError("boom")

    async def finishes() -> None:
        await asyncio.sleep(0.01)
        finished.set()

    failing = tasks.spawn(fails())
    tasks.spawn(finishes())
    await tasks.drain()
    assert finished.is_set() and len(tasks) == 0
    with pytest.raises(RuntimeError):
        failing.result()


async def test_drain_of_an_empty_set_returns_at_once() -> None:
    await asyncio.wait_for(TaskSet().drain(), 1)
