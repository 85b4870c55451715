from app.base.metrics import Metrics
from app.core.groups import GroupRef
from app.core.observer import NullObserver
from app.core.state import ClusterState
from app.runtime.preemption.plan import Plan, Slot
from app.runtime.preemption.plan_book import PlanBook
from app.runtime.preemption.room import PreemptionRoom
from tests.unit.builders import node, pod, podgroup
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


def test_a_planned_members_nomination_and_its_open_slot_are_counted_once() -> None:
    """The extender nominates a plan's members for their slots (nominations.py): the room
    another gang plans with loses the slot's requests once, not once more for the pod."""
    state = ClusterState()
    state.replace_nodes([node("n0"), node("n1")])  # 4 CPUs each
    state.apply_podgroup(podgroup("urgent", 1))
    member = pod("urgent-0", group="urgent", cpu="3")
    member["status"]["nominatedNodeName"] = "n0"
    member["spec"]["priority"] = 100
    state.apply_pod(member)
    clock = Clock()
    book = PlanBook(state, Metrics(), NullObserver(), clock)
    slot = Slot(
        "n0", dict(state.pods["default/urgent-0"].requests), (), member="uid-default-urgent-0"
    )
    ref = GroupRef("default", "urgent")
    book.add(Plan(ref, 100, clock(), clock() + 60, [slot], {}, 0))
    bins = PreemptionRoom(state, book).bins("default/gang", priority=10)
    assert {b.name: b.free["cpu"] for b in bins} == {"n0": 1000, "n1": 4000}
