from app.base.metrics import Metrics
from app.core.observer import NullObserver
from app.core.state import ClusterState
from app.runtime.preemption.plan_book import PlanBook
from app.runtime.preemption.room import PreemptionRoom
from tests.unit.builders import node, pod
from tests.unit.fakes import Clock


def test_the_preemption_room_leaves_the_states_shared_bins_as_they_were() -> None:
    """state.room() hands out bins it keeps for later calls: changing them is for copies."""
    state = ClusterState()
    state.replace_nodes([node("n0"), node("n1")])  # 4 CPUs each
    waiting = pod("waiting", cpu="3")
    waiting["status"]["nominatedNodeName"] = "n0"
    waiting["spec"]["priority"] = 100
    state.apply_pod(waiting)
    before = [(b.name, dict(b.free)) for b in state.room()]
    book = PlanBook(state, Metrics(), NullObserver(), Clock())
    bins = PreemptionRoom(state, book).bins("default/gang", priority=10)
    # The higher-priority nominated pod's room is taken in the preemption's view only.
    assert {b.name: b.free["cpu"] for b in bins} == {"n0": 1000, "n1": 4000}
    assert [(b.name, b.free) for b in state.room()] == before
