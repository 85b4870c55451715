"""Which gangs in line their queue lets in, kept between calls and judged in slices if asked.

Every fresh admission (and the line's warm-up, app/runtime/line_warmup.py)
asks which gangs of the line their queue's share lets in (app/core/queues.py
enqueue). One verdict per queue and request shape serves all gangs alike, and
the last answer is handed again while the line is the very same list and no
verdict changed; judging 10,000 gangs afresh still costs 20-32 ms, so the
warm-up does it a slice at a time (`steps`), the event loop free between.

No I/O; the queue book (app/runtime/queues/book.py) holds one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence

from app.core.contention import Gang
from app.core.queues import QueueView, enqueue
from app.core.resources import Resources, add

# A queue and what a gang of it asks for (one verdict each).
Asked = tuple[str, tuple[tuple[str, int], ...]]


class LineVerdicts:
    """The gangs' requests and the last verdict on a line, kept between calls."""

    def __init__(self, overcommit: float) -> None:
        self.overcommit = overcommit
        # group key -> (the gang in line, what it asks for, as a key): see request().
        self._asks: dict[str, tuple[Gang, Resources, tuple[tuple[str, int], ...]]] = {}
        # The last verdict on a line: (the line, its verdicts per (queue, shape), the gangs
        # let in): see kept().
        self._allowed: tuple[Sequence[tuple[Gang, str]], dict[Asked, bool], list[Gang]] | None
        self._allowed = None

    def request(self, gang: Gang) -> Resources:
        """request_of(gang), kept while the line hands out the same Gang (it rebuilds only
        the gangs that changed): 10,000 gangs in line summed afresh at every admission
        were a third of its queue check."""
        return self._ask(gang)[1]

    def asked(self, gang: Gang) -> tuple[tuple[str, int], ...]:
        """request(gang) as the hashable key the queue verdicts are kept by."""
        return self._ask(gang)[2]

    def _ask(self, gang: Gang) -> tuple[Gang, Resources, tuple[tuple[str, int], ...]]:
        kept = self._asks.get(gang.key)
        if kept is not None and kept[0] is gang:
            return kept
        if len(self._asks) > 20_000:
            self._asks.clear()
        request = request_of(gang)
        kept = self._asks[gang.key] = (gang, request, tuple(request.items()))
        return kept

    def judge(
        self, line: Sequence[tuple[Gang, str]], views: Mapping[str, QueueView], capacity: Resources
    ) -> list[Gang]:
        """The gangs of `line` (gang, its queue) that `views` let in, at once."""
        *_, allowed = self.steps(line, views, capacity, sys.maxsize)
        assert allowed is not None  # steps() ends with them
        return allowed

    def steps(
        self,
        line: Sequence[tuple[Gang, str]],
        views: Mapping[str, QueueView],
        capacity: Resources,
        most: int,
    ) -> Iterator[list[Gang] | None]:
        """judge() a slice at a time: yields None after every `most` gangs judged (the caller
        may let others run; `line` must stay as it was), then the gangs let in, kept.

        Every verdict is taken at `views`, so what is kept is what judge() gives at them;
        a call after checks each kept verdict against the queues then (kept())."""
        allowed = self.kept(line, views, capacity)
        if allowed is None:
            verdicts: dict[Asked, bool] = {}
            allowed = []
            for start in range(0, len(line), most):
                part = line[start : start + most] if most < len(line) else line
                allowed += admitted(part, views, capacity, self.overcommit, self.asked, verdicts)
                if start + most < len(line):
                    yield None
            self._allowed = (line, verdicts, allowed)
        yield allowed

    def kept(
        self, line: Sequence[tuple[Gang, str]], views: Mapping[str, QueueView], capacity: Resources
    ) -> list[Gang] | None:
        """The last answer (the same list) while `line` is the very same object and each of
        its queues' verdicts on each shape asked is what it was: the line's walk
        (app/runtime/line_walk.py) then knows it at once. None: judge the line again."""
        kept = self._allowed
        if kept is not None and kept[0] is line:
            verdicts = {
                asked: enqueue(asked[0], dict(asked[1]), views, capacity, self.overcommit) is None
                for asked in kept[1]
            }
            if verdicts == kept[1]:
                return kept[2]
        return None


def admitted(
    line: Sequence[tuple[Gang, str]],
    views: Mapping[str, QueueView],
    capacity: Resources,
    overcommit: float,
    asked: Callable[[Gang], tuple[tuple[str, int], ...]] | None = None,
    verdicts: dict[Asked, bool] | None = None,
) -> list[Gang]:
    """The gangs of `line` (gang, its queue) whose queue lets them in.

    Gangs in line are often alike (one Job's shape, run after run): one
    verdict per queue and request, not one per gang. `asked`: a gang's request
    as a hashable key (request_of's items; the caller's memo of them: at 10,000
    gangs this pass is the warm-up's longest step); `verdicts`: filled with the
    verdict per queue and request asked.
    """
    key_of = asked or (lambda gang: tuple(request_of(gang).items()))
    if verdicts is None:
        verdicts = {}
    allowed: list[Gang] = []
    append = allowed.append
    for gang, name in line:
        if name not in views:
            continue
        ask = (name, key_of(gang))
        verdict = verdicts.get(ask)
        if verdict is None:
            verdict = enqueue(name, dict(ask[1]), views, capacity, overcommit) is None
            verdicts[ask] = verdict
        if verdict:
            append(gang)
    return allowed


def request_of(gang: Gang) -> Resources:
    """What a gang in line asks for: every member it has not placed yet."""
    total: Resources = {}
    for demand in gang.demands:
        add(total, demand.requests)
    return total
