"""A set of background tasks that a component starts and lets finish at shutdown.

asyncio keeps only weak references to running tasks: a task nobody holds
may be collected half-way. The gate (binding waves), wake-up (touches) and
the preemption follower (evictions) each start such fire-and-forget work
from synchronous listeners, and must wait for it before the process exits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


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
