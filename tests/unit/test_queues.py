"""The queue core: deserved shares (water-filling), enqueue, DRF order, reclaim choice."""

from __future__ import annotations

import pytest

from app.core.packing import Bin, Demand
from app.core.queues import (
    QueueSpec,
    QueueSpecError,
    QueueView,
    Running,
    choose_victims,
    deserved_shares,
    dominant_share,
    enqueue,
    queue_from,
)

CPU = 1000
CAPACITY = {"cpu": 12 * CPU, "memory": 48 * 2**30 * 1000, "pods": 330 * 1000}


def q(name: str, weight: int = 1, **kwargs: object) -> QueueSpec:
    return QueueSpec(name, weight, **kwargs)  # type: ignore[arg-type]


def cpu(n: float) -> dict[str, int]:
    return {"cpu": int(n * CPU)}


def test_equal_weights_with_heavy_demand_split_evenly() -> None:
    shares = deserved_shares({"a": q("a"), "b": q("b")}, {"a": cpu(100), "b": cpu(100)}, CAPACITY)
    assert shares["a"]["cpu"] == shares["b"]["cpu"] == 6 * CPU


def test_weights_three_to_one() -> None:
    shares = deserved_shares(
        {"a": q("a", 3), "b": q("b", 1)}, {"a": cpu(100), "b": cpu(100)}, CAPACITY
    )
    assert (shares["a"]["cpu"], shares["b"]["cpu"]) == (9 * CPU, 3 * CPU)


def test_what_a_small_queue_leaves_is_shared_again() -> None:
    """b asks for 2 of its 4: the rest goes to a and c by their weights (water-filling)."""
    shares = deserved_shares(
        {"a": q("a", 1), "b": q("b", 1), "c": q("c", 1)},
        {"a": cpu(100), "b": cpu(2), "c": cpu(100)},
        CAPACITY,
    )
    assert shares["b"]["cpu"] == 2 * CPU
    assert shares["a"]["cpu"] == shares["c"]["cpu"] == 5 * CPU


def test_an_idle_queue_deserves_nothing_and_the_other_everything() -> None:
    shares = deserved_shares({"a": q("a"), "b": q("b")}, {"a": cpu(100)}, CAPACITY)
    assert shares["a"]["cpu"] == 12 * CPU
    assert shares["b"]["cpu"] == 0


def test_capability_caps_and_the_rest_goes_to_the_others() -> None:
    shares = deserved_shares(
        {"a": q("a", capability=cpu(2)), "b": q("b")}, {"a": cpu(100), "b": cpu(100)}, CAPACITY
    )
    assert shares["a"]["cpu"] == 2 * CPU
    assert shares["b"]["cpu"] == 10 * CPU


def test_guarantee_is_a_floor_even_without_demand_and_kept_from_the_others() -> None:
    shares = deserved_shares(
        {"a": q("a"), "b": q("b", guarantee=cpu(4))}, {"a": cpu(100)}, CAPACITY
    )
    assert shares["b"]["cpu"] == 4 * CPU
    assert shares["a"]["cpu"] == 8 * CPU


def test_dominant_share_is_the_largest_fraction_and_ignores_pod_slots() -> None:
    assert dominant_share({"cpu": 3 * CPU, "pods": 300_000}, CAPACITY) == 0.25
    assert dominant_share({}, CAPACITY) == 0.0


def view(
    spec: QueueSpec, allocated: float, deserved: float, head: float | None = None
) -> QueueView:
    return QueueView(
        spec,
        cpu(allocated),
        cpu(deserved),
        cpu(head) if head is not None else None,
        1 if head is not None else 0,
    )


def test_a_queue_below_its_share_admits_up_to_the_overcommitted_share() -> None:
    views = {"a": view(q("a"), 4, 6), "b": view(q("b"), 6, 6, head=2)}
    assert enqueue("a", cpu(2), views, CAPACITY, 1.2) is None
    # 4 + 4 = 8 is beyond 6 * 1.2, but b is at its share: nobody below it waits.
    assert enqueue("a", cpu(4), views, CAPACITY, 1.2) is None


def test_a_queue_at_its_share_waits_while_another_below_its_share_waits() -> None:
    views = {"a": view(q("a"), 6, 6), "b": view(q("b"), 4, 6, head=2)}
    message = enqueue("a", cpu(2), views, CAPACITY, 1.2)
    assert message == (
        "queue a (weight 1) holds cpu 6 of its deserved cpu 6 and this gang (cpu 2) would "
        "take it beyond that, while a queue below its share waits: queue b (weight 1) holds "
        "cpu 4 of its deserved cpu 6 with 1 gang(s) waiting; the gang is admitted once its "
        "queue is below its share or no queue below its share waits"
    )


def test_work_conserving_when_the_queue_below_its_share_waits_for_nothing_it_can_take() -> None:
    """b's waiting gang would overshoot even its overcommitted share: a may use the room."""
    views = {"a": view(q("a"), 6, 6), "b": view(q("b"), 4, 6, head=8)}
    assert enqueue("a", cpu(2), views, CAPACITY, 1.2) is None
    views = {"a": view(q("a"), 6, 6), "b": view(q("b"), 0, 0)}
    assert enqueue("a", cpu(6), views, CAPACITY, 1.2) is None


def test_capability_caps_even_when_the_other_queue_is_idle() -> None:
    views = {"a": view(q("a", capability=cpu(4)), 4, 4), "b": view(q("b"), 0, 0)}
    message = enqueue("a", cpu(2), views, CAPACITY, 1.2)
    assert message is not None
    assert "would exceed cpu 4 (its capability" in message


def test_an_unused_guarantee_is_kept_free() -> None:
    views = {"a": view(q("a"), 8, 8), "b": view(q("b", guarantee=cpu(4)), 0, 4)}
    message = enqueue("a", cpu(2), views, CAPACITY, 1.2)
    assert message is not None and "would exceed cpu 8 (the cluster" in message
    assert enqueue("b", cpu(4), views, CAPACITY, 1.2) is None


def test_a_closed_queue_admits_nothing() -> None:
    views = {"a": view(q("a", state="Closed"), 0, 6)}
    assert enqueue("a", cpu(1), views, CAPACITY, 1.2) == (
        "queue a is Closed: it admits no new gang; the gang waits until the queue is Open"
    )


def test_queue_from_reads_volcano_fields_and_defaults() -> None:
    spec = queue_from(
        {
            "metadata": {"name": "t"},
            "spec": {
                "weight": 3,
                "capability": {"cpu": "8"},
                "guarantee": {"resource": {"cpu": "2"}},
                "reclaimable": False,
            },
            "status": {"state": "Closed"},
        }
    )
    assert spec == QueueSpec("t", 3, cpu(8), cpu(2), False, "Closed")
    assert queue_from({"metadata": {"name": "d"}}) == QueueSpec("d")
    with pytest.raises(QueueSpecError, match=r"spec\.weight"):
        queue_from({"metadata": {"name": "x"}, "spec": {"weight": "heavy"}})


def running(
    key: str, queue: str, node: str, n: float, priority: int = 0, created: float = 0
) -> Running:
    return Running(key, queue, priority, created, {node: cpu(n)}, cpu(n))


def test_reclaim_takes_the_most_recent_lowest_priority_gangs_of_queues_above_their_share() -> None:
    full = [Bin("n1", cpu(0)), Bin("n2", cpu(0))]
    gangs = [
        running("a/old", "a", "n1", 2, created=1),
        running("a/new", "a", "n2", 2, created=3),
        running("a/high", "a", "n2", 2, priority=5, created=4),
        running("b/own", "b", "n1", 2, created=5),
    ]
    views = {"a": view(q("a"), 6, 4), "b": view(q("b"), 2, 4, head=2)}
    demands = [Demand("b/x-0", cpu(1)), Demand("b/x-1", cpu(1))]
    assert choose_victims("b", demands, 2, full, gangs, views) == ["a/new"]


def test_reclaim_spares_victims_the_gang_does_not_need() -> None:
    full = [Bin("n1", cpu(0)), Bin("n2", cpu(0))]
    gangs = [running("a/new", "a", "n1", 1, created=3), running("a/old", "a", "n2", 3, created=1)]
    views = {"a": view(q("a"), 4, 1), "b": view(q("b"), 0, 3, head=3)}
    assert choose_victims("b", [Demand("b/x-0", cpu(3))], 1, full, gangs, views) == ["a/old"]


def test_reclaim_never_from_a_queue_that_is_not_reclaimable_or_not_above_its_share() -> None:
    full = [Bin("n1", cpu(0))]
    gangs = [running("a/g", "a", "n1", 2), running("c/g", "c", "n1", 2)]
    views = {
        "a": view(q("a", reclaimable=False), 6, 4),
        "b": view(q("b"), 0, 4, head=2),
        "c": view(q("c"), 2, 4),
    }
    assert choose_victims("b", [Demand("b/x", cpu(2))], 1, full, gangs, views) is None
