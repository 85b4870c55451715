"""The line ordered a slice at a time, for a caller that lets the event loop run between slices.

order_line() (app/core/contention.py) sorts the whole line at once: with
10,000 gangs in line that was 15 ms of the warm-up's first walk slice, on top
of the walk itself (BENCHMARKS.md, issue 46). Here the line is keyed and sorted
in runs of a few hundred gangs, then the runs are merged, a slice of gangs at a
time. Each run is sorted by (line_key, place in the line), and heapq.merge takes
equal entries in the order of its runs: the result is the stable sort of the
whole line by line_key, the very order order_line() gives.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

from app.core.contention import Gang, line_key

# A gang keyed for the merge: (its line_key, its place in the line, the gang). The place
# breaks ties (never the gang itself) and keeps them in line order, as sorted() does.
_Keyed = tuple[tuple[int, int, float, float, str], int, Gang]


def order_steps(
    gangs: Sequence[Gang], now: float, aging_seconds: float, most: int
) -> Iterator[list[Gang] | None]:
    """order_line(gangs, now, aging_seconds) a slice at a time: yields None after every
    `most` gangs keyed and sorted, and after every `most` gangs merged; then the line in
    order (the caller may let others run at each None; `gangs` must stay as it was)."""
    runs: list[list[_Keyed]] = []
    for start in range(0, len(gangs), most):
        run = [
            (line_key(g, now, aging_seconds), start + i, g)
            for i, g in enumerate(gangs[start : start + most])
        ]
        run.sort()
        runs.append(run)
        yield None
    if len(runs) <= 1:
        yield [keyed[2] for keyed in runs[0]] if runs else []
        return
    order: list[Gang] = []
    merged = heapq.merge(*runs)
    while True:
        taken = [keyed[2] for keyed in itertools.islice(merged, most)]
        order += taken
        if len(taken) < most:
            break
        yield None
    yield order


def next_to_age(
    gangs: Sequence[Gang], now: float, aging_seconds: float, ahead: Gang | None = None
) -> Gang | None:
    """The gang waiting longest of `gangs` not aged yet (the first of equals), or `ahead` (a
    gang of an earlier part of the line, found so) when none waited as long: while it is not
    aged, none of them is (now - since is monotonic in both)."""
    best = ahead
    for g in gangs:
        since = g.waiting_since
        if since is None or g.aged(now, aging_seconds):
            continue
        if best is None or since < (best.waiting_since or 0.0):
            best = g
    return best
