"""Each queue's gangs waiting, kept sorted as the tally changes, and one admission's view of them.

A fresh admission with queues weighs each queue's waiting gangs: what they ask
for (the shares, app/core/queues.py), the queue's first gang, and the gangs
ahead of the candidate in its own queue. Walking every gang in line for that at
each admission was most of its queue check with 10,000 gangs in line
(BENCHMARKS.md). The tally (app/runtime/queues/tally.py) keeps a QueueLine per
queue as gangs' parts are redone; an admission sets apart the few gangs holding
a claim and the candidate (Apart) and reads the rest from the sums.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice

from app.core.queues import QueueView, enqueue
from app.core.resources import Resources, add, subtract

# A gang waiting: (-priority, created, key, what it asks for); sorts in queue order.
Pending = tuple[int, float, str, Resources]
# A gang's place in its queue: Pending without what it asks for.
Place = tuple[int, float, str]
# What a gang asks for, as a key: gangs in line are often alike (one Job's shape).
Shape = tuple[tuple[str, int], ...]


def shape_of(request: Resources) -> Shape:
    return tuple(sorted(request.items()))


@dataclass(slots=True)
class QueueLine:
    """One queue's gangs waiting, kept as their parts are redone: what they ask for in
    total, their places in order, and their places per shape of what they ask for.

    A fresh admission with queues weighs each queue's waiting gangs (the shares, the
    queue's first gang, the gangs ahead of the candidate in its queue); walking all of
    them at each admission was most of its queue check with 10,000 gangs in line.
    """

    total: Resources = field(default_factory=dict)
    places: list[Place] = field(default_factory=list)
    gangs: dict[str, Pending] = field(default_factory=dict)
    shapes: dict[Shape, list[Place]] = field(default_factory=dict)

    def add(self, waiting: Pending) -> None:
        place = waiting[:3]
        self.gangs[waiting[2]] = waiting
        add(self.total, waiting[3])
        insort(self.places, place)
        insort(self.shapes.setdefault(shape_of(waiting[3]), []), place)

    def remove(self, waiting: Pending) -> None:
        place = waiting[:3]
        del self.gangs[waiting[2]]
        subtract(self.total, waiting[3])
        _drop(self.places, place)
        shape = shape_of(waiting[3])
        places = self.shapes[shape]
        _drop(places, place)
        if not places:
            del self.shapes[shape]

    def in_order(self) -> Iterator[Pending]:
        """The queue's gangs waiting, first in line first."""
        for place in self.places:
            yield self.gangs[place[2]]


def _drop(places: list[Place], place: Place) -> None:
    i = bisect_left(places, place)
    assert i < len(places) and places[i] == place  # it was added: the tally's bookkeeping
    del places[i]


class Apart:
    """Each queue's gangs waiting as one assessment counts them: the tally's QueueLine less
    the gangs holding a claim, the candidate counted once in its own queue with what it
    asks for now (its queue may be the one others give way to). What is set apart is
    the few claims and the candidate, never a copy of the line."""

    def __init__(self, mine: Pending | None, queue: str, lines: Mapping[str, QueueLine]) -> None:
        self.lines = lines
        # queue -> its waiting gangs not counted (holding a claim, or the candidate as it was).
        self.out: dict[str, dict[str, Pending]] = {}
        # The candidate as it waits now (None: waking the line), in `queue`.
        self.mine = mine
        self.queue = queue
        if mine is not None:
            self._set_apart(queue, mine[2])

    def _set_apart(self, queue: str, key: str) -> None:
        line = self.lines.get(queue)
        waiting = line.gangs.get(key) if line is not None else None
        if waiting is not None:
            self.out.setdefault(queue, {})[key] = waiting

    def claimed(self, key: str) -> None:
        """A gang holding a claim does not wait (in whichever queue it waits in)."""
        for name, line in self.lines.items():
            if key in line.gangs:
                self._set_apart(name, key)

    def asked(self, queue: str) -> Resources:
        """What the queue's counted gangs ask for."""
        line = self.lines.get(queue)
        total = dict(line.total) if line is not None else {}
        for waiting in self.out.get(queue, {}).values():
            subtract(total, waiting[3])
        if self.mine is not None and queue == self.queue:
            add(total, self.mine[3])
        return total

    def count(self, queue: str) -> int:
        """How many of the queue's gangs are counted waiting."""
        line = self.lines.get(queue)
        count = len(line.gangs) if line is not None else 0
        mine = self.mine is not None and queue == self.queue
        return count - len(self.out.get(queue, ())) + mine

    def first(self, queue: str) -> Pending | None:
        """The queue's first counted gang in line."""
        line = self.lines.get(queue)
        out = self.out.get(queue, {})
        first = None
        if line is not None:
            first = next((w for w in line.in_order() if w[2] not in out), None)
        mine = self.mine if queue == self.queue else None
        if mine is not None and (first is None or mine[:3] < first[:3]):
            return mine
        return first

    def set_apart(self, queue: str, shape: Shape, before: Place) -> int:
        """How many gangs of `queue` asking `shape`, placed before `before`, are not counted."""
        return sum(
            1
            for w in self.out.get(queue, {}).values()
            if w[:3] < before and shape_of(w[3]) == shape
        )

    def ahead(
        self, queue: str, line: QueueLine, before: Place, shapes: set[Shape]
    ) -> Iterator[Pending]:
        """The queue's counted gangs placed before `before` asking one of `shapes`, in order."""
        out = self.out.get(queue, {})
        for waiting in line.in_order():
            if waiting[:3] >= before:
                return
            if waiting[2] not in out and shape_of(waiting[3]) in shapes:
                yield waiting


def in_turn(
    queue: str,
    waiting: Apart,
    views: Mapping[str, QueueView],
    capacity: Resources,
    overcommit: float,
) -> str | None:
    """Why the candidate (`waiting.mine`) waits, None: its queue lets it in, in its turn.

    The gangs ahead of it in its own queue (priority, then age) that the
    queue would admit come first: a younger gang must not take the
    queue's last room while an older one waits for it. Counted per shape
    of what they ask for (one verdict each), not gang by gang.
    """
    assert waiting.mine is not None
    request, key = waiting.mine[3], waiting.mine[2]
    alone = enqueue(queue, request, views, capacity, overcommit)
    if alone is not None:
        return f"gang {key} waits in its queue: {alone}"
    mine = waiting.mine[:3]
    line = waiting.lines.get(queue)
    together = dict(request)
    ahead = 0
    takes: set[Shape] = set()
    for shape, places in line.shapes.items() if line is not None else ():
        asks = dict(shape)
        # A gang larger than the whole cluster never runs: it holds no one back.
        if not all(v <= capacity.get(r, 0) for r, v in asks.items() if r in capacity):
            continue
        if enqueue(queue, asks, views, capacity, overcommit) is not None:
            continue
        count = bisect_left(places, mine) - waiting.set_apart(queue, shape, mine)
        if count > 0:
            takes.add(shape)
            ahead += count
            add(together, {r: v * count for r, v in asks.items()})
    if not ahead or enqueue(queue, together, views, capacity, overcommit) is None:
        return None
    assert line is not None
    first = list(islice(waiting.ahead(queue, line, mine, takes), 3))
    names = ", ".join(w[2] for w in first)
    return (
        f"gang {key} waits behind {ahead} older or higher-priority gang(s) "
        f"of queue {queue} ({names}{', ...' if ahead > 3 else ''}): the queue's "
        f"share has room for them first ({views[queue].describe()})"
    )
