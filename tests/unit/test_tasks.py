import asyncio
import itertools
import logging

import pytest

from app.base.tasks import Periodic, TaskSet, let_others_run


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


async def test_periodic_runs_its_step_at_once_and_then_every_period() -> None:
    runs: list[float] = []
    loop = asyncio.get_running_loop()

    async def step() -> None:
        runs.append(loop.time())

    periodic = Periodic(step, 0.02, name="every", logger=logging.getLogger("t"), failure="x")
    assert not periodic.running
    periodic.start()
    periodic.start()  # a second start keeps the one loop
    assert periodic.running
    await asyncio.sleep(0)
    assert len(runs) == 1  # the first run comes at once
    await asyncio.sleep(0.15)
    await periodic.stop()
    assert 3 <= len(runs) <= 9
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    assert min(gaps) >= 0.019  # one loop: no run closer to the last than the period


async def test_a_failing_step_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0

    async def step() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("boom")

    owner = logging.getLogger("tests.owner")
    periodic = Periodic(step, 0.01, name="flaky", logger=owner, failure="upkeep failed")
    with caplog.at_level(logging.ERROR, logger="tests.owner"):
        periodic.start()
        await asyncio.sleep(0.08)
        await periodic.stop()
    assert runs >= 3
    failures = [r for r in caplog.records if r.name == "tests.owner"]
    assert [r.getMessage() for r in failures] == ["upkeep failed"]
    assert failures[0].exc_info is not None and isinstance(failures[0].exc_info[1], RuntimeError)


async def test_stop_cancels_a_running_step_and_waits_for_it_to_end() -> None:
    entered, ended = asyncio.Event(), asyncio.Event()
    runs = 0

    async def step() -> None:
        nonlocal runs
        runs += 1
        entered.set()
        try:
            await asyncio.Event().wait()  # never set: only the cancel ends it
        finally:
            await asyncio.sleep(0.01)  # clean-up that stop() must wait for
            ended.set()

    periodic = Periodic(step, 0.01, name="hung", logger=logging.getLogger("t"), failure="x")
    periodic.start()
    await asyncio.wait_for(entered.wait(), 1)
    await periodic.stop()
    assert ended.is_set() and not periodic.running
    await asyncio.sleep(0.03)
    assert runs == 1  # nothing of the loop runs after stop()
    await periodic.stop()  # a second stop is harmless


async def test_periodic_can_start_again_after_stop() -> None:
    runs = 0

    async def step() -> None:
        nonlocal runs
        runs += 1

    periodic = Periodic(step, 1.0, name="again", logger=logging.getLogger("t"), failure="x")
    periodic.start()
    await asyncio.sleep(0)
    await periodic.stop()
    periodic.start()
    await asyncio.sleep(0)
    await periodic.stop()
    assert runs == 2


async def test_between_two_slices_a_chain_of_callbacks_started_meanwhile_runs_to_its_end() -> None:
    """A request is a chain of callbacks, each scheduling the next: all of it runs before the
    next slice of long work (one asyncio.sleep(0) let one link run a slice)."""
    loop = asyncio.get_running_loop()
    order: list[str] = []

    def link(n: int) -> None:
        order.append(f"link {n}")
        if n < 4:
            loop.call_soon(link, n + 1)

    async def long_work() -> None:
        for i in range(3):
            order.append(f"slice {i}")
            if i == 0:
                loop.call_soon(link, 1)  # a request read during the first slice
            await let_others_run()

    await long_work()
    assert order == [
        "slice 0",
        *(f"link {n}" for n in range(1, 5)),
        "slice 1",
        "slice 2",
    ]
