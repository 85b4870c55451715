"""A gang preempts only when the line would then admit it (issue 49, found by the soak).

With --gang-feasibility the filter admits gangs as a whole and in line
order: a gang behind an aged gang of its priority that does not fit yet
waits, however much room there is. The soak saw two such gangs plan,
evict a pod each, expire after 60 s unplaced, plan again and evict two more
each. Now the plan is checked against the line's own decision on the room
its victims leave: behind an aged gang, nothing is evicted and the gang is
told why; with nobody ahead, it preempts as before.
"""

from __future__ import annotations

from app.base.metrics import Metrics
from app.core.admission import Admission
from app.core.groups import GroupRef
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterSettings
from app.runtime.gate import PermitGate
from app.runtime.line import Candidate
from app.runtime.preemption.line_check import LOOKAHEAD_SECONDS, ArbiterLineCheck
from tests.unit.builders import pod, podgroup
from tests.unit.fakes import RecordingBinder
from tests.unit.test_preemption_plans import World, with_priority

AGING = 60.0


class LineWorld(World):
    """3 full nodes of 4 CPUs (tests/unit/test_preemption_plans.py) and the arbiter's line."""

    def __init__(self) -> None:
        super().__init__()
        gate = PermitGate(self.state, Admission(3), RecordingBinder(), Metrics())
        self.arbiter = Arbiter(
            self.state,
            Admission(3),
            gate,
            lambda spec: 30.0,
            settings=ArbiterSettings(aging_seconds=AGING, clock=self.clock),
        )
        self.plans.consult(ArbiterLineCheck(self.arbiter, self.state))

    def turned_away(self, group: str) -> None:
        """The filter verb's question for a member: the gang joins the line."""
        member = self.state.pods[f"default/{group}-0"]
        verdict = self.arbiter.admit(
            self.state.group_spec(GroupRef("default", group)),
            GroupRef("default", group),
            Candidate(member.key, member.uid, member.priority, {}),
        )
        assert not verdict.admitted, verdict


def aged_gang_ahead(w: LineWorld, waited: float = AGING + 1) -> None:
    """Gang `old` (priority 1000, 3 x 4 CPUs: only the empty cluster holds it) has waited
    `waited` seconds (aged by default)."""
    w.state.apply_podgroup(podgroup("old", 3))
    for i in range(3):
        w.state.apply_pod(with_priority(pod(f"old-{i}", group="old", cpu="4"), 1000))
    w.turned_away("old")
    w.clock.now += waited


def test_a_gang_behind_an_aged_gang_of_its_priority_evicts_nothing_and_says_why() -> None:
    w = LineWorld()
    aged_gang_ahead(w)
    w.gang("u", 2, cpu="2", priority=1000)
    w.turned_away("u")
    answers = [w.ask("u", i) for i in range(2)]
    assert w.victims(answers) == []
    assert w.plans.snapshot() == []
    assert len(w.told.refused) == 1, w.told.refused
    refused = w.told.refused[0]
    assert "preempts nothing" in refused and "waiting behind default/old" in refused, refused


def test_with_nobody_ahead_the_gang_preempts_as_before() -> None:
    w = LineWorld()
    w.gang("u", 2, cpu="2", priority=1000)
    w.turned_away("u")
    answers = [w.ask("u", i) for i in range(2)]
    assert len(w.victims(answers)) == 2, answers
    assert w.told.refused == [] and len(w.told.planned) == 1


def test_a_higher_priority_gang_is_not_held_by_an_aged_lower_one() -> None:
    w = LineWorld()
    aged_gang_ahead(w)
    w.gang("u", 2, cpu="2", priority=5000)
    w.turned_away("u")
    answers = [w.ask("u", i) for i in range(2)]
    assert len(w.victims(answers)) == 2, answers
    assert w.told.refused == []


def test_a_gang_ahead_that_ages_before_the_victims_are_gone_counts_as_aged() -> None:
    """The soak: evicting a second before the gang ahead aged evicted for nothing."""
    w = LineWorld()
    aged_gang_ahead(w, waited=AGING - LOOKAHEAD_SECONDS / 2)
    w.gang("u", 2, cpu="2", priority=1000)
    w.turned_away("u")
    assert w.victims([w.ask("u", i) for i in range(2)]) == []
    assert "waiting behind default/old" in w.told.refused[0]


def test_a_gang_ahead_that_ages_well_after_does_not_hold_the_preemption_back() -> None:
    w = LineWorld()
    aged_gang_ahead(w, waited=AGING - 2 * LOOKAHEAD_SECONDS)
    w.gang("u", 2, cpu="2", priority=1000)
    w.turned_away("u")
    assert len(w.victims([w.ask("u", i) for i in range(2)])) == 2
