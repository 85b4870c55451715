"""Reclaim for a gang constrained only on its slices: which domains its slices take. Pure.

A gang with no required level of its own but whose slices (Kueue podset
slices, Volcano subGroupPolicy, KAI sub-groups) must each fit whole in one
domain of a level may use several domains: one per slice, or several slices
in one. Reclaim (app/core/reclaim.py) then looks for victims only in the
domains the slices will take, the fewest: each domain is costed for holding
1, 2, ... slices by a cheap bound (the member slots its nodes would have,
taking its candidates in reclaim's order, each kept only while needed), and
the domains picked by a knapsack on the count of slices, for the fewest
victims in total (then the earliest in reclaim's order). The bound is exact
for a gang of alike members on nodes of one shape; the gang's own fits test
has the last word (docs/queues.md "Reclaim").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from app.core.packing import Bin
from app.core.queues import Running
from app.core.resources import Resources, add, subtract

# A domain's cost for some slices: (victims, the sum of their ranks in reclaim's order), and
# the victims themselves.
_Cost = tuple[int, int, tuple[Running, ...]]


@dataclass(frozen=True, slots=True)
class SliceRoom:
    """What reclaim reads of a gang with no required level of its own, only on its slices."""

    # The slices' level(s), lowest first (the admission takes the lowest that holds them all):
    # each domain's node names.
    levels: Sequence[Sequence[Collection[str]]]
    # What every member of a slice asks at least: a node's room is counted in slots of it.
    member: Resources
    # Members of the smallest slice still to place, and slices to place.
    size: int
    count: int
    # Some members belong to no slice (a role, ranks past the last whole slice): they may
    # need room outside every domain of the slices' level.
    loose: bool = False


def slots(room: Mapping[str, int], member: Mapping[str, int]) -> int:
    """How many members of `member`'s shape fit in `room` (no resource asked: one)."""
    counts = [room.get(r, 0) // v for r, v in member.items() if v > 0]
    return max(0, min(counts)) if counts else 1


class DomainCosts:
    """What holding 1, 2, ... slices costs in one domain: its candidates taken in reclaim's
    order until its slots hold them, then those whose room is not needed spared again."""

    def __init__(self, bins: Sequence[Bin], pool: Sequence[Running], shape: SliceRoom) -> None:
        self._room = {b.name: dict(b.free) for b in bins}
        self._pool = pool
        self._shape = shape

    def costs(self, rank: Mapping[str, int]) -> list[_Cost]:
        """costs[j - 1]: for j slices (as many as the domain may hold, up to the gang's)."""
        shape = self._shape
        room = {n: dict(r) for n, r in self._room.items()}
        have = sum(slots(r, shape.member) for r in room.values())
        taken: list[Running] = []
        found: list[_Cost] = []
        left = iter(self._pool)
        while len(found) < shape.count:
            need = (len(found) + 1) * shape.size
            if have >= need:
                last = found[-1] if found else None
                if last is not None and last[0] == len(taken):
                    found.append(last)  # none could be spared for fewer slots: none for more
                    continue
                kept = self._needed(taken, need)
                found.append((len(kept), sum(rank[g.key] for g in kept), tuple(kept)))
                continue
            gang = next(left, None)
            if gang is None:
                break
            taken.append(gang)
            have += self._change(room, gang, 1)
        return found

    def _needed(self, taken: Sequence[Running], need: int) -> list[Running]:
        """`taken`, less those (the latest first) the domain holds `need` slots without."""
        room = {n: dict(r) for n, r in self._room.items()}
        for gang in taken:
            self._change(room, gang, 1)
        have = sum(slots(r, self._shape.member) for r in room.values())
        kept = list(taken)
        for gang in reversed(taken):
            lost = self._change(room, gang, -1)
            if have + lost >= need:
                have += lost
                kept.remove(gang)
            else:
                self._change(room, gang, 1)
        return kept

    def _change(self, room: dict[str, Resources], gang: Running, sign: int) -> int:
        """Give the domain `gang`'s room back (sign 1) or take it again (-1): the slots gained."""
        gained = 0
        for node, amounts in gang.held.items():
            if node not in room:
                continue
            before = slots(room[node], self._shape.member)
            if sign > 0:
                add(room[node], amounts)
            else:
                subtract(room[node], amounts)
            gained += slots(room[node], self._shape.member) - before
        return gained


def cheapest_domains(
    options: Sequence[Sequence[_Cost]], count: int
) -> tuple[list[Running], list[int]] | None:
    """The knapsack over domains: `count` slices at the fewest victims (then the earliest in
    reclaim's order); the victims and the indices of the domains picked, None: no domains
    hold them all. options[i][j - 1]: domain i's cost for j slices."""
    best: list[tuple[int, int, tuple[tuple[int, int], ...]] | None] = [None] * (count + 1)
    best[0] = (0, 0, ())
    for i, costs in enumerate(options):
        grown = list(best)
        for have, state in enumerate(best):
            if state is None or have == count:
                continue
            for j, (victims, ranks, _) in enumerate(costs[: count - have], 1):
                new = (state[0] + victims, state[1] + ranks, (*state[2], (i, j)))
                known = grown[have + j]
                if known is None or new[:2] < known[:2]:
                    grown[have + j] = new
        best = grown
    done = best[count]
    if done is None:
        return None
    chosen: dict[str, Running] = {}
    for i, j in done[2]:
        for gang in options[i][j - 1][2]:
            chosen.setdefault(gang.key, gang)
    return list(chosen.values()), [i for i, _ in done[2]]
