"""A fresh list of pods landed in slices (app/core/state.PodRelist, app/runtime/watches.land_pods).

Between two slices verbs read the state. What they see must be a defined
merge of the old view and the new list: no pod lost, none counted twice,
and the free room, the room kept between calls and the gangs' members
exactly those of a state built afresh from the pods present at that moment.
At the end the state is the one a fresh list builds.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.pod_relist import PodRelist
from app.core.state import ClusterState
from app.ops.cachedump import cache_snapshot
from app.runtime.watches import land_pods
from tests.unit.builders import node, pod

_NODES = ("n1", "n2", "n3")
_NAMES = tuple(f"p{i}" for i in range(8))

# One pod of a list: (node or "", cores, phase, incarnation, deleting); None: not listed.
_VERSION = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from(["", *_NODES]),
        st.sampled_from(["1", "2"]),
        st.sampled_from(["Pending", "Running", "Succeeded"]),
        st.sampled_from(["a", "b"]),
        st.booleans(),
    ),
)
_LIST = st.fixed_dictionaries({name: _VERSION for name in _NAMES})


def _raws(listed: dict[str, Any], version: str) -> dict[str, dict[str, Any]]:
    raws = {}
    for name, spec in listed.items():
        if spec is None:
            continue
        where, cores, phase, incarnation, deleting = spec
        group = "g" if name in ("p0", "p1", "p2") else None
        raw = pod(
            name,
            group=group,
            node=where,
            cpu=cores,
            phase=phase,
            uid=f"{name}-{incarnation}",
            deleting=deleting,
        )
        raw["metadata"]["resourceVersion"] = version
        raws[f"default/{name}"] = raw
    return raws


def _as_applied(new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """The listed pod as the state applies it over the old one: a pod's nodeName never goes
    back to empty (an older copy must not unbind it), as for a watch event."""
    if old is None or old["metadata"]["uid"] != new["metadata"]["uid"]:
        return new
    if new["spec"]["nodeName"] or not old["spec"]["nodeName"]:
        return new
    return {**new, "spec": {**new["spec"], "nodeName": old["spec"]["nodeName"]}}


def _fresh(raws: list[dict[str, Any]]) -> ClusterState:
    state = ClusterState()
    state.replace_nodes([node(n) for n in _NODES])
    state.replace_pods(raws)
    return state


def _view(state: ClusterState) -> dict[str, Any]:
    """What the verbs read: room per node (kept between calls), free sums, members, indexes."""
    return {
        "room": [(b.name, dict(b.free)) for b in state.room()],
        "free": state.free_resources(),
        "free without g": state.free_resources("default/g"),
        "members": sorted(p.key for p in state.members("default/g")),
        "leaving": sorted(state.leaving),
        "bound": sorted(p.key for p in state.bound_members("default/g")),
        "requested": {n: dict(state.requested_on(n)) for n in _NODES},
        "on": {n: sorted(p.key for p in state.pods_on(n)) for n in _NODES},
        "pods": cache_snapshot(state)["pods"],
    }


@settings(max_examples=300, deadline=None)
@given(old=_LIST, new=_LIST, most=st.integers(1, 4), order=st.randoms())
def test_between_slices_the_state_is_a_fresh_build_of_the_pods_present(
    old: dict[str, Any], new: dict[str, Any], most: int, order: Any
) -> None:
    old_raws, new_raws = _raws(old, "1"), _raws(new, "2")
    listed = list(new_raws.values())
    order.shuffle(listed)
    state = _fresh(list(old_raws.values()))
    state.room()  # kept between calls from here on: a stale bin would show below
    relist = PodRelist.of(state, listed)
    landed: dict[str, dict[str, Any]] = {}
    done = False
    while not done:
        done = relist.advance(most)
        present = set(state.pods)
        # No pod lost: every listed pod landed so far is there, and every old one until
        # the list is in; nothing but old or listed pods.
        for raw in listed:
            key = f"default/{raw['metadata']['name']}"
            if key in present and key not in landed and state.pods[key].resource_version == "2":
                landed[key] = _as_applied(raw, old_raws.get(key))
        assert set(landed) <= present
        assert present <= set(old_raws) | set(new_raws)
        if len(landed) < len(listed):
            assert set(old_raws) <= present
        # The state is exactly that of the pods present, as a fresh build has them.
        now = [landed.get(key) or old_raws[key] for key in sorted(present)]
        assert _view(state) == _view(_fresh(now))
    assert set(landed) == set(new_raws)
    assert _view(state) == _view(_fresh(list(landed.values())))


def test_a_reservation_and_a_binding_made_mid_relist_are_kept() -> None:
    """The gate reserves and binds between slices: the list (older than that) keeps them."""
    state = _fresh([pod("a", group="g"), pod("b", group="g")])
    relist = PodRelist.of(state, [pod("x"), pod("a", group="g"), pod("b", group="g")])
    relist.advance(1)
    state.reserve("default/a", "n1")
    state.assume_bound("default/b", "n2")
    assert relist.advance(10)
    assert state.pods["default/a"].reserved_node == "n1"
    assert state.pods["default/b"].node_name == "n2"
    assert state.free_resources()["cpu"] == 3 * 4000 - 2000


def test_a_pod_read_from_the_api_mid_relist_is_not_removed_as_left_out() -> None:
    """A verb reads a pod kube-scheduler names (another incarnation of one the list left
    out) between slices: only the incarnation the list left out is removed."""
    state = _fresh([pod("a", uid="old")])
    relist = PodRelist.of(state, [pod("b")])
    relist.advance(1)
    state.apply_pod(pod("a", uid="new"))
    assert relist.advance(10)
    assert state.pods["default/a"].uid == "new"
    assert set(state.pods) == {"default/a", "default/b"}


async def test_land_pods_lets_a_verb_read_between_slices() -> None:
    """The watches' landing yields the event loop: a read runs before the list is all in."""
    state = _fresh([])
    listed = [pod(f"p{i}", node="n1", cpu="10m") for i in range(50)]
    seen: list[int] = []

    async def verb() -> None:
        while len(seen) < 3:
            seen.append(len(state.pods))
            await asyncio.sleep(0)

    await asyncio.gather(land_pods(state, listed, most=10), verb())
    assert 0 < seen[1] < 50  # read mid-relist
    assert _view(state) == _view(_fresh(listed))
