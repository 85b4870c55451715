"""The line looked at whole, as a decision walks it: which gangs are admitted now (to wake
their pods, in line order) and, per aged gang, where it holds room back (/debug/gangs).

Pure, as app/core/contention.py: the walk is contention's (each gang that fits takes
its room, each aged one that does not holds what it can use); this is the reference
app/runtime/line_walk.py keeps between calls, and is checked against.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from app.core.contention import Contest, order_line
from app.core.room import Room


def wake_order(contest: Contest, now: float, aging_seconds: float, limit: int = 10) -> list[str]:
    """The gangs of `contest.line` admitted now, in line order (to wake their pods)."""
    chosen: list[str] = []
    for step in wake_steps(contest, now, aging_seconds, limit, slice_size=sys.maxsize):
        chosen = step if step is not None else chosen
    return chosen


def wake_steps(
    contest: Contest, now: float, aging_seconds: float, limit: int, slice_size: int = 500
) -> Iterator[list[str] | None]:
    """wake_order() a slice at a time: yields None after every `slice_size` gangs walked (the
    caller may let others run; `contest` must stay as it was), then the gangs chosen."""
    room = Room(
        contest.free, contest.holders, contest.allocatable, contest.positions, contest.remainders
    )
    chosen: list[str] = []
    for walked, gang in enumerate(order_line(contest.line, now, aging_seconds), 1):
        if room.set_aside(gang):
            chosen.append(gang.key)
            if len(chosen) >= limit:
                break
        elif (
            gang.aged(now, aging_seconds)
            and room.may_ever_fit(gang)
            and room.hold_for(gang) is None
        ):
            break
        if walked % slice_size == 0:
            yield None
    yield chosen


def held_for(
    contest: Contest, now: float, aging_seconds: float
) -> dict[str, tuple[list[str], str]]:
    """For /debug/gangs: per aged gang in line, the nodes where it holds room back, and why none.

    The line walked as wake_order() walks it: the gangs that fit take their
    share, each aged gang that does not caps the nodes at what it cannot use.
    """
    room = Room(
        contest.free, contest.holders, contest.allocatable, contest.positions, contest.remainders
    )
    held: dict[str, tuple[list[str], str]] = {}
    for gang in order_line(contest.line, now, aging_seconds):
        aged = gang.aged(now, aging_seconds)
        if room.set_aside(gang):
            if aged:
                held[gang.key] = ([], "it fits now")
        elif not aged:
            continue
        elif not room.may_ever_fit(gang):
            held[gang.key] = ([], "it cannot fit even in the empty cluster")
        else:
            nodes = room.hold_for(gang)
            if nodes is None:
                held[gang.key] = ([], "the nodes' pods are not known: it holds everything")
            else:
                held[gang.key] = (nodes, "" if nodes else "all it may use is in use")
    return held
