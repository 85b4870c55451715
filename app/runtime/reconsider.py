"""Looking at the line again after a change that may let gangs in line fit.

Capacity freed (a placed pod ended, a claim or a gang's wave was released), a node came
or grew, a Queue changed, a held gang joined the line: each asks for a look. The looks are
coalesced (one per LOOK_DELAY_SECONDS however many changes came), and the gangs the line
admits now are woken in line order: kube-scheduler retries their members (app/runtime/
wakeup.py), or their held members are released to it (app/runtime/holds.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.core.clock import Clock
from app.runtime.holds import LineHolds
from app.runtime.line import Line
from app.runtime.wakeup import SiblingWaker

# The look comes this long after the first change asked for it.
LOOK_DELAY_SECONDS = 0.05
# Gangs in line woken at most per look (each costs a patch per pending member).
WAKE_LIMIT = 10


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
        # Members held while their gang waits (set by the arbiter when there are any).
        self.holds: LineHolds | None = None

    def schedule(self) -> None:
        """Look at the line soon (nothing when a look is scheduled already, or no loop runs)."""
        if self._handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._handle = loop.call_later(LOOK_DELAY_SECONDS, self._look)

    @property
    def pending(self) -> bool:
        """A look is scheduled and has not run yet (tests wait on it)."""
        return self._handle is not None

    def _look(self) -> None:
        self._handle = None
        now = self._clock()
        self._before(now)
        if self._waker is None or not self._line.waiting:
            return
        holds = self.holds
        # Gangs chosen lately and not admitted yet are set aside again: look past them.
        limit = WAKE_LIMIT + (holds.set_aside(now) if holds is not None else 0)
        keys = self._line.to_wake(now, self._aging, limit)
        if holds is not None:
            holds.chosen(keys)
        for key in keys:
            self._waker.wake(key)
