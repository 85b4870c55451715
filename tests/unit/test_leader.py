import asyncio
from typing import Any

from app.core.event_aggregation import ObjectRef
from app.runtime.leader import LeaderElection, LeaderOnlyPodWrites, LeaderOnlyRecorder, holds_lease

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def lease(holder: str | None, renewed: str = "2027-01-15T07:59:55.000000Z") -> dict[str, Any]:
    return {
        "metadata": {"name": "gang-extender", "namespace": "gang-extender"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed},
    }


def test_the_holder_is_kube_schedulers_hostname_then_a_uuid() -> None:
    spec = lease("gang-extender-7d9f-abcde_0f6c2b1e-1111-2222-3333-444455556666")["spec"]
    assert holds_lease(spec, "gang-extender-7d9f-abcde", NOW)
    assert not holds_lease(spec, "gang-extender-7d9f-zzzzz", NOW)
    # A pod whose name is a prefix of the leader's is not the leader.
    assert not holds_lease(spec, "gang-extender-7d9f", NOW)


def test_an_expired_or_released_lease_has_no_leader() -> None:
    assert not holds_lease(lease("pod-a_x", "2027-01-15T07:59:00Z")["spec"], "pod-a", NOW)
    assert not holds_lease(lease(None)["spec"], "pod-a", NOW)
    assert not holds_lease(lease("")["spec"], "pod-a", NOW)
    assert not holds_lease(None, "pod-a", NOW)


def test_election_follows_the_watched_lease() -> None:
    election = LeaderElection("pod-a", clock=lambda: NOW)
    assert not election.is_leader()
    election.replace([lease("pod-a_1")])
    assert election.is_leader()
    election.apply(lease("pod-b_2"))
    assert not election.is_leader()
    election.apply(lease("pod-a_3"))
    election.delete(lease("pod-a_3"))
    assert not election.is_leader()


class Recorded:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.calls: list[str] = []

    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append(reason)

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        self.calls.append(f"touch {name}")

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(f"release {name}")

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.calls.append(f"nominate {name}")

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(f"evict {name}")


def test_a_standby_writes_no_event_no_wakeup_no_release_no_nomination_no_eviction() -> None:
    election = LeaderElection("pod-a", clock=lambda: NOW)
    election.replace([lease("pod-b_1")])
    inner = Recorded()
    recorder = LeaderOnlyRecorder(inner, election)
    pods = LeaderOnlyPodWrites(inner, election)
    ref = ObjectRef("Pod", "v1", "ns", "p", "u")

    async def write() -> None:
        recorder.record(ref, "Normal", "GangAdmitted", "m")
        await pods.touch_pod("ns", "p", "u", "now")
        await pods.release_pod("ns", "p", "u")
        await pods.nominate_pod("ns", "p", "u", "n1")
        await pods.evict_pod("ns", "p", "u")

    asyncio.run(write())
    assert inner.events == [] and inner.calls == []
    election.apply(lease("pod-a_1"))
    asyncio.run(write())
    assert inner.events == ["GangAdmitted"] and inner.calls == [
        "touch p",
        "release p",
        "nominate p",
        "evict p",
    ]
