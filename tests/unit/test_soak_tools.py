"""The soak's own tools (tests/soak): the seeded stream, the oracle's rack rule, the relay.

The stream must be the same for the same seed (a failing seed is replayed
exactly) and inject only the faults asked for. A gang required to keep to
one rack needs the fewest evictions of its cheapest rack (of its placed
members' rack once it has some), and is never bound across two. The relay must delay what it
carries by the delay asked for, per direction, keep the bytes in order, and
drop every connection when told to (the soak's watch cut).
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.preemption_oracle import Running, fewest_evictions, fewest_evictions_in_one_domain
from tests.soak.relay import Delay, slow_relay
from tests.soak.stream import HIGH_PRIORITY, Action, Fault, Source, rack_of, steps
from tests.soak.world import Gang, Monitor, Snapshot, World


def test_the_same_seed_gives_the_same_steps_and_another_seed_others() -> None:
    first = list(itertools.islice(steps(7), 200))
    assert first == list(itertools.islice(steps(7), 200))
    assert first != list(itertools.islice(steps(8), 200))
    assert {s.action for s in first} == set(Action)


def a_pod(node: str, deleting: bool = False) -> Any:
    return SimpleNamespace(
        spec=SimpleNamespace(node_name=node),
        metadata=SimpleNamespace(deletion_timestamp="2026-11-29T00:00:00Z" if deleting else None),
        status=SimpleNamespace(nominated_node_name=None),
    )


def test_the_oracle_counts_a_terminating_pods_room_as_taken() -> None:
    """kube-scheduler does until the pod is gone: the oracle must not call such room free
    (the soak's plain pods 'not placed though they fit' while kube-scheduler said
    Insufficient cpu)."""
    world = World(kube=cast(Any, None), namespace="soak")
    world.gangs["old"] = Gang("old", 1, 1, 2000, 0, None, 0.0, "step 1")
    world.gangs["new"] = Gang("new", 1, 1, 2000, 0, None, 0.0, "step 2")
    pods = {"old": a_pod("n1", deleting=True), "new": a_pod("")}
    snap = Snapshot(placed={}, pods=pods, nodes={"n1": 3000})
    assert snap.terminating() == {"old": "n1"}
    assert world.need(world.gangs["new"], snap) is None  # no room while "old" leaves
    gone = Snapshot(placed={}, pods={"new": a_pod("")}, nodes={"n1": 3000})
    assert world.need(world.gangs["new"], gone) == 0


def test_a_member_on_a_cordoned_node_counts_towards_its_gangs_minimum() -> None:
    """Soak seed 4 at 1b1d2c7: gs4-113 (minMember 2) ran 3 members, one on a node cordoned
    since; a preempting gang evicted another of them. The oracle had left the cordoned
    node's pod out, saw gs4-113 at its minimum and called the eviction one for a gang that
    cannot fit. The cordoned node's pod is neither evicted nor its room counted."""
    world = World(kube=cast(Any, None), namespace="soak")
    world.gangs["gs"] = Gang("gs", 3, 2, 1000, 100, Source.XK8S, 0.0, "step 1")
    world.gangs["hi"] = Gang("hi", 1, 1, 1000, HIGH_PRIORITY, Source.XK8S, 0.0, "step 2")
    placed = {"gs-0": "cordoned", "gs-1": "n1", "gs-2": "n2"}
    pods = {name: a_pod(node) for name, node in placed.items()} | {"hi-0": a_pod("")}
    snap = Snapshot(placed=placed, pods=pods, nodes={"n1": 1000, "n2": 1000})
    assert world.need(world.gangs["hi"], snap) == 1
    # With the cordoned one gone, gs is at its minimum: nothing of it may go.
    del placed["gs-0"]
    assert world.need(world.gangs["hi"], snap) is None


def test_only_the_faults_asked_for_are_injected() -> None:
    some = [s.fault for s in itertools.islice(steps(3, [Fault.EXTENDER_KILL]), 400) if s.fault]
    assert some and set(some) == {Fault.EXTENDER_KILL}
    assert not any(s.action is Action.FAULT for s in itertools.islice(steps(3, []), 400))


def test_preempting_gangs_want_every_member_and_rank_above_the_rest() -> None:
    drawn = list(itertools.islice(steps(11), 400))
    high = [s for s in drawn if s.action is Action.PREEMPT_GANG]
    low = [s for s in drawn if s.action is Action.GANG]
    assert high and all(s.min_member == s.members for s in high)
    assert max(s.priority for s in low) < min(s.priority for s in high)


def test_a_delay_needs_low_at_most_high() -> None:
    with pytest.raises(ValueError, match="0 <= low <= high"):
        Delay(0.5, 0.1)


@pytest.fixture
def echo() -> Iterator[int]:
    """A loopback server that sends back what it reads."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def _read(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got


def test_the_relay_delays_each_direction_and_keeps_the_order(echo: int) -> None:
    with (
        slow_relay(echo, down=Delay(0.2, 0.2), up=Delay(0.1, 0.1), max_seconds=30) as relay,
        socket.create_connection(("127.0.0.1", relay.port), timeout=5) as client,
    ):
        start = time.monotonic()
        for i in range(5):
            client.sendall(f"m{i};".encode())
        answer = _read(client, 15)
        took = time.monotonic() - start
    assert answer == b"m0;m1;m2;m3;m4;"
    assert took >= 0.3, f"answered after {took:.3f}s, not delayed by up 0.1s + down 0.2s"
    assert relay.stats.connections == 1
    assert relay.stats.bytes_up == relay.stats.bytes_down == 15


def test_a_cut_drops_every_connection(echo: int) -> None:
    with (
        slow_relay(echo, down=Delay(), up=Delay(), max_seconds=30) as relay,
        socket.create_connection(("127.0.0.1", relay.port), timeout=5) as client,
    ):
        client.sendall(b"x")
        assert _read(client, 1) == b"x"
        relay.cut()
        with pytest.raises(OSError):
            for _ in range(50):
                if not client.recv(1):
                    raise ConnectionResetError("closed")
                time.sleep(0.05)
    assert relay.stats.cut == 2


@pytest.fixture
def resetting() -> Iterator[int]:
    """A loopback server that echoes one chunk, then resets the connection (RST, not FIN),
    as a killed API server does to a connection with a request it had not read."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.sendall(conn.recv(4096))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_a_reset_server_side_breaks_the_client_side_at_once(resetting: int) -> None:
    """Not a half-open client: kube-scheduler left waiting on a dead connection heard
    nothing for 45 s (client-go's HTTP/2 health check) and scheduled on a stale view."""
    with (
        slow_relay(resetting, down=Delay(0.01, 0.01), up=Delay(), max_seconds=30) as relay,
        socket.create_connection(("127.0.0.1", relay.port), timeout=5) as client,
    ):
        client.sendall(b"x")
        assert _read(client, 1) == b"x"
        start = time.monotonic()
        try:
            ended = client.recv(1) == b""
        except TimeoutError:
            pytest.fail("the client's side stayed open 5 s after the server reset its side")
        except ConnectionResetError:
            ended = True
        assert ended
        assert time.monotonic() - start < 2


# ---- topology: gangs required to keep to one rack ----------------------------------------


def test_about_a_gang_in_four_keeps_to_one_rack_drawn_apart_from_the_other_steps() -> None:
    """The rack choice has a Random of its own: the seed's other draws are as they were."""
    drawn = list(itertools.islice(steps(5), 600))
    gangs = [s for s in drawn if s.action in (Action.GANG, Action.PREEMPT_GANG)]
    racked = [s for s in gangs if s.rack]
    assert 0.15 < len(racked) / len(gangs) < 0.35
    assert {s.action for s in racked} == {Action.GANG, Action.PREEMPT_GANG}
    assert not any(s.rack for s in drawn if s.action not in (Action.GANG, Action.PREEMPT_GANG))
    assert "one rack" in racked[0].describe()
    assert drawn == list(itertools.islice(steps(5), 600))  # the rack choice too, per seed


def test_racks_are_of_two_and_three_nodes_in_turn() -> None:
    assert [rack_of(k) for k in range(7)] == [
        "rack-0",
        "rack-0",
        "rack-1",
        "rack-1",
        "rack-1",
        "rack-2",
        "rack-2",
    ]


LOW, HIGH = 0, HIGH_PRIORITY


def low_pods(*nodes: str) -> list[Running]:
    """One low-priority 2000m plain pod on each node named."""
    return [Running(f"p{i}-{node}", node, {"cpu": 2000}, LOW) for i, node in enumerate(nodes)]


def test_the_oracle_picks_the_one_rack_that_holds_the_gang() -> None:
    """Free room on a1 and b1 holds two members across racks; only rack A holds both."""
    alloc = {"a1": {"cpu": 4000}, "b1": {"cpu": 2000}, "b2": {"cpu": 2000}}
    racks = {"a1": "A", "b1": "B", "b2": "B"}
    running = low_pods("b1")
    two = [{"cpu": 2000}] * 2
    assert fewest_evictions_in_one_domain(alloc, running, two, LOW, {}, racks) == 0
    # Pinned to B (a member placed there): B has room for one member only.
    assert fewest_evictions_in_one_domain(alloc, running, two, LOW, {}, racks, "B") is None


def test_the_oracle_takes_the_rack_with_the_fewest_evictions() -> None:
    """Rack A needs 2 evictions, rack B 1, rack C (one node) cannot hold two: 1. Across racks
    the free room of b1 and c1 would need none."""
    alloc = {n: {"cpu": 2000} for n in ("a1", "a2", "b1", "b2", "c1")}
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "c1": "C"}
    running = low_pods("a1", "a2", "b2")
    two = [{"cpu": 2000}] * 2
    assert fewest_evictions(alloc, running, two, HIGH, {}) == 0
    assert fewest_evictions_in_one_domain(alloc, running, two, HIGH, {}, racks) == 1
    assert fewest_evictions_in_one_domain(alloc, running, two, HIGH, {}, racks, "A") == 2
    # A running gang keeps its minimum counted over every rack: b2's pod may not go.
    ganged = [*low_pods("a1", "a2"), Running("g-0", "b2", {"cpu": 2000}, LOW, "g")]
    ganged.append(Running("g-1", "a1", {"cpu": 0}, LOW, "g"))
    assert fewest_evictions_in_one_domain(alloc, ganged, two, HIGH, {"g": 2}, racks) == 2


def test_the_oracle_says_none_when_no_rack_is_big_enough() -> None:
    alloc = {n: {"cpu": 2000} for n in ("a1", "a2", "b1", "b2")}
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    three = [{"cpu": 2000}] * 3
    assert fewest_evictions(alloc, [], three, HIGH, {}) == 0
    assert fewest_evictions_in_one_domain(alloc, low_pods("a1"), three, HIGH, {}, racks) is None


def racked_world() -> tuple[World, Snapshot]:
    """Rack A: a1 (4000m); rack B: b1, b2 (2000m each, b1 taken by a plain pod). Gang g of
    3 x 2000m keeps to one rack; g-0 is bound on b2."""
    world = World(kube=cast(Any, None), namespace="soak")
    world.gangs["g"] = Gang("g", 3, 3, 2000, 0, Source.KUEUE, 0.0, "step 1", rack=True)
    world.gangs["p"] = Gang("p", 1, 1, 2000, 0, None, 0.0, "step 2")
    pods = {"g-0": a_pod("b2"), "g-1": a_pod(""), "g-2": a_pod(""), "p": a_pod("b1")}
    snap = Snapshot(
        placed={"g-0": "b2", "p": "b1"},
        pods=pods,
        nodes={"a1": 4000, "b1": 2000, "b2": 2000},
        racks={"a1": "A", "b1": "B", "b2": "B"},
    )
    return world, snap


def test_a_gang_partly_placed_keeps_to_its_members_rack() -> None:
    """Its two missing members fit a1 (rack A) but not rack B, where g-0 is: it never fits."""
    world, snap = racked_world()
    gang = world.gangs["g"]
    assert world.need(gang, snap) is None
    gang.rack = False
    assert world.need(gang, snap) == 0  # unconstrained, a1 holds both


def test_the_monitor_reports_a_gang_bound_across_two_racks() -> None:
    world, snap = racked_world()
    snap.placed["g-1"] = "a1"
    monitor = Monitor(world, lambda: "step 9")
    monitor.look(snap)
    monitor.look(snap)  # once per gang: it stays split until deleted
    assert len(world.violations) == 1
    assert (
        "g (step 1) required to keep to one rack is bound across racks ['A', 'B']"
        in (world.violations[0])
    )
    assert world.need(world.gangs["g"], snap) is None  # split: no rack is its own


def test_a_soak_delete_is_tried_until_the_object_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete lost to an API server restart would leave a gang the soak thinks deleted
    while the extender rightly keeps it in line: each is tried until gone (or 404)."""
    from kubernetes.client.exceptions import ApiException

    from tests.soak import run

    monkeypatch.setattr("tests.soak.run.time.sleep", lambda _s: None)
    answers: list[Exception | None] = [
        ConnectionRefusedError("connection refused"),
        ApiException(status=503),
        None,
    ]
    calls: list[int] = []

    def delete() -> None:
        calls.append(1)
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    run._until_gone(delete)
    assert len(calls) == 3

    def gone() -> None:
        raise ApiException(status=404)

    run._until_gone(gone)  # already gone: done
    monkeypatch.setattr(run, "DELETE_SECONDS", -1.0)
    with pytest.raises(AssertionError, match="kept failing"):
        run._until_gone(lambda: (_ for _ in ()).throw(ApiException(status=500)))


def test_the_scheduling_reports_outlive_an_api_server_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The soak restarts the API server with etcd compacted: the reports' watch then meets
    a refused connection and 410 Gone. It lists again and keeps reporting (seed 51 once saw
    every Event of the namespace as missing: of() raised, and the soak took that for none)."""
    from kubernetes.client.exceptions import ApiException

    import tests.cluster.kube as kube_module

    def member(message: str, version: str) -> Any:
        condition = SimpleNamespace(type="PodScheduled", status="False", message=message)
        return SimpleNamespace(
            metadata=SimpleNamespace(name="m-0", resource_version=version),
            status=SimpleNamespace(conditions=[condition]),
        )

    listings = iter(
        [
            SimpleNamespace(items=[], metadata=SimpleNamespace(resource_version="1")),
            SimpleNamespace(items=[], metadata=SimpleNamespace(resource_version="5")),
            SimpleNamespace(
                items=[member("lost while away", "7")],
                metadata=SimpleNamespace(resource_version="7"),
            ),
        ]
    )
    core = SimpleNamespace(list_namespaced_pod=lambda namespace, **_: next(listings))
    streams: list[Any] = [
        ConnectionRefusedError("the API server is restarting"),
        ApiException(status=410, reason="Gone"),
        [{"type": "MODIFIED", "object": member("after the restart", "9")}],
    ]
    asked: list[str] = []

    class FakeWatch:
        def stream(self, func: Any, namespace: str, resource_version: str, **_: Any) -> Any:
            asked.append(resource_version)
            step = streams.pop(0) if streams else []
            if isinstance(step, Exception):
                raise step
            time.sleep(0.05)
            return iter(step)

    monkeypatch.setattr("tests.cluster.kube.watch.Watch", FakeWatch)
    reports = kube_module.SchedulingReports(core, "soak")
    try:
        deadline = time.monotonic() + 10
        while len(reports.of("m-0")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reports.of("m-0") == ["lost while away", "after the restart"]
        assert asked[:3] == ["1", "5", "7"]  # each break is followed by a list, not a resume
    finally:
        reports.stop()


def test_evictions_another_gangs_plan_made_in_the_window_are_not_the_steps() -> None:
    """An older gang in line may plan while a preempting step's gang is being checked: the
    extender's Preempted Event names whom each victim was evicted for."""
    from tests.soak import run

    events = {
        "a": [
            "Preempted: evicted by kube-scheduler's preemption so that gang ns/old-1 can be placed"
        ],
        "b": [
            "Preempted: evicted by kube-scheduler's preemption so that gang ns/new-2 can be"
            " placed (this pod was a member of gang ns/g)"
        ],
        "c": ["Preempted: Preempted by pod 1234 on node n1"],
    }
    soak = SimpleNamespace(
        kube=SimpleNamespace(events=lambda _ns, pod: events.get(pod, [])),
        namespace="ns",
        world=SimpleNamespace(deleted_pods={"d"}),
        report=run.Report(seed=1),
    )
    soak._evicted_for = lambda pod: run.Soak._evicted_for(cast(Any, soak), pod)
    gang = cast(Any, SimpleNamespace(name="new-2"))
    before = {p: "n1" for p in ("a", "b", "c", "d", "e")}
    gone = run.Soak._evicted(cast(Any, soak), before, {"e": "n1"}, gang)
    assert gone == {"b", "c"}
    assert soak.report.evicted_by_others == 1


def test_a_preempting_gang_whose_room_was_taken_since_its_step_waits_by_design() -> None:
    """Seed 5's his5-315: the oracle found free room at its step, a gang ahead of it whose
    room was being freed took it a second later, and no eviction can make room now. Not
    placed in time is no violation then (a checkpoint asks again should it fit later);
    while it still fits, it is one."""
    world = World(kube=cast(Any, None), namespace="soak")
    now = time.monotonic()  # neither has aged
    hi = Gang("hi", 2, 2, 1000, HIGH_PRIORITY, Source.XK8S, now, "step 315")
    ahead = Gang("ahead", 1, 1, 2000, HIGH_PRIORITY, Source.XK8S, now - 1, "step 299")
    world.gangs.update(hi=hi, ahead=ahead)
    pods = {"hi-0": a_pod(""), "hi-1": a_pod(""), "ahead-0": a_pod("")}
    free = Snapshot(placed={}, pods=pods, nodes={"n1": 2000})
    assert world.need(hi, free) == 0
    assert world.waits_by_design(hi, free) is None  # it fits: it must be placed

    ahead.placed_at = now + 1
    pods["ahead-0"] = a_pod("n1")
    taken = Snapshot(placed={"ahead-0": "n1"}, pods=pods, nodes={"n1": 2000})
    why = world.waits_by_design(hi, taken)
    assert why is not None
    assert why.startswith("no longer fits")
    assert "placed since: ahead" in why
