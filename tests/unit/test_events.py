from typing import Any

from app.base.metrics import Metrics
from app.core.admission import FilterReason, WaitPolicy
from app.core.event_aggregation import (
    AGGREGATED,
    CREATED,
    RATE_LIMITED,
    EventAggregator,
    ObjectRef,
    TokenBucket,
)
from app.core.events import (
    GANG_ADMITTED,
    GANG_BIND_ROLLED_BACK,
    GANG_PARTLY_BOUND,
    GANG_QUEUED,
    GANG_RELEASED,
    GANG_TIMED_OUT,
    GANG_WAITING,
    INSUFFICIENT_RESOURCES,
    INVALID_POD_GROUP,
    NORMAL,
    PREEMPTED,
    PREEMPTION_ENDED,
    PREEMPTION_PLANNED,
    PREEMPTION_REFUSED,
    TOPOLOGY_PLACED,
    WAITING_FOR_SIBLINGS,
    WARNING,
    GangEvents,
)
from app.core.groups import XK8S_API
from app.core.observer import MemberRef
from app.core.state import ClusterState
from app.kube.errors import NotFound
from app.ops.event_recorder import EventRecorder
from tests.unit.builders import pod, podgroup
from tests.unit.fakes import Clock

POD = ObjectRef("Pod", "v1", "ns", "p", "uid-p")


class RecordingWriter:
    """Stands in for the Events API; the cluster tests read the real Events back."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.missing: set[str] = set()
        self.fail = False

    async def create(self, namespace: str, body: dict[str, Any]) -> None:
        if self.fail:
            raise RuntimeError("API server unreachable")
        self.calls.append(("create", body["metadata"]["name"], body))
        self.missing.discard(body["metadata"]["name"])

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        if self.fail:
            raise RuntimeError("API server unreachable")
        if name in self.missing:
            raise NotFound(name)
        self.calls.append(("patch", name, body))


def recorder() -> tuple[EventRecorder, RecordingWriter, Clock, Metrics]:
    writer, clock, metrics = RecordingWriter(), Clock(1_700_000_000.0), Metrics()
    return EventRecorder(writer, metrics, clock=clock), writer, clock, metrics


def counter(metrics: Metrics, result: str) -> float:
    return metrics.registry.get_sample_value("gang_extender_events_total", {"result": result}) or 0


# ---- token bucket --------------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_one_per_refill_period() -> None:
    bucket = TokenBucket(burst=3, refill_seconds=300, tokens=3, updated=0)
    assert [bucket.take(0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(299)
    assert bucket.take(300)
    assert not bucket.take(300)
    assert [bucket.take(10_000) for _ in range(4)] == [True, True, True, False]  # capped at burst


# ---- recorder: creation, aggregation, rate limit -------------------------------------------


def test_the_aggregator_creates_then_counts_then_drops_without_a_recorder() -> None:
    aggregator = EventAggregator(window_seconds=600, burst=2, refill_seconds=300, cache_size=16)
    outcome, first = aggregator.add(POD, NORMAL, GANG_WAITING, "m", 0)
    assert outcome == CREATED and first is not None and first.count == 1
    outcome, again = aggregator.add(POD, NORMAL, GANG_WAITING, "m", 1)
    assert outcome == AGGREGATED and again is first and first.count == 2 and first.last == 1
    assert aggregator.add(POD, NORMAL, GANG_WAITING, "m", 2) == (RATE_LIMITED, None)


def test_event_names_stay_unique_within_one_nanosecond() -> None:
    aggregator = EventAggregator(window_seconds=600, burst=25, refill_seconds=300, cache_size=16)
    entries = [aggregator.add(POD, NORMAL, GANG_WAITING, str(i), 5.0)[1] for i in range(3)]
    assert len({e.name for e in entries if e is not None}) == 3


async def test_first_event_is_created_with_the_client_go_fields() -> None:
    rec, writer, _, _ = recorder()
    rec.record(POD, WARNING, "GangTimedOut", "it timed out")
    await rec.drain()
    [(verb, name, body)] = writer.calls
    assert verb == "create" and name.startswith("p.")
    assert body["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": "ns",
        "name": "p",
        "uid": "uid-p",
    }
    assert body["source"] == {"component": "gang-extender"}
    assert (body["type"], body["reason"], body["message"], body["count"]) == (
        WARNING,
        "GangTimedOut",
        "it timed out",
        1,
    )
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2023-11-14T22:13:20Z"


async def test_an_identical_event_raises_the_count_of_the_first() -> None:
    rec, writer, clock, metrics = recorder()
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    clock.now += 5
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    assert [c[0] for c in writer.calls] == ["create", "patch"]
    assert writer.calls[1][1] == writer.calls[0][1]
    assert writer.calls[1][2] == {"count": 2, "lastTimestamp": "2023-11-14T22:13:25Z"}
    assert counter(metrics, "created") == 1 and counter(metrics, "aggregated") == 1


async def test_a_different_message_or_object_is_a_new_event() -> None:
    rec, writer, _, _ = recorder()
    rec.record(POD, NORMAL, "R", "one")
    await rec.drain()
    rec.record(POD, NORMAL, "R", "two")
    await rec.drain()
    rec.record(ObjectRef("Pod", "v1", "ns", "q", "uid-q"), NORMAL, "R", "one")
    await rec.drain()
    assert [c[0] for c in writer.calls] == ["create", "create", "create"]
    assert len({c[1] for c in writer.calls}) == 3


async def test_after_the_window_an_identical_event_is_new_again() -> None:
    rec, writer, clock, _ = recorder()
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    clock.now += 601
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    assert [c[0] for c in writer.calls] == ["create", "create"]


async def test_a_hot_loop_is_cut_off_by_the_per_object_spam_filter() -> None:
    rec, writer, clock, metrics = recorder()
    for _ in range(40):
        rec.record(POD, NORMAL, "WaitingForSiblings", "same")
        await rec.drain()
    assert len(writer.calls) == 25
    assert counter(metrics, "rate-limited") == 15
    # Another reason on the same object has its own budget.
    rec.record(POD, WARNING, "GangTimedOut", "timed out")
    await rec.drain()
    assert writer.calls[-1][2]["reason"] == "GangTimedOut"
    # One more token every 5 minutes.
    clock.now += 300
    rec.record(POD, NORMAL, "WaitingForSiblings", "same")
    await rec.drain()
    rec.record(POD, NORMAL, "WaitingForSiblings", "same")
    await rec.drain()
    assert len(writer.calls) == 27


async def test_increments_during_a_write_are_folded_into_one_call() -> None:
    rec, writer, _, _ = recorder()
    for _ in range(5):
        rec.record(POD, NORMAL, "R", "same")
    assert writer.calls == []  # one write per Event at a time, not started yet
    await rec.drain()
    [(verb, _, body)] = writer.calls
    assert verb == "create" and body["count"] == 5


def test_recording_without_a_running_loop_writes_nothing_and_does_not_raise() -> None:
    rec, writer, _, metrics = recorder()
    rec.record(POD, NORMAL, "R", "same")  # e.g. a report after the loop stopped
    assert writer.calls == []
    assert counter(metrics, "created") == 1


async def test_an_expired_event_is_created_again() -> None:
    rec, writer, _, _ = recorder()
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    writer.missing.add(writer.calls[0][1])
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    assert [c[0] for c in writer.calls] == ["create", "create"]
    assert writer.calls[1][2]["count"] == 2


async def test_a_failed_write_is_counted_not_raised_and_later_events_still_go_out() -> None:
    rec, writer, _, metrics = recorder()
    writer.fail = True
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    assert counter(metrics, "failed") == 1
    writer.fail = False
    rec.record(POD, NORMAL, "R", "same")
    await rec.drain()
    assert [c[0] for c in writer.calls] == ["create"]
    assert writer.calls[0][2]["count"] == 2


async def test_long_messages_are_truncated() -> None:
    rec, writer, _, _ = recorder()
    rec.record(POD, NORMAL, "R", "x" * 5000)
    await rec.drain()
    assert len(writer.calls[0][2]["message"]) == 1024


# ---- GangEvents: which reason goes on which object --------------------------------------


class Recorded:
    def __init__(self) -> None:
        self.events: list[tuple[ObjectRef, str, str, str]] = []

    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((ref, type_, reason, message))


def gang_events() -> tuple[GangEvents, Recorded, ClusterState]:
    state = ClusterState()
    state.apply_podgroup(podgroup("g", 3, timeout=20))
    state.apply_pod(pod("a", group="g"))
    recorded = Recorded()
    return GangEvents(state, recorded, WaitPolicy(60, 80), 3), recorded, state


A = MemberRef("default", "a", "uid-default-a", "n1", 2.5)
B = MemberRef("default", "b", "uid-default-b", "n2", 1.0)


def test_waiting_for_siblings_goes_on_the_podgroup_only() -> None:
    events, recorded, _ = gang_events()
    events.member_rejected(
        A, "default/g", FilterReason.TOO_FEW_SIBLINGS, "cannot find enough sibling pods"
    )
    [(ref, type_, reason, message)] = recorded.events
    assert (ref.kind, ref.api_version, ref.name, ref.uid) == (
        XK8S_API.kind,
        XK8S_API.api_version,
        "g",
        "pg-g",
    )
    assert (type_, reason) == (NORMAL, WAITING_FOR_SIBLINGS)
    assert "create the missing pods" in message


def test_label_only_groups_get_their_events_on_the_pods() -> None:
    events, recorded, _ = gang_events()
    events.member_rejected(
        A, "default/light", FilterReason.TOO_FEW_SIBLINGS, "cannot find enough sibling pods"
    )
    events.gang_admitted("default/light", [A, B])
    assert [(r.kind, r.name, reason) for r, _, reason, _ in recorded.events] == [
        ("Pod", "a", WAITING_FOR_SIBLINGS),
        ("Pod", "a", GANG_ADMITTED),
        ("Pod", "b", GANG_ADMITTED),
    ]


def test_insufficient_resources_is_a_warning_naming_the_gap() -> None:
    events, recorded, _ = gang_events()
    events.member_rejected(A, "default/g", FilterReason.MIN_RESOURCES, "short by cpu 88")
    [(ref, type_, reason, message)] = recorded.events
    assert (ref.kind, type_, reason) == ("PodGroup", WARNING, INSUFFICIENT_RESOURCES)
    assert "short by cpu 88" in message and "checked again in 3s" in message


def test_other_rejections_make_no_event() -> None:
    events, recorded, _ = gang_events()
    events.member_rejected(A, "default/g", "denied", "last failed")
    events.member_rejected(A, "default/g", "no-group", "PodGroup not found")
    assert recorded.events == []


def test_gang_waiting_says_how_many_and_for_how_long() -> None:
    events, recorded, _ = gang_events()
    events.member_waiting(A, "default/g", 2, 3)
    [(ref, type_, reason, message)] = recorded.events
    assert (ref.kind, type_, reason) == ("PodGroup", NORMAL, GANG_WAITING)
    assert message.startswith("2 of minMember 3 members placed; waiting up to 20s")


def test_gang_admitted_names_the_members_and_the_wait() -> None:
    events, recorded, _ = gang_events()
    events.gang_admitted("default/g", [B, A])
    [(ref, _, reason, message)] = recorded.events
    assert (ref.kind, reason) == ("PodGroup", GANG_ADMITTED)
    assert "2 member(s) bound together (a, b) after up to 2.5s" in message


def test_timeout_goes_on_the_podgroup_and_every_released_pod() -> None:
    events, recorded, _ = gang_events()
    events.gang_timed_out("default/g", [A, B], "gang default/g timed out after waiting 20s")
    assert [(r.kind, r.name) for r, _, _, _ in recorded.events] == [
        ("PodGroup", "g"),
        ("Pod", "a"),
        ("Pod", "b"),
    ]
    assert {(t, reason) for _, t, reason, _ in recorded.events} == {(WARNING, GANG_TIMED_OUT)}
    assert "retried in 3s" in recorded.events[0][3]


def test_preempted_names_the_gang_it_made_room_for() -> None:
    events, recorded, _ = gang_events()
    events.victim_preempted(B, None, "default/g")
    events.victim_preempted(B, "default/other", "default/a")
    events.victim_preempted(B, None, "a higher-priority pod")
    messages = [m for _, _, _, m in recorded.events]
    assert all(r.kind == "Pod" and r.name == "b" for r, _, _, _ in recorded.events)
    assert {reason for _, _, reason, _ in recorded.events} == {PREEMPTED}
    assert messages[0].endswith("so that gang default/g can be placed")
    assert (
        "so that pod default/a can be placed (this pod was a member of gang default/other)"
        in (messages[1])
    )
    assert messages[2].endswith("so that a higher-priority pod can be placed")


def test_contention_rejections_and_releases_are_reported() -> None:
    events, recorded, _ = gang_events()
    events.member_rejected(
        A, "default/g", FilterReason.WAITING_BEHIND, "waiting behind default/h (priority 5)"
    )
    events.member_rejected(
        A, "default/g", FilterReason.INSUFFICIENT_CAPACITY, "only 3 fit; short by cpu 3"
    )
    events.gang_released("default/g", [A, B], "released its reservations at once")
    assert [(r.kind, r.name, t, reason) for r, t, reason, _ in recorded.events] == [
        ("PodGroup", "g", NORMAL, GANG_QUEUED),
        ("PodGroup", "g", WARNING, INSUFFICIENT_RESOURCES),
        ("PodGroup", "g", WARNING, GANG_RELEASED),
        ("Pod", "a", WARNING, GANG_RELEASED),
        ("Pod", "b", WARNING, GANG_RELEASED),
    ]
    assert "nothing is reserved until all of them fit" in recorded.events[1][3]


# ---- a gang bound in part (--on-partial-bind; the decision: test_partial_bind.py) ------


def test_partly_bound_events_go_on_the_podgroup_and_each_bound_pod() -> None:
    events, recorded, _ = gang_events()
    for rolled_back, reason in ((True, GANG_BIND_ROLLED_BACK), (False, GANG_PARTLY_BOUND)):
        recorded.events.clear()
        events.gang_partly_bound("default/g", [A, B], "binding default/c refused; why", rolled_back)
        assert [(r.kind, r.name, t, why) for r, t, why, _ in recorded.events] == [
            ("PodGroup", "g", WARNING, reason),
            ("Pod", "a", WARNING, reason),
            ("Pod", "b", WARNING, reason),
        ]
        assert recorded.events[0][3] == (
            "gang default/g was admitted but binding default/c refused; why"
        )


def test_an_unusable_podgroup_gets_an_event_saying_what_is_wrong() -> None:
    events, recorded, _ = gang_events()
    events.member_rejected(
        A, "default/g", FilterReason.BAD_GROUP, "PodGroup default/g: spec.minMember bad"
    )
    [(ref, type_, reason, message)] = recorded.events
    assert (ref.kind, type_, reason) == ("PodGroup", WARNING, INVALID_POD_GROUP)
    assert message.startswith("PodGroup default/g: spec.minMember bad; its pods are turned away")


def test_gang_waiting_is_told_once_per_admission() -> None:
    events, recorded, _ = gang_events()
    events.member_waiting(A, "default/g", 1, 3)
    events.member_waiting(B, "default/g", 2, 3)
    assert [m for _, _, r, m in recorded.events if r == GANG_WAITING] == [
        "1 of minMember 3 members placed; waiting up to 20s in the permit gate for the rest "
        "(all are bound together once 3 are placed)"
    ]
    events.gang_admitted("default/g", [A, B])
    # The next admission (the gang was deleted and recreated, or grew) is told again.
    events.member_waiting(A, "default/g", 1, 3)
    assert [r for _, _, r, _ in recorded.events].count(GANG_WAITING) == 2
    events.gang_timed_out("default/g", [A], "timed out")
    events.member_waiting(A, "default/g", 1, 3)
    assert [r for _, _, r, _ in recorded.events].count(GANG_WAITING) == 3


def test_preemption_plan_events_go_on_the_podgroup_or_the_pending_members() -> None:
    events, recorded, state = gang_events()
    events.preemption_planned("default/g", "gang default/g preempts: 1 eviction(s) for 1 member(s)")
    events.preemption_ended("default/g", "preemption plan expired: ...")
    state.apply_pod(pod("l-0", light=("light", "2")))
    state.apply_pod(pod("l-1", light=("light", "2"), node="n1"))
    events.preemption_refused("default/light", "gang default/light cannot preempt: ...")
    assert [(r.kind, r.name, type_, reason) for r, type_, reason, _ in recorded.events] == [
        (XK8S_API.kind, "g", NORMAL, PREEMPTION_PLANNED),
        (XK8S_API.kind, "g", WARNING, PREEMPTION_ENDED),
        ("Pod", "l-0", WARNING, PREEMPTION_REFUSED),  # the placed member is not told
    ]


def test_an_objectless_gang_placed_before_the_watch_brings_a_member_tells_the_first_one() -> None:
    """The filter can admit a label-only gang from its leader's call before our watch has
    the leader: the TopologyPlaced Event waits for the first member the watch delivers."""
    events, recorded, state = gang_events()
    events.gang_placed("default/light", "gang default/light is placed in rack r2")
    assert recorded.events == []
    state.add_pod_listener(events.on_pod_change)
    state.apply_pod(pod("light-0", light=("light", "2")))
    state.apply_pod(pod("light-1", light=("light", "2")))
    [(ref, type_, reason, message)] = recorded.events
    assert (ref.kind, ref.name, type_, reason) == ("Pod", "light-0", NORMAL, TOPOLOGY_PLACED)
    assert message == "gang default/light is placed in rack r2"
    # A group with members in the watch gets its Events at once, as before.
    events.gang_placed("default/light", "again")
    assert sorted(r.name for r, _, _, _ in recorded.events[1:]) == ["light-0", "light-1"]
