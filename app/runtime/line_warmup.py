"""The line warmed ahead of the verbs, a slice at a time: its gangs built and its walk done.

A fresh gang's admission stands behind the whole line: it needs every gang
in line built from its members (app/runtime/line.py) and the line walked
(app/runtime/line_walk.py), both kept between calls. After a start, a relist
or a node change nothing of it is kept, and the first admission built and
walked 10,000 gangs at once: most of a second of the event loop every verb
and watch waited for (BENCHMARKS.md). The warm-up does that work in slices
of a few milliseconds, the loop free between them, soon after anything it
rests on changes; an admission that comes first finishes the work itself,
exactly as before (the kept walk is redone from the first gang a change
reaches, so a walk warmed over inputs that changed since is only wasted,
never wrong).
"""

from __future__ import annotations

import logging

from app.base.tasks import Periodic, let_others_run
from app.core.clock import Clock
from app.core.state import ClusterState
from app.runtime.line import Line
from app.runtime.line_pass import LineAt
from app.runtime.revision import Revision

log = logging.getLogger(__name__)

# Gangs built or walked per slice: a few milliseconds of the event loop.
_SLICE = 100
# Nodes whose free bins are built per slice, after a start or a node change (5,000 at
# once took 22-55 ms on a quiet machine, 500 about 5 ms).
_NODE_SLICE = 500
# Gangs paired with their queue, judged by it or ordered per slice, before the walk: these
# passes cost about a microsecond a gang (10,000 at once: 15-32 ms, BENCHMARKS.md).
_PASS_SLICE = 1000
# How often the warm-up looks whether anything changed.
WARM_SECONDS = 0.25


class LineWarmup:
    """Keeps the line's gangs and walk current in slices (see the module docstring)."""

    def __init__(
        self,
        state: ClusterState,
        line: Line,
        revision: Revision,
        clock: Clock,
        aging_seconds: float,
    ) -> None:
        self._state = state
        self._line = line
        self._revision = revision
        self._clock = clock
        self._aging = aging_seconds
        # What the last whole warm-up rested on: (change stamp, revision); None: none yet.
        self._warmed: tuple[int, int] | None = None
        # The state's schedulable_version the last walk warmed was over: nodes that came,
        # went, or were cordoned or uncordoned move every free bin, so the whole line is
        # walked again (10,000 gangs: a third of a second at once).
        self._schedulable = -1
        # A failed warm-up is logged; the verbs do the work themselves meanwhile.
        self._loop = Periodic(
            self.warm,
            WARM_SECONDS,
            name="line-warmup",
            logger=log,
            failure="warming the line failed",
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def _mark(self) -> tuple[int, int]:
        """The state's change stamp (pods, nodes, groups) and the arbiter's revision: what a
        warm-up rests on."""
        return self._state.change_stamp, self._revision.version

    async def warm(self, most: int = _SLICE) -> None:
        """Build the nodes' free bins after a start or a node change (_NODE_SLICE a slice),
        then the gangs in line, `most` a slice, and walk the line the same way when no
        walk of it is kept (after a start, or once the line grew past the walk) or nodes
        came, went or were cordoned; nothing to do when nothing changed since the last time.

        Other changes (a pod placed or gone) are left to the next admission: the walk is
        redone from the first gang they reach, and building the line's contest here at
        each would hold the loop as long as an admission does."""
        line = self._line
        mark = self._mark()
        if mark == self._warmed:
            return
        # The nodes' free bins, which every admission reads, line or none.
        while not self._state.warm_room(_NODE_SLICE):
            await let_others_run()
        # And after the last: with what follows (the tally, the walk's first slice) it held the
        # loop 12-17 ms after a cordon.
        await let_others_run()
        if not line.waiting:
            return
        book = line.queues
        if book is not None:
            await book.catch_up()  # the tally a queued line is judged by, in slices too
        while not line.learn(most):
            await let_others_run()
        mark = self._mark()
        schedulable = self._state.schedulable_version
        if line.walk.length < len(line.waiting) // 2 or schedulable != self._schedulable:
            await self._walk(most, mark)
            self._schedulable = schedulable
        self._warmed = mark

    async def _walk(self, most: int, mark: tuple[int, int]) -> None:
        """The line walked ahead, `most` gangs a slice, over the contest a fresh gang's
        admission would weigh (its queue's verdict on each gang aside). The queues' verdict
        on every gang and the line's order go first, _PASS_SLICE gangs a slice, kept where
        the admission and the walk look for them: at once, each held the event loop 15-32 ms
        with 10,000 gangs in line (BENCHMARKS.md)."""
        line = self._line
        contest = line.contest(exclude="")
        if line.queues is not None:
            for allowed in line.allowed_steps(contest.line, contest.holders, _PASS_SLICE):
                if allowed is not None:
                    contest.line = allowed
                elif not await self._still(mark):
                    return
        over = LineAt.of(contest, self._clock(), self._aging)
        for _ in line.walk.order_ahead(over, _PASS_SLICE):
            if not await self._still(mark):
                return
        while not line.walk.warm(over, most):
            if not await self._still(mark):
                return

    async def _still(self, mark: tuple[int, int]) -> bool:
        """Let others run; False: what the warm-up works over changed meanwhile (the next
        round starts afresh: going on would only be wasted)."""
        await let_others_run()
        return self._mark() == mark
