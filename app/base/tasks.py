"""Background work: a set of tasks let finish at shutdown, and a step repeated every N seconds.

asyncio keeps only weak references to running tasks: a task nobody holds
may be collected half-way. The gate (binding waves), wake-up (touches) and
the preemption follower (evictions) each start such fire-and-forget work
from synchronous listeners, and must wait for it before the process exits
(TaskSet). The line's warm-up, the Queue status writer and the PodGroup
status reconciler each repeat one step on a period until shutdown
(Periodic). Work done in slices lets the others run between two slices
(let_others_run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

# How long let_others_run() lets the loop go on without the caller: anything above zero
# (an idle loop then waits up to a millisecond: epoll counts in whole milliseconds).
_BREATH_SECONDS = 0.0001


async def let_others_run() -> None:
    """Between two slices of long work: let everything ready, or made ready by I/O or a
    timer meanwhile, run before the next slice, chains of callbacks included.

    asyncio.sleep(0) only puts the caller at the end of the ready queue. A verb's request
    is a chain of callbacks (the socket read, the protocol, the task that answers), each
    scheduled by the one before at the loop's next iteration, behind the caller's next
    slice: it waited for a slice per link (bench/run.py --loop-rows read twice a slice's
    length). A timer puts the next slice behind the whole chain.
    """
    await asyncio.sleep(_BREATH_SECONDS)


class TaskSet:
    """Holds each spawned task until it is done; drain() waits for all of them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `coro` on the running loop; it handles (logs) its own errors."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait until no task is left, including tasks spawned while waiting.

        Errors are not raised here: each task's own code reports them.
        """
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class Periodic:
    """Runs `step` at once and then again `seconds` after each run ends, until stop().

    A step that raises is logged with its traceback (`failure` on `logger`,
    the owner's logger, so the line names who failed) and the next run comes
    on time: one bad turn must not end the loop silently, since nothing else
    would start it again. start() twice runs one loop; stop() cancels the
    loop and waits until it has ended, so nothing of it runs after.
    """

    def __init__(
        self,
        step: Callable[[], Awaitable[None]],
        seconds: float,
        *,
        name: str,
        logger: logging.Logger,
        failure: str,
    ) -> None:
        self._step = step
        self._seconds = seconds
        self._name = name
        self._log = logger
        self._failure = failure
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Start the loop on the running event loop; nothing when it runs already."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        """Cancel the loop and wait for it to end; nothing when it does not run."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except Exception:  # logged; the next run comes on time
                self._log.exception(self._failure)
            await asyncio.sleep(self._seconds)
