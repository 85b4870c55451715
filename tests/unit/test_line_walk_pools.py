"""The line walk's set-aside gangs take their share of a shared device pool (issue 47).

A gang ahead in line that fits but is not admitted yet has its room set aside
(app/runtime/line_walk.py) so the gangs behind it decide over what is left. It
took its nodes' room but not what its members draw of a pool published for
many nodes: each node a pool serves shows the pool in full, so a gang behind
could be admitted into the very pool devices the gang ahead was counted on.
"""

from __future__ import annotations

from app.core.contention import Gang
from app.core.packing import Bin, Demand
from app.core.room import Room
from app.core.shared_pools import SharedPool
from app.runtime.line_pass import LineAt
from app.runtime.line_walk import LineWalk

GPU = "devices/gpu.example.com"


def _gang(name: str, members: int, gpus: int = 1, minute: int = 0) -> Gang:
    demands = tuple(
        Demand(f"default/{name}-{i}", {"cpu": 1000, "pods": 1000, GPU: gpus * 1000})
        for i in range(members)
    )
    return Gang(f"default/{name}", 0, float(minute * 60), demands, members)


def _cluster() -> tuple[SharedPool, list[Bin]]:
    """n1 and n2 share a pool of 4 devices (none of their own); n3 has CPU only."""
    rack = SharedPool("gpu/rack", {GPU: 4000}, {GPU: 4000})
    bins = [
        Bin(name, {"cpu": 8000, "pods": 10_000, GPU: 4000}, pools=(rack,)) for name in ("n1", "n2")
    ]
    bins.append(Bin("n3", {"cpu": 8000, "pods": 10_000}))
    return rack, bins


def _over(line: list[Gang], bins: list[Bin]) -> LineAt:
    return LineAt(line, bins, (), {b.name: i for i, b in enumerate(bins)}, 0.0, 600.0)


def test_a_gang_set_aside_takes_its_share_of_the_pool_from_the_gangs_behind() -> None:
    """a (3 x 1 device) is ahead in line and fits: set aside. b (3 x 1 device) behind it
    finds 1 of the pool's 4 left, though each node still shows more: not admitted."""
    rack, bins = _cluster()
    walk = LineWalk()
    walked = walk.walked(_over([_gang("a", 3)], bins))
    assert walked is not None
    assert not Room(walked.bins, (), ()).pack(_gang("b", 3, minute=1), thorough=True).fits
    assert Room(walked.bins, (), ()).pack(_gang("c", 1, minute=1), thorough=True).fits
    # The walk's draws are its own: the state's pool is as it was.
    assert rack.free == {GPU: 4000} and rack.used_on == {}
    # Walked again from after a (another gang joined behind it), a's draw still holds.
    walked = walk.walked(_over([_gang("a", 3), _gang("cpu", 2, gpus=0, minute=2)], bins))
    assert walked is not None and walk.walked_again == 1
    assert not Room(walked.bins, (), ()).pack(_gang("b", 3, minute=3), thorough=True).fits
    # Nothing set aside: b fits the pool.
    assert Room(bins, (), ()).pack(_gang("b", 3), thorough=True).fits


def test_a_pool_that_changed_since_the_walk_is_read_as_it_is_now() -> None:
    """The kept walk draws a's share on the pool as it is at each decision: devices freed
    since (a claim ended) are there for the gangs behind."""
    rack, bins = _cluster()
    walk = LineWalk()
    rack.free = {GPU: 3000}
    walk.walked(_over([_gang("a", 3)], bins))
    rack.free = {GPU: 4000}  # the state refreshes its pools in place
    walked = walk.walked(_over([_gang("a", 3), _gang("cpu", 2, gpus=0, minute=2)], bins))
    assert walked is not None and walk.walked_again == 1
    assert Room(walked.bins, (), ()).pack(_gang("c", 1, minute=3), thorough=True).fits
    assert not Room(walked.bins, (), ()).pack(_gang("b", 2, minute=3), thorough=True).fits
