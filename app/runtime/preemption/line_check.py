"""Would the line admit a preempting gang once its plan's victims are gone?

With --gang-feasibility (or a topology constraint) the filter verb admits a
gang as a whole and in line order (app/core/contention.py): a gang waits
behind an aged gang of its priority or higher that does not fit yet, and
behind the gangs holding claims, however much room there is. Evicting pods
for a gang the line keeps waiting evicts them for nothing: its members are
turned away by the filter, the plan expires after 60 s with nobody placed,
and the next plan evicts more (found by the soak, issue 49: two gangs of
priority 10000 behind an aged one of the same priority evicted five pods in
two rounds and never started). So before a plan with victims is kept, the
line's own decision is asked on the room those victims leave, as it will
stand a little later (LOOKAHEAD_SECONDS): the victims take time to leave
and the members to be placed, and a gang ahead that ages meanwhile holds the
room by then (the soak again: a gang of priority 10000 evicted two pods a
second before the gang ahead of it aged, then waited behind it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from app.core.admission import wholeness
from app.core.contention import Ruling
from app.core.groups import GroupSpec
from app.core.packing import Bin, Demand
from app.core.resources import Resources, add
from app.core.shared_pools import PoolHold, credited
from app.core.state import ClusterState

if TYPE_CHECKING:  # the arbiter's modules import the preemption plans, which import this
    from app.runtime.arbiter import Arbiter

# How far ahead a plan's line check looks: a gang ahead that ages within this
# counts as aged (victims leaving and members placed take seconds on a busy cluster).
LOOKAHEAD_SECONDS = 15.0


class LineCheck(Protocol):
    def waits(
        self,
        spec: GroupSpec,
        preemptor_uid: str,
        own: Demand,
        freed: Mapping[str, Resources],
        given: Sequence[PoolHold] = (),
    ) -> str | None:
        """Why the line would keep the gang waiting once `freed` is free (per node) and the
        shared device pools have `given` back; None: it would not."""
        ...


class ArbiterLineCheck:
    """The arbiter's decision (claims, line order, aging, topology) on the room after evictions."""

    def __init__(self, arbiter: Arbiter, state: ClusterState) -> None:
        self._arbiter = arbiter
        self._state = state

    def waits(
        self,
        spec: GroupSpec,
        preemptor_uid: str,
        own: Demand,
        freed: Mapping[str, Resources],
        given: Sequence[PoolHold] = (),
    ) -> str | None:
        arbiter = self._arbiter
        if not arbiter.applies(spec, None):
            return None
        line = arbiter.line
        members = self._state.members(spec.key)
        gang = line.gang(spec, None, members)
        if all(p.uid != preemptor_uid for p in members):
            # Not delivered by our watch yet: the member asking counts as one more.
            demands = (*gang.demands, own)
            missing = wholeness(spec, len(members) - len(gang.demands)).missing
            gang = replace(gang, demands=demands, need=min(len(demands), missing))
        if gang.need <= 0:
            return None
        contest = line.contest(exclude=spec.key)
        # The same contest with the victims' room given back. Its remainders (what an
        # aged gang ahead can never use) were worked out with the victims present: as
        # many or fewer than once they are gone, so the line is never told it may
        # admit what it would not.
        after = replace(contest, free=credited(_with_freed(contest.free, freed), given))
        settings = arbiter.settings
        decision, _domain, _groups = arbiter.topology.decide(
            gang,
            arbiter.topology.constraint(spec),
            after,
            settings.clock() + LOOKAHEAD_SECONDS,
            settings.aging_seconds,
        )
        return decision.message if decision.verdict is Ruling.WAIT else None


def _with_freed(free: Sequence[Bin], freed: Mapping[str, Resources]) -> list[Bin]:
    """Copies of the bins `freed` touches, with that room given back; the others shared."""
    bins: list[Bin] = []
    for b in free:
        extra = freed.get(b.name)
        if not extra:
            bins.append(b)
            continue
        room = dict(b.free)
        add(room, extra)
        bins.append(b.with_free(room))
    return bins
