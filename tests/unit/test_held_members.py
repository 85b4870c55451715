"""Native members kube-scheduler's gates hold before any filter are told why, once."""

from __future__ import annotations

from app.core.admission import FilterReason, WaitPolicy
from app.core.event_aggregation import ObjectRef
from app.core.events import INVALID_POD_GROUP, NORMAL, WAITING_FOR_SIBLINGS, GangEvents
from app.core.groups import SOURCE_NATIVE
from app.core.observer import MemberRef, NullObserver
from app.core.state import ClusterState
from app.runtime.held_members import HeldMembers
from app.runtime.wakeup import SiblingWaker
from tests.unit.builders import pod, podgroup
from tests.unit.test_composite_trees import composite, leaf, member, watched
from tests.unit.test_wakeup_and_evictor import FakeApi


class Held(NullObserver):
    def __init__(self) -> None:
        self.told: list[tuple[str, str, str, str]] = []

    def member_held(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        self.told.append((member.name, group_key, reason, message))


def listening(state: ClusterState) -> tuple[HeldMembers, Held]:
    observer = Held()
    held = HeldMembers(state, observer)
    state.add_pod_listener(held.on_pod_change)
    state.trees.add_listener(held.on_group_changed)
    return held, observer


def flat_gang(name: str, min_count: int) -> dict[str, object]:
    """A native PodGroup that names no parent (no tree)."""
    raw = leaf(name, parent="", min_count=min_count)
    raw["spec"].pop("schedulingConstraints")
    return raw


def test_each_member_of_a_short_gang_is_told_once_and_the_last_one_not_at_all() -> None:
    state = watched()
    state.apply_podgroup(flat_gang("g", 3), SOURCE_NATIVE)
    _, observer = listening(state)
    state.apply_pod(member("m0", "g"))
    state.apply_pod(member("m1", "g"))
    assert observer.told == [
        (
            f"m{i}",
            "native:ml/g",
            FilterReason.TOO_FEW_SIBLINGS,
            f"cannot find enough sibling pods, current pods number: {i + 1}, minMember of "
            "group: 3 (group native:ml/g waits until 3 of its pods exist)",
        )
        for i in range(2)
    ]
    # An update of a told pod (kube-scheduler, the sibling wake-up) tells nothing again.
    touched = member("m0", "g")
    touched["metadata"]["annotations"] = {"touched": "1"}
    state.apply_pod(touched)
    state.apply_pod(member("m2", "g"))  # complete: the gate lets them go, the filter speaks
    assert len(observer.told) == 2


def test_members_of_other_sources_and_bound_members_are_never_told() -> None:
    state = watched()
    state.apply_podgroup(podgroup("x", 3, namespace="ml"))
    state.apply_podgroup(flat_gang("g", 3), SOURCE_NATIVE)
    _, observer = listening(state)
    state.apply_pod(pod("x0", namespace="ml", group="x"))  # x-k8s: reaches the filter
    bound = member("m0", "g")
    bound["spec"]["nodeName"] = "n1"
    state.apply_pod(bound)
    assert observer.told == []


async def test_members_that_came_before_their_podgroup_are_told_when_it_appears() -> None:
    state = watched()
    held, observer = listening(state)
    waker = SiblingWaker(state, FakeApi())
    waker.add_appeared_listener(held.on_group_changed)
    state.apply_pod(member("m0", "g"))
    assert observer.told == []  # no PodGroup yet: nothing the gate holds it for is known
    state.apply_podgroup(flat_gang("g", 2), SOURCE_NATIVE)
    waker.podgroups_appeared(["native:ml/g"])
    assert [(name, reason) for name, _, reason, _ in observer.told] == [
        ("m0", FilterReason.TOO_FEW_SIBLINGS)
    ]


def test_a_tree_short_of_one_leaf_names_the_leaf_on_each_member() -> None:
    state = watched()
    state.trees.apply(composite("job"))
    state.apply_podgroup(leaf("job-a"), SOURCE_NATIVE)
    state.apply_podgroup(leaf("job-b"), SOURCE_NATIVE)
    _, observer = listening(state)
    for i in range(3):
        state.apply_pod(member(f"a{i}", "job-a"))
    state.apply_pod(member("b0", "job-b"))
    assert {name for name, *_ in observer.told} == {"a0", "a1", "a2", "b0"}
    name, key, reason, message = observer.told[-1]
    assert (name, key, reason) == ("b0", "composite:ml/job", FilterReason.TOO_FEW_SIBLINGS)
    assert "job-b: 1 of 3" in message and "job-a" not in message, message


def test_an_unusable_tree_is_told_per_message_and_again_when_it_changes() -> None:
    state = watched()
    state.apply_podgroup(leaf("orphan", parent="nowhere"), SOURCE_NATIVE)
    _, observer = listening(state)
    state.apply_pod(member("o0", "orphan"))
    state.apply_pod(member("o0", "orphan"))
    [(_, key, reason, message)] = observer.told
    assert (key, reason) == ("native:ml/orphan", FilterReason.BAD_GROUP)
    assert "CompositePodGroup nowhere not found" in message
    # The leaf now names another missing parent: a new message, told.
    state.apply_podgroup(leaf("orphan", parent="elsewhere"), SOURCE_NATIVE)
    assert "CompositePodGroup elsewhere not found" in observer.told[-1][3]
    assert len(observer.told) == 2


class Recorded:
    def __init__(self) -> None:
        self.events: list[tuple[ObjectRef, str, str, str]] = []

    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((ref, type_, reason, message))


def test_a_held_member_sees_the_message_on_its_pod_as_well_as_on_its_podgroup() -> None:
    state = watched()
    state.apply_podgroup(flat_gang("g", 3), SOURCE_NATIVE)
    recorded = Recorded()
    events = GangEvents(state, recorded, WaitPolicy(60, 80), 3)
    events.member_held(
        MemberRef("ml", "m0", "u0"), "native:ml/g", FilterReason.TOO_FEW_SIBLINGS, "too few"
    )
    assert [(ref.kind, ref.name, type_, reason) for ref, type_, reason, _ in recorded.events] == [
        ("PodGroup", "g", NORMAL, WAITING_FOR_SIBLINGS),
        ("Pod", "m0", NORMAL, WAITING_FOR_SIBLINGS),
    ]
    assert recorded.events[1][3] == "too few; create the missing pods, or lower minMember"
    # A leaf with no usable tree is in the state's groups: both again, a warning.
    recorded.events.clear()
    events.member_held(
        MemberRef("ml", "m0", "u0"), "native:ml/g", FilterReason.BAD_GROUP, "no parent"
    )
    assert [reason for _, _, reason, _ in recorded.events] == [INVALID_POD_GROUP] * 2
