"""The soak's own tools (tests/soak): the seeded stream and the slow relay.

The stream must be the same for the same seed (a failing seed is replayed
exactly) and inject only the faults asked for. The relay must delay what it
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

from tests.soak.relay import Delay, slow_relay
from tests.soak.stream import Action, Fault, steps
from tests.soak.world import Gang, Snapshot, World


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
