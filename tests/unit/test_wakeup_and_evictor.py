import asyncio

from app.base.metrics import Metrics
from app.core.observer import MemberRef, NullObserver
from app.core.preemption.victims import Preemptor, VictimCandidate, VictimPolicy
from app.core.state import ClusterState
from app.runtime.preemption.evictor import PreemptionFollower
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.wakeup import SiblingWaker
from tests.unit.builders import node, pod, podgroup


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.victims: list[tuple[str, str | None, str]] = []

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        self.victims.append((victim.name, victim_group, by))


class FakeApi:
    """Stands in for the API calls; the cluster tests exercise the real ones."""

    def __init__(self) -> None:
        self.touched: list[str] = []
        self.released: list[str] = []
        self.evicted: list[str] = []
        self.nominated: list[tuple[str, str]] = []

    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        self.touched.append(name)

    async def release_pod(self, namespace: str, name: str, uid: str) -> None:
        self.released.append(name)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.evicted.append(name)

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.nominated.append((name, node))


def gang_state() -> ClusterState:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])
    state.apply_podgroup(podgroup("g", 3))
    return state


async def test_waker_touches_only_pending_members_once_per_cooldown() -> None:
    state = gang_state()
    state.apply_pod(pod("bound", group="g", node="n1"))
    state.apply_pod(pod("reserved", group="g"))
    state.reserve("default/reserved", "n2")
    state.apply_pod(pod("pending", group="g"))
    state.apply_pod(pod("self", group="g"))
    api = FakeApi()
    waker = SiblingWaker(state, api, cooldown_seconds=0.2)
    state.add_pod_listener(waker.on_pod_change)
    for name in ("bound", "reserved", "pending", "self"):
        waker.turned_away("default/g", f"uid-default-{name}")
    waker.wake("default/g", exclude_uid="uid-default-self")
    waker.wake("default/g")  # coalesced with the first
    await asyncio.sleep(0.05)
    await waker.drain()
    assert api.touched == ["pending"]
    waker.turned_away("default/g", "uid-default-pending")  # rejected again after the touch
    waker.wake("default/g")  # within the cooldown: deferred, not dropped
    await asyncio.sleep(0.05)
    assert api.touched == ["pending"]
    await asyncio.sleep(0.25)
    await waker.drain()
    assert sorted(api.touched) == ["pending", "pending", "self"]


async def test_waker_leaves_members_that_were_never_turned_away_alone() -> None:
    """Queued members get their turn anyway: touching them is an API write per pod for nothing."""
    state = gang_state()
    state.apply_pod(pod("queued", group="g"))
    parked = pod("parked", group="g")
    # What kube-scheduler writes when it could not place a pod (also before our restart).
    parked["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    ]
    state.apply_pod(parked)
    state.apply_pod(pod("rejected", group="g"))
    api = FakeApi()
    waker = SiblingWaker(state, api, cooldown_seconds=0.05)
    state.add_pod_listener(waker.on_pod_change)
    waker.turned_away("default/g", "uid-default-rejected")
    waker.wake("default/g")
    await asyncio.sleep(0.01)
    await waker.drain()
    assert sorted(api.touched) == ["parked", "rejected"]


def preempted(name: str, node_name: str) -> dict[str, object]:
    victim = pod(name, group="g", node=node_name)
    victim["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ]
    return victim


def whole_gang_after_preemption() -> tuple[ClusterState, FakeApi, Recorder, PreemptionFollower]:
    """Gang g on n1 (m0, m1) and n2 (m2); kube-scheduler was handed m0 on n1 as a victim
    (the whole-gang policy adds m1 there), the follower listening."""
    state = gang_state()
    for i, n in enumerate(["n1", "n1", "n2"]):
        state.apply_pod(pod(f"m{i}", group="g", node=n))
    api, recorder = FakeApi(), Recorder()
    plans = PreemptionPlans(state, VictimPolicy.WHOLE_GANG, Metrics())
    hi = Preemptor("ns/hi", "uid-hi", 1000, None)
    assert plans.plain(hi, {"cpu": 1000}, [VictimCandidate("n1", ["uid-default-m0"], 0)])
    follower = PreemptionFollower(
        state, api, recorder, VictimPolicy.WHOLE_GANG, plans, scheduler_deletes_within_seconds=0.05
    )
    state.add_pod_listener(follower.on_pod_change)
    return state, api, recorder, follower


async def test_whole_gang_policy_evicts_the_rest_of_a_preempted_gang() -> None:
    state, api, recorder, follower = whole_gang_after_preemption()
    state.apply_pod(pod("waiting", group="g"))
    state.apply_pod(preempted("m0", "n1"))
    state.apply_pod(preempted("m0", "n1"))  # the same mark seen twice acts once
    await follower.drain()
    # m1 was kube-scheduler's victim on n1 too: left for it to delete, and evicted
    # by us only once it did not; never the unplaced member.
    assert api.evicted == ["m2", "m1"]
    assert ("m0", "default/g", "ns/hi") in recorder.victims
    assert {v[0] for v in recorder.victims} == {"m0", "m1", "m2"}


async def test_whole_gang_policy_leaves_kube_schedulers_own_victims_to_it() -> None:
    """Its last victim's deletion must be its own: that is what retries the preemptor."""
    state, api, _recorder, follower = whole_gang_after_preemption()
    state.apply_pod(preempted("m0", "n1"))
    state.delete_pod("default", "m1")  # kube-scheduler's deletion of its other victim
    await follower.drain()
    assert api.evicted == ["m2"]


async def test_protect_policy_only_reports_the_victim() -> None:
    state = gang_state()
    for i in range(4):
        state.apply_pod(pod(f"m{i}", group="g", node="n1"))
    api, recorder = FakeApi(), Recorder()
    plans = PreemptionPlans(state, VictimPolicy.PROTECT, Metrics())
    follower = PreemptionFollower(state, api, recorder, VictimPolicy.PROTECT, plans)
    state.add_pod_listener(follower.on_pod_change)
    state.apply_pod(preempted("m3", "n1"))
    await asyncio.sleep(0)
    assert api.evicted == []
    assert recorder.victims == [("m3", "default/g", "a higher-priority pod")]


async def test_a_new_member_that_completes_the_group_wakes_its_siblings() -> None:
    state = gang_state()  # PodGroup g: minMember 3
    api = FakeApi()
    waker = SiblingWaker(state, api, cooldown_seconds=0.05)
    state.add_pod_listener(waker.on_pod_change)
    state.apply_pod(pod("a", group="g"))
    state.apply_pod(pod("b", group="g"))
    for name in ("a", "b"):  # our filter said "too few siblings"
        waker.turned_away("default/g", f"uid-default-{name}")
    await asyncio.sleep(0.01)
    assert api.touched == []  # 2 of 3: nothing to wake yet
    state.apply_pod(pod("c", group="g"))
    await asyncio.sleep(0.01)
    await waker.drain()
    assert sorted(api.touched) == ["a", "b"]  # not the newcomer: it is queued anyway


async def test_members_turned_away_before_their_podgroup_was_seen_are_woken() -> None:
    """After an API server restart our PodGroup watch may relist after kube-scheduler
    filtered the members ("not found"): the PodGroup's arrival must retry them."""
    state = ClusterState()
    api = FakeApi()
    waker = SiblingWaker(state, api, cooldown_seconds=0)
    state.add_pod_listener(waker.on_pod_change)
    state.apply_pod(pod("a", group="late"))
    state.apply_pod(pod("b", group="late", node="n1"))
    waker.turned_away("default/late", "uid-default-a")  # our filter: "PodGroup not found"
    waker.podgroups_appeared(["default/late", "default/empty"])
    await asyncio.sleep(0.01)
    await waker.drain()
    assert api.touched == ["a"]
