"""The extender's own preemption writes its members' nominations before it evicts
(app/runtime/preemption/unasked.py, Nominations.sent): kube-scheduler's one watch of pods
brings both in the order written, so it keeps the room before the room frees. Evicted
first, a pod kube-scheduler tried in between took the room (issue 49's soak, seed 5:
"preemption plan cancelled: pods placed on ns5-212 since took the room planned there")."""

from __future__ import annotations

import asyncio
from typing import Any

from app.base.metrics import Metrics
from app.core.admission import Admission
from app.core.observer import NullObserver
from app.core.preemption.victims import VictimPolicy
from app.core.state import ClusterState
from app.runtime.preemption import unasked as unasked_preemption
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.preemption.unasked import UnaskedPreemption
from tests.unit.builders import node, pod, podgroup
from tests.unit.test_unasked_preemption import STALLED


class Writes:
    """The API server's side: each write answered after a slow API server's delay, every
    nomination and eviction logged in the order it was answered."""

    def __init__(self) -> None:
        self.log: list[str] = []

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        await asyncio.sleep(0.05)
        self.log.append(f"nominate {name} {node}")

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.log.append(f"evict {name}")


def stalled_gang() -> tuple[ClusterState, UnaskedPreemption, PreemptionPlans, Writes]:
    """3 nodes of 4 CPUs, a 1500m pod on each; the gang `whole` (5 x 2 CPUs) needs two of
    them gone. The extender's own preemption wired as the server wires it."""
    state = ClusterState()
    for i in range(3):
        state.apply_node(node(f"n{i}"))
        state.apply_pod(pod(f"low-{i}", cpu="1500m", node=f"n{i}", phase="Running"))
    state.apply_podgroup(podgroup("whole", 5))
    plans = PreemptionPlans(state, VictimPolicy.PROTECT, Metrics())
    writes = Writes()
    preemption = UnaskedPreemption(
        state, Admission(3), plans, writes, NullObserver(), VictimPolicy.PROTECT
    )
    preemption.nominations = plans.nominate_through(writes)
    return state, preemption, plans, writes


async def arrive(state: ClusterState, preemption: UnaskedPreemption) -> None:
    """The gang's members, as kube-scheduler reports them after its dry run found nothing."""
    state.add_pod_listener(preemption.on_pod_change)
    for i in range(5):
        raw = pod(f"whole-{i}", group="whole", cpu="2")
        raw["spec"]["priority"] = 1000
        raw["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "message": STALLED}
        ]
        state.apply_pod(raw)
    await preemption.drain()


def test_the_members_are_nominated_before_any_victim_is_evicted(monkeypatch: Any) -> None:
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, _, writes = stalled_gang()
    asyncio.run(arrive(state, preemption))
    evictions = [i for i, w in enumerate(writes.log) if w.startswith("evict")]
    nominations = [i for i, w in enumerate(writes.log) if w.startswith("nominate whole")]
    assert len(evictions) == 2, writes.log
    assert nominations and max(nominations) < min(evictions), writes.log


def test_nothing_is_evicted_before_the_pods_are_listed(monkeypatch: Any) -> None:
    """Just started: which running pods belong to gangs is not known yet, so the extender's
    own preemption names no victim (PreemptionPlans.listed; issue 49's soak, seed 4)."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, plans, writes = stalled_gang()
    plans.listed = lambda: False
    asyncio.run(arrive(state, preemption))
    assert writes.log == []


def test_nothing_is_evicted_when_the_room_is_taken_while_the_nominations_are_written(
    monkeypatch: Any,
) -> None:
    """A slow API server: pods kube-scheduler placed took the planned room before the
    nominations were written. The plan is cancelled, and its victims stay: evicted, they
    would free room for no one (soak seed 1, where this went round three times)."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, plans, writes = stalled_gang()
    state.add_pod_listener(plans.on_pod_change)  # the plans hear of pods landing first

    async def nominate_pod(namespace: str, name: str, uid: str, node: str) -> None:
        await asyncio.sleep(0.05)
        for i in range(3):  # kube-scheduler placed pods on every node meanwhile
            if f"default/intruder-{i}" not in state.pods:
                state.apply_pod(pod(f"intruder-{i}", cpu="2", node=f"n{i}", phase="Running"))
        writes.log.append(f"nominate {name} {node}")

    writes.nominate_pod = nominate_pod  # type: ignore[method-assign]
    asyncio.run(arrive(state, preemption))
    assert not [w for w in writes.log if w.startswith("evict")], writes.log
    assert plans.snapshot() == []
