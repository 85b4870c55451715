from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.packing import Bin
from app.core.pod_index import GONE_KEPT
from app.core.state import ClusterState
from tests.unit.builders import cluster, node, pod, podgroup

GI = 2**30 * 1000


def test_free_resources_count_bound_and_reserved_pods() -> None:
    state = cluster()
    state.apply_pod(pod("bound", node="n1", cpu="1"))
    state.apply_pod(pod("waiting", group="g", cpu="2"))
    state.reserve("default/waiting", "n2")
    free = state.free_resources()
    assert free["cpu"] == 8000 - 1000 - 2000
    assert free["pods"] == 220_000 - 2000
    state.unreserve("default/waiting")
    assert state.free_resources()["cpu"] == 8000 - 1000


def test_free_resources_can_exclude_the_groups_own_pods() -> None:
    state = cluster()
    state.apply_pod(pod("a", group="g", node="n1", cpu="3"))
    state.apply_pod(pod("other", node="n1", cpu="1"))
    assert state.free_resources()["cpu"] == 4000
    assert state.free_resources(exclude_group="default/g")["cpu"] == 7000


def test_terminal_pods_free_their_resources_and_leave_the_group() -> None:
    state = cluster()
    state.apply_pod(pod("a", group="g", node="n1", cpu="3"))
    state.apply_pod(pod("b", group="g"))
    assert sorted(p.name for p in state.members("default/g")) == ["a", "b"]
    state.apply_pod(pod("a", group="g", node="n1", cpu="3", phase="Succeeded"))
    assert state.free_resources()["cpu"] == 8000
    assert [p.name for p in state.members("default/g")] == ["b"]


def test_node_name_never_goes_back_to_empty() -> None:
    """An event older than our own binding must not unbind the pod in our view."""
    state = cluster()
    state.apply_pod(pod("a", group="g"))
    state.reserve("default/a", "n1")
    state.assume_bound("default/a", "n1")
    state.apply_pod(pod("a", group="g"))  # stale MODIFIED from before the binding
    assert state.pods["default/a"].node_name == "n1"
    assert state.free_resources()["cpu"] == 7000


def test_relist_drops_pods_deleted_while_not_watching() -> None:
    state = cluster()
    seen: list[tuple[str | None, str | None]] = []
    state.add_pod_listener(
        lambda old, new: seen.append((old.name if old else None, new.name if new else None))
    )
    state.replace_pods([pod("a", node="n1"), pod("b", node="n2")])
    state.replace_pods([pod("b", node="n2")])
    assert set(state.pods) == {"default/b"}
    assert ("a", None) in seen
    assert state.free_resources()["cpu"] == 7000


def test_delete_ignores_a_different_incarnation() -> None:
    state = cluster()
    state.apply_pod(pod("a", uid="new"))
    state.delete_pod("default", "a", uid="old")
    assert "default/a" in state.pods
    state.delete_pod("default", "a", uid="new")
    assert "default/a" not in state.pods


def test_group_spec_lookup_explains_missing_podgroups() -> None:
    state = cluster()
    state.apply_pod(pod("a", group="missing"))
    ref = state.pods["default/a"].group
    assert ref is not None
    try:
        state.group_spec(ref)
    except LookupError as err:
        assert "PodGroup default/missing not found: create it" in str(err)
    else:
        raise AssertionError("expected GroupNotFound")
    state.apply_podgroup(podgroup("missing", 2))
    assert state.group_spec(ref).min_member == 2
    state.apply_pod(pod("l", light=("mpi", "3")))
    light = state.pods["default/l"].group
    assert light is not None and state.group_spec(light).min_member == 3


def test_unschedulable_nodes_offer_nothing() -> None:
    state = cluster()
    cordoned = node("n2")
    cordoned["spec"]["unschedulable"] = True
    state.apply_node(cordoned)
    assert state.free_resources()["memory"] == 8 * GI


def test_a_group_without_members_keeps_no_stamp() -> None:
    """Groups come and go with their Jobs: the state remembers nothing of an empty one."""
    state = cluster()
    state.apply_pod(pod("j-0", group="j"))
    first = state.group_stamp("default/j")
    assert first > 0
    state.delete_pod("default", "j-0")
    assert state.group_stamp("default/j") == 0
    assert "default/j" not in state._changes._group_stamps
    state.apply_pod(pod("j-0", group="j"))
    assert state.group_stamp("default/j") > first


def test_an_update_that_changes_nothing_the_verbs_read_reaches_no_listener() -> None:
    """The watch echoes our own binding, and the kubelet updates statuses all the time."""
    state = cluster()
    seen: list[str] = []
    state.add_pod_listener(lambda old, new: seen.append(new.name if new else "gone"))
    state.apply_pod(pod("a", group="g"))
    state.assume_bound("default/a", "n1")
    record = state.pods["default/a"]
    stamp, _ = state.nodes_changed_since(0)
    group_stamp = state.group_stamp("default/g")

    echo = pod("a", group="g", node="n1")
    echo["metadata"]["resourceVersion"] = "7"
    echo["status"]["containerStatuses"] = [{"name": "c", "ready": False}]  # not read by us
    state.apply_pod(echo)
    assert seen == ["a"]  # only the first apply
    assert state.pods["default/a"] is record
    assert record.resource_version == "7"
    assert state.nodes_changed_since(stamp) == (stamp, [])  # n1's scores stay remembered
    assert state.group_stamp("default/g") == group_stamp

    running = pod("a", group="g", node="n1", phase="Running")
    state.apply_pod(running)
    assert seen == ["a", "a"]
    assert state.pods["default/a"].phase == "Running"


def test_leaving_and_nominated_follow_every_change_and_room_counts_leaving_as_free() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])  # 4 CPUs each
    state.apply_pod(pod("going", node="n1", cpu="3", deleting=True))
    state.apply_pod(pod("staying", node="n1", cpu="1"))
    waiting = pod("waiting", cpu="2")
    waiting["status"]["nominatedNodeName"] = "n2"
    state.apply_pod(waiting)
    assert set(state.leaving) == {"default/going"}
    assert set(state.nominated) == {"default/waiting"}
    free = {b.name: b.free["cpu"] for b in state.room()}
    assert free == {"n1": 4000 - 1000, "n2": 4000}  # "going" counts as gone already

    state.reserve("default/waiting", "n2")  # held in the gate: placed, no longer nominated
    assert state.nominated == {}
    state.unreserve("default/waiting")
    assert set(state.nominated) == {"default/waiting"}
    state.assume_bound("default/waiting", "n2")
    assert state.nominated == {}
    assert {b.name: b.free["cpu"] for b in state.room()}["n2"] == 2000

    state.delete_pod("default", "going")
    assert state.leaving == {}
    finished = pod("staying", node="n1", cpu="1", phase="Succeeded", deleting=True)
    state.apply_pod(finished)
    assert state.leaving == {}  # a finished pod holds nothing to free


_NODES = ("n1", "n2", "n3")
_PODS = ("a", "b", "c", "d")
_GANG = ("a", "b")  # members of default/g
_STEPS = st.one_of(
    st.tuples(st.just("node"), st.sampled_from(_NODES), st.sampled_from(["2", "4", "8"])),
    st.tuples(st.just("cordon"), st.sampled_from(_NODES), st.booleans()),
    st.tuples(st.just("drop node"), st.sampled_from(_NODES)),
    st.tuples(
        st.just("pod"),
        st.sampled_from(_PODS),
        st.sampled_from(["", *_NODES]),
        st.sampled_from(["1", "2"]),
        st.sampled_from(["Pending", "Running", "Succeeded"]),
        st.booleans(),
    ),
    st.tuples(st.just("drop pod"), st.sampled_from(_PODS)),
    st.tuples(st.just("reserve"), st.sampled_from(_PODS), st.sampled_from(_NODES)),
    st.tuples(st.just("unreserve"), st.sampled_from(_PODS)),
    st.tuples(st.just("bound"), st.sampled_from(_PODS), st.sampled_from(_NODES)),
)


def _step(state: ClusterState, step: tuple[Any, ...]) -> None:
    match step:
        case ("node", name, cores):
            state.apply_node(node(name, cpu=cores))
        case ("cordon", name, unschedulable):
            raw = node(name)
            raw["spec"]["unschedulable"] = unschedulable
            state.apply_node(raw)
        case ("drop node", name):
            state.delete_node(name)
        case ("pod", name, where, cores, phase, deleting):
            group = "g" if name in _GANG else None
            state.apply_pod(
                pod(name, group=group, node=where, cpu=cores, phase=phase, deleting=deleting)
            )
        case ("drop pod", name):
            state.delete_pod("default", name)
        case ("reserve", name, where):
            state.reserve(f"default/{name}", where)
        case ("unreserve", name):
            state.unreserve(f"default/{name}")
        case ("bound", name, where):
            state.assume_bound(f"default/{name}", where)


def _bins(state: ClusterState) -> list[tuple[str, dict[str, int], dict[str, str]]]:
    return [(b.name, dict(b.free), dict(b.labels)) for b in state.room()]


def _free_summed_afresh(state: ClusterState, exclude_group: str | None) -> dict[str, int]:
    """The minResources rule's free capacity, added up node by node from the records."""
    own = state.members(exclude_group) if exclude_group else []
    free: dict[str, int] = {}
    for record in state.nodes.values():
        if record.unschedulable:
            continue
        used = dict(state.requested_on(record.name))
        for member in own:
            if member.placed_node == record.name:
                for name, amount in member.requests.items():
                    used[name] = used.get(name, 0) - amount
        for name, amount in record.allocatable.items():
            if amount - used.get(name, 0) > 0:
                free[name] = free.get(name, 0) + amount - used.get(name, 0)
    return free


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_STEPS, max_size=25))
def test_room_kept_between_calls_equals_room_computed_afresh(
    steps: list[tuple[Any, ...]],
) -> None:
    """room(), room_positions() and free_resources() redo only the nodes that changed
    since they were last asked; never a stale bin, position or sum."""
    kept = ClusterState()
    kept.replace_nodes([node(n) for n in _NODES])
    handed: list[tuple[list[Bin], list[tuple[str, dict[str, int], dict[str, str]]]]] = []
    for i, step in enumerate(steps):
        _step(kept, step)
        fresh = ClusterState()
        fresh.replace_nodes([node(n) for n in _NODES])
        for earlier in steps[: i + 1]:
            _step(fresh, earlier)
        assert _bins(kept) == _bins(fresh)
        for group in (None, "default/g"):
            assert kept.free_resources(group) == _free_summed_afresh(fresh, group)
        # The gate's count of bound members (kept by the change) against the members read.
        assert sorted(p.key for p in kept.bound_members("default/g")) == sorted(
            p.key for p in fresh.members("default/g") if p.node_name
        )
        bins = kept.room()
        assert dict(kept.room_positions()) == {b.name: i for i, b in enumerate(bins)}
        handed.append((bins, [(b.name, dict(b.free), dict(b.labels)) for b in bins]))
    # Bins handed out earlier are never changed by what came after.
    for bins, seen in handed:
        assert [(b.name, b.free, dict(b.labels)) for b in bins] == seen


def test_deleted_pods_are_remembered_latest_first_and_bounded() -> None:
    """The uids a late pod read is checked against: every deletion's, the oldest forgotten."""
    state = ClusterState()
    state.apply_pod(pod("a"))
    state.delete_pod("default", "a", "uid-default-a")
    state.delete_pod("default", "never-seen", "uid-x")
    state.apply_pod(pod("b"))
    state.replace_pods([])
    assert all(uid in state.gone for uid in ("uid-default-a", "uid-x", "uid-default-b"))
    assert state.gone.relists == 2  # its start and its end: a read across either is not stored
    for i in range(GONE_KEPT):
        state.gone.add(f"u{i}")
    assert "uid-default-a" not in state.gone
    assert f"u{GONE_KEPT - 1}" in state.gone


def _afresh(steps: list[tuple[Any, ...]]) -> ClusterState:
    fresh = ClusterState()
    fresh.replace_nodes([node(n) for n in _NODES])
    for step in steps:
        _step(fresh, step)
    return fresh


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(_STEPS, st.sampled_from([None, 1, 2])), max_size=25))
def test_room_warmed_in_slices_equals_room_computed_afresh(
    steps: list[tuple[tuple[Any, ...], int | None]],
) -> None:
    """warm_room() builds the bins a slice at a time, changes landing between the slices
    (None: room() is read there, finishing any rebuild under way); what is read is never
    stale."""
    kept = ClusterState()
    kept.replace_nodes([node(n) for n in _NODES])
    done: list[tuple[Any, ...]] = []
    for step, warm in steps:
        _step(kept, step)
        done.append(step)
        if warm is None:
            assert _bins(kept) == _bins(_afresh(done))
        else:
            kept.warm_room(warm)
    fresh = _afresh(done)
    while not kept.warm_room(1):
        pass
    assert _bins(kept) == _bins(fresh)
    bins = kept.room()
    assert dict(kept.room_positions()) == {b.name: i for i, b in enumerate(bins)}
    for group in (None, "default/g"):
        assert kept.free_resources(group) == _free_summed_afresh(fresh, group)


def test_a_rebuild_warmed_in_slices_builds_each_bin_once() -> None:
    state = ClusterState()
    state.replace_nodes([node(f"n{i}") for i in range(10)])
    assert not state.warm_room(4) and not state.warm_room(4)
    assert state.warm_room(4)
    first = state.room()
    assert state.warm_room(4)  # nothing changed: nothing to build
    assert state.room() == first and all(a is b for a, b in zip(state.room(), first, strict=True))
