"""Looking at the line again after a change that may let gangs in line fit.

Capacity freed (a placed pod ended, a claim or a gang's wave was released), a node came
or grew, a Queue changed, a held gang joined the line: each asks for a look. The looks are
coalesced (one per LOOK_DELAY_SECONDS however many changes came), and the gangs the line
admits now are woken in line order: kube-scheduler retries their members (app/runtime/
wakeup.py), or their held members are released to it (app/runtime/holds.py).

A look walks the line up to the gangs it wakes: with 1,000 aged gangs that do not fit
ahead of a small one, 40-140 ms on a loaded 2-CPU machine. So it walks a slice at a time
(SLICE gangs), the event loop serving the verbs in between, over the line and the room as
they were when it began; a change meanwhile asks for the next look, which comes once this
one is done. Waking is advice: a gang woken on a room that changed meanwhile is decided by
the filter as any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.base.tasks import TaskSet, let_others_run
from app.core.clock import Clock
from app.runtime.holds import LineHolds
from app.runtime.line import Line
from app.runtime.wakeup import SiblingWaker

# The look comes this long after the first change asked for it.
LOOK_DELAY_SECONDS = 0.05
# Gangs in line woken at most per look (each costs a patch per pending member).
WAKE_LIMIT = 10
# ... while gangs are held: their members reach kube-scheduler only when woken, so a look
# must not leave admissible gangs held for the next one (100 small gangs behind 1,000 held
# big ones took ten looks, each walking the 1,000).
HELD_WAKE_LIMIT = 100
# Gangs of the line a look walks before it lets the event loop serve others.
SLICE = 200


class Reconsider:
    """Coalesced looks at the line, and the wake-ups they decide."""

    def __init__(
        self,
        line: Line,
        waker: SiblingWaker | None,
        before: Callable[[float], None],
        aging_seconds: float,
        clock: Clock,
    ) -> None:
        """`before(now)`: what the arbiter does first (it ends claims that lost members)."""
        self._line = line
        self._waker = waker
        self._before = before
        self._aging = aging_seconds
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None
        # A look is under way; a change asked for another meanwhile.
        self._looking = False
        self._again = False
        self._tasks = TaskSet()
        # Members held while their gang waits (set by the arbiter when there are any).
        self.holds: LineHolds | None = None

    def schedule(self) -> None:
        """Look at the line soon (nothing when a look is scheduled already, or no loop runs;
        during a look, once it is done)."""
        if self._handle is not None:
            return
        if self._looking:
            self._again = True
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._handle = loop.call_later(LOOK_DELAY_SECONDS, self._start)

    @property
    def pending(self) -> bool:
        """A look is scheduled or under way (tests wait on it)."""
        return self._handle is not None or self._looking

    def _start(self) -> None:
        self._handle = None
        self._looking = True
        self._tasks.spawn(self._look())

    async def _look(self) -> None:
        try:
            keys = await self._walk()
        finally:
            self._looking = False
        if self._again:
            self._again = False
            self.schedule()
        if self._waker is None:
            return
        if self.holds is not None:
            self.holds.chosen(keys)
        for key in keys:
            self._waker.wake(key)

    async def _walk(self) -> list[str]:
        """The gangs in line admitted now, the line walked a slice at a time."""
        now = self._clock()
        self._before(now)
        if self._waker is None or not self._line.waiting:
            return []
        holds = self.holds
        limit = WAKE_LIMIT
        if holds is not None and holds.enabled:
            # Gangs chosen lately and not admitted yet are set aside again: look past them.
            limit = HELD_WAKE_LIMIT + holds.set_aside(now)
        keys: list[str] = []
        for step in self._line.wake_steps(now, self._aging, limit, SLICE):
            if step is None:
                await let_others_run()
            else:
                keys = step
        return keys
