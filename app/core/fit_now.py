"""Which of the gangs the line chose fit in the room kube-scheduler sees free now.

The line's look (app/core/line_look.py wake_steps) counts the room of pods on their way
out as free, and knows nothing of the pods kube-scheduler nominated for a node: for a gang
the filter admits, that is right (its members wait in the gate a moment for a pod to
leave). Releasing a held gang (app/runtime/holds.py) cannot be undone: a scheduling gate
cannot be put back. kube-scheduler counts a terminating pod's room as taken until it is
gone, and keeps a nominated pod's room for it against every pod of its priority or lower.
A gang released onto such room is turned away by kube-scheduler's own filters and retried
on every cluster event after that, ahead of every pod of lower priority: issue 49's soak
saw a plain pod wait minutes behind gangs released onto room a preemption had freed for
another pod. So a held gang is released only once it fits in what kube-scheduler sees
free: `free` without the leaving pods' room, less the claims' promises and the room of
the nominated pods that rank at least as high as it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.core.contention import Gang, Holder
from app.core.packing import Bin
from app.core.resources import add
from app.core.room import Room


@dataclass(frozen=True, slots=True)
class Nominated:
    """A pod kube-scheduler keeps room for on `node` (status.nominatedNodeName), not placed."""

    group: str  # the key of its gang ("" for a pod in no gang)
    priority: int
    node: str
    requests: Mapping[str, int]


def fit_now(
    gangs: Sequence[Gang],
    free: Sequence[Bin],
    holders: Sequence[Holder],
    nominated: Sequence[Nominated],
) -> list[str]:
    """The keys of those of `gangs` (in line order) that fit, each in what the ones before it
    that fit left: `free` (the leaving pods' room not in it) less the `holders`' promises,
    and for each gang less the room of the `nominated` pods of its priority or above (but
    its own members, and those of the holders and of the gangs before it that fit, whose
    room is counted already)."""
    room = Room(free, holders, ())
    # A holder's promise, and a gang that fit, took their nominated members' room already.
    counted = {h.key for h in holders}
    fits: list[str] = []
    for gang in gangs:
        ahead = [
            n
            for n in nominated
            if n.priority >= gang.priority and n.group != gang.key and n.group not in counted
        ]
        kept = Room(room.bins, [_promise(ahead)], ()) if ahead else room
        packing = kept.pack(gang)
        if packing.fits:
            room.take(gang, packing.plan)
            fits.append(gang.key)
            counted.add(gang.key)
    return fits


def _promise(nominated: Sequence[Nominated]) -> Holder:
    """The nominated pods' room, as a holder's promise is: per node, what they request."""
    remaining: dict[str, dict[str, int]] = {}
    for pod in nominated:
        add(remaining.setdefault(pod.node, {}), pod.requests)
    return Holder("nominated", 0, 0.0, remaining)
