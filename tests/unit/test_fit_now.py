"""Which gangs the line chose fit in the room kube-scheduler sees free now (app/core/fit_now.py)."""

from app.core.fit_now import Nominated, fit_now
from tests.unit.test_contention import cluster, cpu, gang, holder


def test_gangs_fit_each_in_what_the_ones_before_left() -> None:
    free = cluster(4, 4)
    chosen = [gang("a", 2, 3), gang("b", 2, 1), gang("c", 1, 1)]
    # a takes 3 of each node, b the last core of each: c finds nothing left.
    assert fit_now(chosen, free, (), ()) == ["a", "b"]
    assert [b.free["cpu"] for b in free] == [4000, 4000]  # the caller's bins are not changed


def test_a_claims_promise_is_not_free() -> None:
    free = cluster(4, 4)
    assert fit_now([gang("a", 2, 3)], free, [holder("h", {"n0": 2})], ()) == []
    assert fit_now([gang("a", 1, 3)], free, [holder("h", {"n0": 2})], ()) == ["a"]


def test_a_nominated_pod_keeps_its_room_from_gangs_of_its_priority_or_lower() -> None:
    free = cluster(4, 4)
    nominated = [Nominated("", 100, "n0", cpu(3))]
    assert fit_now([gang("a", 2, 3, priority=100)], free, (), nominated) == []
    assert fit_now([gang("a", 2, 3, priority=0)], free, (), nominated) == []
    # A gang of higher priority may take it: kube-scheduler keeps it only from lower ones.
    assert fit_now([gang("a", 2, 3, priority=1000)], free, (), nominated) == ["a"]


def test_a_gangs_own_nominated_members_keep_no_room_from_it() -> None:
    free = cluster(4, 4)
    own = [Nominated("a", 0, "n0", cpu(3)), Nominated("a", 0, "n1", cpu(3))]
    assert fit_now([gang("a", 2, 3)], free, (), own) == ["a"]
    # ... but from the gang after it, which also finds a's room taken.
    assert fit_now([gang("a", 2, 3), gang("b", 1, 1)], free, (), own) == ["a", "b"]
    assert fit_now([gang("b", 1, 2)], free, (), own) == []


def test_a_nominated_pod_does_not_take_the_room_of_gangs_before_twice() -> None:
    """The promise is weighed per gang against what is left, not taken from it."""
    free = cluster(4, 4)
    nominated = [Nominated("", 100, "n1", cpu(2))]
    chosen = [gang("a", 1, 2), gang("b", 1, 2), gang("c", 1, 2)]
    # n0 takes a and b; n1 keeps 2 of its 4 cores for the nominated pod: c fits in the rest.
    assert fit_now(chosen, free, (), nominated) == ["a", "b", "c"]
    assert fit_now([*chosen, gang("d", 1, 1)], free, (), nominated) == ["a", "b", "c"]


def test_a_claims_nominated_members_are_not_counted_twice() -> None:
    """A claim's members late to the gate are nominated for its nodes (claim_nominees.py):
    its promise keeps that room once."""
    free = cluster(4)
    claim = holder("c", {"n0": 3})
    late = [Nominated("c", 0, "n0", cpu(3))]
    assert fit_now([gang("a", 1, 1)], free, [claim], late) == ["a"]
    assert fit_now([gang("a", 1, 2)], free, [claim], late) == []
