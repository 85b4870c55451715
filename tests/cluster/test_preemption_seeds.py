"""Seeded preemption scenarios on the real control plane: never more evictions than needed.

For each seed: 3-6 fresh nodes of 4, 6 or 8 CPUs, filled with low-priority
pods and running gangs (bound directly, so the snapshot is the seed's), then
one or two high-priority gangs that cannot fit without evictions, one after
the other. The real kube-scheduler preempts for their members, calling our
preempt verb. Each time, the number of pods evicted must equal the minimum
an exhaustive search finds on the same snapshot (tests/preemption_oracle.py),
every victim must sit on a node the gang landed on, and no gang may be left
partially placed. The session's own nodes are cordoned meanwhile.

Every gang that can be placed must be placed (issue 49: two seeds stalled,
nothing evicted, on a busy machine). With GANG_EXTENDER_SLOW_API=LOW-HIGH
(milliseconds) kube-scheduler and the extender talk to the API server through
a relay that delays every answer and watch event by that much, and every
request by a fifth of it (tests/soak/relay.py): the slow API server of the
issue. GANG_EXTENDER_BURNERS=N runs N CPU-burning loops beside the module
and GANG_EXTENDER_API_LOAD=N as many threads listing every pod and writing and
deleting ConfigMaps (tests/soak/load.py), the issue's busy machine. When a
gang is not placed, the failure shows what the extender's /debug/gangs held
(plans, line, claims, gate).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.session import Extender
from tests.preemption_oracle import Running, fewest_evictions
from tests.soak.components import APISERVER_PORT, extender_behind, scheduler_behind
from tests.soak.load import api_load, cpu_burners
from tests.soak.relay import Delay, slow_relay

SEEDS = range(20)
HIGH, HIGH_VALUE = "gang-seed-high", 10_000
LOW = {"gang-seed-low-0": 0, "gang-seed-low-10": 10, "gang-seed-low-100": 100}


@dataclass
class Scenario:
    nodes: dict[str, int]  # name -> millicpu
    running: list[Running]
    running_gangs: dict[str, int]  # gang -> minMember
    # Preempting gangs in the order they arrive: (name, members, millicpu each).
    gangs: list[tuple[str, int, int]] = field(default_factory=list)


def _demands(members: int, cpu: int) -> list[dict[str, int]]:
    return [{"cpu": cpu}] * members


def _alloc(nodes: dict[str, int]) -> dict[str, dict[str, int]]:
    return {name: {"cpu": cpu} for name, cpu in nodes.items()}


def scenario(seed: int) -> Scenario:
    """A seed's cluster, redrawn until its first gang needs evictions and can get them."""
    rng = random.Random(seed)
    while True:
        nodes = {
            f"seed{seed}-{i}": rng.choice([4000, 6000, 8000]) for i in range(rng.randint(3, 6))
        }
        running: list[Running] = []
        gangs: dict[str, int] = {}
        for name, cpu in nodes.items():
            used = 0
            while used < cpu - 500:
                size = rng.choice([500, 1000, 1500, 2000, 3000])
                if used + size > cpu:
                    break
                gang = rng.choice([None, None, None, "run-a", "run-b"])
                priority = rng.choice(list(LOW))
                running.append(
                    Running(f"p{len(running)}", name, {"cpu": size}, LOW[priority], gang)
                )
                used += size
        for gang in ("run-a", "run-b"):
            size = sum(1 for p in running if p.gang == gang)
            if size:
                gangs[gang] = max(1, size - rng.randint(0, 2))
        found = Scenario(nodes, running, gangs)
        first = (f"hi{seed}a", rng.randint(2, 4), rng.choice([1000, 2000, 3000]))
        need = fewest_evictions(_alloc(nodes), running, _demands(*first[1:]), HIGH_VALUE, gangs)
        if need:
            found.gangs.append(first)
            if rng.random() < 0.5:
                found.gangs.append((f"hi{seed}b", rng.randint(2, 3), rng.choice([1000, 2000])))
            return found


def low_class(priority: int) -> str:
    return next(name for name, value in LOW.items() if value == priority)


def slow_api_delay() -> Delay | None:
    """GANG_EXTENDER_SLOW_API=LOW-HIGH (ms): the relay's delay for answers and watch events."""
    text = os.environ.get("GANG_EXTENDER_SLOW_API", "").strip()
    if not text:
        return None
    low, _, high = text.partition("-")
    try:
        delay = Delay(int(low) / 1000, int(high or low) / 1000)
    except ValueError as error:
        raise pytest.UsageError(
            f"GANG_EXTENDER_SLOW_API={text!r}: use LOW-HIGH in milliseconds, e.g. 200-500 ({error})"
        ) from None
    return delay


def _count(name: str) -> int:
    text = os.environ.get(name, "0").strip() or "0"
    if not text.isdigit():
        raise pytest.UsageError(f"{name}={text!r}: use a whole number")
    return int(text)


@pytest.fixture(scope="module")
def busy_machine(kube: Kube, extender: Extender) -> Iterator[None]:
    """The busy machine of issue 49, as far as the environment asks for it.

    GANG_EXTENDER_SLOW_API: kube-scheduler and the extender behind a slow
    relay; GANG_EXTENDER_BURNERS, GANG_EXTENDER_API_LOAD: load beside them.
    """
    down = slow_api_delay()
    with contextlib.ExitStack() as stack:
        stack.enter_context(cpu_burners(_count("GANG_EXTENDER_BURNERS"), 3 * 3600))
        if threads := _count("GANG_EXTENDER_API_LOAD"):
            stack.enter_context(api_load(kube, threads))
        if down is not None:
            up = Delay(down.low / 5, down.high / 5)
            relay = stack.enter_context(
                slow_relay(APISERVER_PORT, down=down, up=up, seed=49, max_seconds=3 * 3600)
            )
            stack.enter_context(scheduler_behind(relay.port))
            stack.enter_context(extender_behind(extender, relay.port))
        yield


def gangs_debug(extender: Extender) -> str:
    """What the extender's /debug/gangs shows (plans, line, claims, gate), for a failure message."""
    try:
        with urllib.request.urlopen(f"{extender.url}/debug/gangs", timeout=10) as response:
            return json.dumps(json.loads(response.read()), sort_keys=True)[:6000]
    except OSError as error:
        return f"/debug/gangs unreadable: {error}"


@pytest.fixture
def seed_nodes(kube: Kube) -> Iterator[list[str]]:
    """The session's nodes cordoned; the seed's nodes deleted afterwards."""
    with kube.nodes_of_its_own() as created:
        yield created


def live(kube: Kube, namespace: str) -> dict[str, str]:
    """Pods that are placed and not being deleted: name -> node."""
    return {
        p.metadata.name: p.spec.node_name
        for p in kube.pods(namespace)
        if p.spec.node_name and not p.metadata.deletion_timestamp
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_preemption_evicts_exactly_the_minimum(
    kube: Kube,
    extender: Extender,
    busy_machine: None,
    namespace: str,
    seed_nodes: list[str],
    seed: int,
) -> None:
    kube.ensure_priority_class(HIGH, HIGH_VALUE)
    for name, value in LOW.items():
        kube.ensure_priority_class(name, value)
    world = scenario(seed)
    for name, cpu in world.nodes.items():
        kube.create_node(name, f"{cpu}m")
        seed_nodes.append(name)
    for gang, min_member in world.running_gangs.items():
        kube.create_podgroup(namespace, gang, min_member)
    for pod in world.running:
        body = kube.pod_body(
            pod.name,
            group=pod.gang,
            cpu=f"{pod.requests['cpu']}m",
            priority_class=low_class(pod.priority),
        )
        body["spec"]["nodeName"] = pod.node
        kube.core.create_namespaced_pod(namespace, body)
    wait_for(lambda: len(live(kube, namespace)) == len(world.running), 30, "the seed's pods placed")
    running = list(world.running)
    for gang, members, cpu in world.gangs:
        before = live(kube, namespace)
        still = [p for p in running if p.name in before]
        need = fewest_evictions(
            _alloc(world.nodes), still, _demands(members, cpu), HIGH_VALUE, world.running_gangs
        )
        kube.create_podgroup(namespace, gang, members, timeout=60)
        for i in range(members):
            kube.create_pod(
                namespace, f"{gang}-{i}", group=gang, cpu=f"{cpu}m", priority_class=HIGH
            )
        names = {f"{gang}-{i}" for i in range(members)}
        if need is None:
            # Not even every lower-priority pod makes room: nothing may be evicted.
            time.sleep(8)
            after = live(kube, namespace)
            assert set(before) - set(after) == set(), "evicted for a gang that cannot fit"
            assert not names & set(after)
            continue
        try:
            wait_for(
                lambda names=names: names <= set(live(kube, namespace)),  # type: ignore[misc]
                90,
                f"gang {gang} placed",
            )
        except TimeoutError as error:
            now = set(live(kube, namespace))
            pytest.fail(
                f"seed {seed}: gang {gang} not placed in 90s though it fits after {need} "
                f"eviction(s) ({error}); members placed {sorted(names & now)}, evicted "
                f"{sorted(set(before) - now)}; "
                f"/debug/gangs: {gangs_debug(extender)}"
            )
        time.sleep(1.5)  # a late eviction would show now
        after = live(kube, namespace)
        evicted = set(before) - set(after)
        gang_nodes = {after[n] for n in names}
        report = f"seed {seed}, gang {gang}: evicted {sorted(evicted)}, minimum {need}"
        assert len(evicted) == need, report
        assert {before[v] for v in evicted} <= gang_nodes, f"victim off the gang's nodes; {report}"
        for running_gang, min_member in world.running_gangs.items():
            left = sum(1 for p in still if p.gang == running_gang and p.name in after)
            assert left == 0 or left >= min_member, f"{running_gang} left partial; {report}"
        running = [p for p in still if p.name in after] + [
            Running(n, after[n], {"cpu": cpu}, HIGH_VALUE) for n in sorted(names)
        ]
