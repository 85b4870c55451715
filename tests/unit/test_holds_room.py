"""A held gang is released only once it fits in what kube-scheduler sees free (issue 49):
pods leaving still hold their room, nominated pods theirs (app/core/fit_now.py). On the
in-memory state with the real arbiter, line and waker (tests/unit/test_holds.py's World)."""

from tests.unit.builders import pod
from tests.unit.test_holds import World


def fill(world: World, priority: int = 0, *, deleting: bool = False) -> None:
    """Each of the three 4-CPU nodes full with one pod."""
    for i in range(3):
        raw = pod(f"r{i}", cpu="4", node=f"n{i}", phase="Running", deleting=deleting)
        raw["spec"]["priority"] = priority
        world.state.apply_pod(raw)


async def test_a_held_gang_waits_for_leaving_pods_to_be_gone_before_it_is_released() -> None:
    world = World()
    fill(world)
    world.gang("a", 3, "2500m")
    await world.settled()
    assert world.held_now() == {"a-0", "a-1", "a-2"}

    # The pods are on their way out: the line counts their room free (a gang the filter
    # admits waits a moment for it), kube-scheduler does not yet: a stays held.
    fill(world, deleting=True)
    await world.settled()
    assert world.held_now() == {"a-0", "a-1", "a-2"}
    assert world.api.released == []

    for i in range(3):
        world.state.delete_pod("default", f"r{i}")
    await world.settled()
    assert world.held_now() == set()
    assert sorted(world.api.released) == ["a-0", "a-1", "a-2"]


def nominate(world: World, name: str, node: str, priority: int, *, cpu: str = "4") -> None:
    raw = pod(name, cpu=cpu)
    raw["spec"]["priority"] = priority
    raw["status"]["nominatedNodeName"] = node
    world.state.apply_pod(raw)


async def test_room_kube_scheduler_keeps_for_a_nominated_pod_is_not_released_onto() -> None:
    """A plain pod of priority 100 preempted a node's pod (kube-scheduler's own preemption)
    and is nominated there: a held gang of priority 0 that fits only with that node stays
    held until the nomination goes."""
    world = World()
    fill(world)
    world.gang("a", 3, "2500m")
    await world.settled()
    nominate(world, "p", "n0", 100)
    for i in range(3):
        world.state.delete_pod("default", f"r{i}")
    await world.settled()
    assert world.held_now() == {"a-0", "a-1", "a-2"}

    # kube-scheduler cleared the nomination (its preemption was refused): a goes.
    raw = pod("p", cpu="4")
    raw["spec"]["priority"] = 100
    raw["metadata"]["resourceVersion"] = "2"
    world.state.apply_pod(raw)
    await world.settled()
    assert world.held_now() == set()


async def test_a_gang_of_higher_priority_than_the_nominated_pod_is_released() -> None:
    world = World()
    fill(world)
    world.gang("a", 3, "2500m", priority=1000)
    await world.settled()
    nominate(world, "p", "n0", 100)
    for i in range(3):
        world.state.delete_pod("default", f"r{i}")
    await world.settled()
    assert world.held_now() == set()
