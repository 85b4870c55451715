"""PreemptionPlans for a gang with a topology constraint: one plan, inside one domain."""

from __future__ import annotations

from app.base.metrics import Metrics
from app.core.observer import NullObserver
from app.core.preemption.victims import VictimCandidate, VictimPolicy
from app.core.state import ClusterState
from app.core.topology.domains import HOSTNAME, ZONE
from app.core.topology.sources import KUEUE_REQUIRED
from app.runtime.preemption.plans import PlanSettings, PreemptionPlans
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock
from tests.unit.preempt_call import preempt_call

RACK = "example.com/rack"


class Told(NullObserver):
    def __init__(self) -> None:
        self.planned: list[str] = []
        self.refused: list[str] = []

    def preemption_planned(self, group_key: str, message: str) -> None:
        self.planned.append(message)

    def preemption_refused(self, group_key: str, message: str) -> None:
        self.refused.append(message)


class World:
    """Racks a (a1, a2) and b (b1, b2) of 4-CPU nodes, all full of priority-0 pods:
    a1 and b1 run one 4-CPU pod each, a2 two of 2 CPUs, b2 four of 1 CPU."""

    def __init__(self) -> None:
        self.state = ClusterState()
        nodes = []
        for name in ("a1", "a2", "b1", "b2"):
            raw = node(name)
            raw["metadata"]["labels"][RACK] = name[0]
            nodes.append(raw)
        self.state.replace_nodes(nodes)
        for name, pods in (("a1", 1), ("a2", 2), ("b1", 1), ("b2", 4)):
            for i in range(pods):
                self.state.apply_pod(pod(f"low-{name}-{i}", node=name, cpu=f"{4 // pods}"))
        self.told = Told()
        self.plans = PreemptionPlans(
            self.state,
            VictimPolicy.PROTECT,
            Metrics(),
            observer=self.told,
            settings=PlanSettings(clock=Clock(), levels=(HOSTNAME, RACK, ZONE)),
        )

    def gang(self, members: int, annotation: str = KUEUE_REQUIRED) -> None:
        group = podgroup("u", members)
        group["metadata"]["annotations"] = {annotation: RACK}
        self.state.apply_podgroup(group)
        for i in range(members):
            raw = pod(f"u-{i}", group="u", cpu="4")
            raw["spec"]["priority"] = 1000
            self.state.apply_pod(raw)

    def ask(self, i: int) -> list[VictimCandidate]:
        return preempt_call(self.state, self.plans, f"default/u-{i}").candidates


def test_the_gang_preempts_inside_the_rack_whose_victims_cost_least() -> None:
    # Across racks a1 + b1 would do with 2 evictions; inside one rack: a = 3, b = 5.
    w = World()
    w.gang(2)
    answers = [w.ask(i) for i in range(2)]
    assert {c.node for a in answers for c in a} == {"a1", "a2"}
    (planned,) = w.told.planned
    assert planned.startswith(
        "gang default/u preempts in rack a (node label example.com/rack): 3 eviction(s) for "
        "2 member(s)"
    )
    (shown,) = w.plans.snapshot()
    assert shown["domain"] == {"level": RACK, "value": "a"}


def test_no_rack_can_hold_the_gang_so_it_preempts_nothing_and_says_so() -> None:
    w = World()
    w.gang(3)
    assert w.ask(0) == []
    (refused,) = w.told.refused
    assert refused.startswith(
        "gang default/u cannot preempt: its 3 missing member(s) do not fit in any one rack "
        "(required by topology key example.com/rack (annotation "
        "kueue.x-k8s.io/podset-required-topology on the PodGroup)) even after evicting"
    )
