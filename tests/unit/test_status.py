import asyncio
from typing import Any

from app.base.metrics import Metrics
from app.core.groups import (
    SOURCE_NATIVE,
    SOURCE_VOLCANO,
    SOURCE_XK8S,
    VOLCANO_API,
    VOLCANO_GROUP_ANNOTATIONS,
)
from app.core.observer import MemberRef
from app.core.records import PodRecord, pod_record_from
from app.core.state import ClusterState
from app.core.status import (
    FAILED,
    FINISHED,
    PENDING,
    PHASES,
    PRE_SCHEDULING,
    RUNNING,
    SCHEDULING,
    UNKNOWN,
    GroupStatus,
    StatusShape,
    VolcanoShape,
    XK8sShape,
    compute_status,
    status_patch,
)
from app.kube.errors import Conflict
from app.ops.status_reconciler import PodGroupStatus, StatusSettings
from app.ops.status_write import CONFLICT, GONE, KEPT, UNCHANGED, WRITTEN, write_status
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock
from tests.unit.test_composite_trees import composite as tree_root
from tests.unit.test_composite_trees import leaf as tree_leaf
from tests.unit.test_composite_trees import member as tree_member

# ---- compute_status: the phase as a pure function --------------------------------------


def member(
    name: str, *, node: str = "", phase: str = "Pending", deleting: bool = False
) -> PodRecord:
    return pod_record_from(pod(name, group="g", node=node, phase=phase, deleting=deleting))


def test_no_pods_is_pending() -> None:
    assert compute_status(3, [], waiting_in_gate=False) == GroupStatus(PENDING)


def test_fewer_members_than_min_member_is_pending() -> None:
    pods = [member("a"), member("b")]
    assert compute_status(3, pods, waiting_in_gate=False).phase == PENDING


def test_a_member_waiting_in_the_gate_is_scheduling() -> None:
    pods = [member("a"), member("b"), member("c")]
    assert compute_status(3, pods, waiting_in_gate=True).phase == PRE_SCHEDULING


def test_min_member_bound_is_scheduled_even_while_others_wait() -> None:
    pods = [member("a", node="n1"), member("b", node="n2"), member("c")]
    status = compute_status(2, pods, waiting_in_gate=True)
    assert status == GroupStatus(SCHEDULING, scheduled=2)


def test_bound_below_min_member_with_none_waiting_is_unknown() -> None:
    # scheduler-plugins' Unknown: part of minMember placed, the rest cannot be (members lost).
    pods = [member("a", node="n1"), member("b")]
    assert compute_status(2, pods, waiting_in_gate=False).phase == UNKNOWN


def test_min_member_running_is_running() -> None:
    pods = [member(n, node="n1", phase="Running") for n in "abc"] + [member("d", node="n2")]
    assert compute_status(3, pods, waiting_in_gate=False) == GroupStatus(
        RUNNING, scheduled=4, running=3
    )


def test_some_running_below_min_member_stays_scheduled() -> None:
    pods = [member("a", node="n1", phase="Running"), member("b", node="n1")]
    assert compute_status(2, pods, waiting_in_gate=False).phase == SCHEDULING


def test_running_and_succeeded_together_are_running() -> None:
    pods = [
        member("a", node="n1", phase="Running"),
        member("b", node="n1", phase="Succeeded"),
    ]
    assert compute_status(2, pods, waiting_in_gate=False) == GroupStatus(
        RUNNING, scheduled=2, running=1, succeeded=1
    )


def test_min_member_succeeded_is_finished() -> None:
    pods = [member(n, node="n1", phase="Succeeded") for n in "abc"]
    assert compute_status(3, pods, waiting_in_gate=False) == GroupStatus(
        FINISHED, scheduled=3, succeeded=3
    )


def test_finished_wins_over_a_failed_extra_member() -> None:
    pods = [member(n, node="n1", phase="Succeeded") for n in "ab"]
    pods.append(member("c", node="n1", phase="Failed"))
    assert compute_status(2, pods, waiting_in_gate=False).phase == FINISHED


def test_a_failure_that_leaves_too_few_able_to_run_is_failed() -> None:
    pods = [
        member("a", node="n1", phase="Running"),
        member("b", node="n1", phase="Running"),
        member("c", node="n2", phase="Failed"),
    ]
    assert compute_status(3, pods, waiting_in_gate=False) == GroupStatus(
        FAILED, scheduled=3, running=2, failed=1
    )


def test_a_failure_with_enough_members_left_is_not_failed() -> None:
    pods = [member(n, node="n1", phase="Running") for n in "abc"]
    pods.append(member("d", node="n2", phase="Failed"))
    assert compute_status(3, pods, waiting_in_gate=False).phase == RUNNING


def test_a_failure_counts_succeeded_members_as_done_not_lost() -> None:
    pods = [
        member("a", node="n1", phase="Succeeded"),
        member("b", node="n1", phase="Running"),
        member("c", node="n1", phase="Failed"),
    ]
    # a finished, b may still finish: 2 of minMember 2 can still make it.
    assert compute_status(2, pods, waiting_in_gate=False).phase == RUNNING
    # With minMember 3 the failure is fatal.
    assert compute_status(3, pods, waiting_in_gate=False).phase == FAILED


def test_pods_being_deleted_count_as_neither_scheduled_nor_running() -> None:
    pods = [
        member("a", node="n1", phase="Running"),
        member("b", node="n1", phase="Running", deleting=True),
    ]
    assert compute_status(2, pods, waiting_in_gate=False) == GroupStatus(
        UNKNOWN, scheduled=1, running=1
    )


# ---- status_patch / write_status ---------------------------------------------------------


def podgroup_object(status: dict[str, Any] | None = None, rv: str = "7") -> dict[str, Any]:
    obj = podgroup("g", 3)
    obj["metadata"]["resourceVersion"] = rv
    if status is not None:
        obj["status"] = status
    return obj


NOW = "2026-01-01T00:00:09Z"


def shown(status: GroupStatus, shape: StatusShape | None = None) -> dict[str, Any]:
    """What the object shows once `status` was written (an empty status before)."""
    return (shape or XK8sShape()).render(status, {}, "2026-01-01T00:00:00Z")


def test_patch_writes_the_upstream_fields_and_the_scheduled_condition() -> None:
    # `scheduled` came from gang-extender < 0.2: upstream dropped it, so it is removed.
    current = podgroup_object({"phase": PENDING, "scheduled": 0, "occupiedBy": "ns/job"})
    patch = status_patch(current, GroupStatus(SCHEDULING, scheduled=3), now=NOW)
    assert patch == {
        "metadata": {"uid": "pg-g", "resourceVersion": "7"},
        "status": {
            "phase": SCHEDULING,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "scheduled": None,
            "conditions": [
                {
                    "type": "Scheduled",
                    "status": "True",
                    "reason": "MinMemberBound",
                    "message": "3 member(s) bound, 0 running, 0 succeeded, 0 failed "
                    "(gang-extender)",
                    "lastTransitionTime": NOW,
                }
            ],
        },
    }


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    current = podgroup_object(shown(GroupStatus(SCHEDULING, scheduled=3)))
    patch = status_patch(current, GroupStatus(RUNNING, scheduled=3, running=3), now=NOW)
    assert patch is not None
    (condition,) = patch["status"]["conditions"]
    assert condition["status"] == "True" and condition["reason"] == "MinMemberRunning"
    assert condition["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_patch_is_none_when_the_object_already_shows_the_status() -> None:
    wanted = GroupStatus(RUNNING, 3, 3, 0, 0, "2026-01-01T00:00:00Z")
    current = podgroup_object(shown(wanted))
    assert status_patch(current, wanted, now=NOW) is None


def test_patch_keeps_an_existing_schedule_start_time() -> None:
    current = podgroup_object({**shown(GroupStatus(PENDING)), "scheduleStartTime": "earlier"})
    assert status_patch(current, GroupStatus(PENDING, schedule_start_time="later"), now=NOW) is None


def test_volcano_status_uses_volcanos_phases_and_conditions() -> None:
    volcano = VolcanoShape()
    pending = volcano.render(GroupStatus(PENDING), {}, NOW)
    assert pending["phase"] == "Pending"
    assert [(c["type"], c["status"]) for c in pending["conditions"]] == [("Unschedulable", "True")]
    running = volcano.render(GroupStatus(RUNNING, 2, 2), pending, NOW)
    assert (running["phase"], running["running"]) == ("Running", 2)
    (condition,) = running["conditions"]
    assert condition["type"] == "Scheduled" and condition["transitionID"]
    assert condition["transitionID"] != pending["conditions"][0]["transitionID"]
    # Unchanged condition: same transition, so no write.
    obj = {"metadata": {"uid": "u", "resourceVersion": "1"}, "status": running}
    assert status_patch(obj, GroupStatus(RUNNING, 2, 2), volcano, now=NOW) is None
    assert volcano.render(GroupStatus(FINISHED, 2, 0, 2), running, NOW)["phase"] == "Completed"
    assert volcano.read({"status": {"phase": "Completed", "succeeded": 2}}).phase == FINISHED


class MemoryStatusApi:
    """An in-memory PodGroup store standing in for the status subresource.

    The cluster tests write through the real API server; this one makes
    conflicts and call counts observable.
    """

    def __init__(self, obj: dict[str, Any] | None) -> None:
        self.obj = obj
        self.reads = 0
        self.patches: list[dict[str, Any]] = []
        self.conflicts = 0

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return (
            None if self.obj is None else {**self.obj, "status": dict(self.obj.get("status") or {})}
        )

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        assert self.obj is not None
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict(name)
        assert body["metadata"]["resourceVersion"] == self.obj["metadata"]["resourceVersion"]
        self.patches.append(body)
        self.obj["status"] = {**(self.obj.get("status") or {}), **body["status"]}
        self.obj["metadata"]["resourceVersion"] = str(
            int(self.obj["metadata"]["resourceVersion"]) + 1
        )


async def test_write_status_rereads_and_retries_on_conflict() -> None:
    api = MemoryStatusApi(podgroup_object())
    api.conflicts = 1
    assert await write_status(api, "default", "g", "pg-g", GroupStatus(PRE_SCHEDULING)) == (
        WRITTEN,
        GroupStatus(PRE_SCHEDULING),
    )
    assert api.reads == 2 and len(api.patches) == 1
    assert api.obj is not None and api.obj["status"]["phase"] == PRE_SCHEDULING


async def test_write_status_gives_up_after_repeated_conflicts() -> None:
    api = MemoryStatusApi(podgroup_object())
    api.conflicts = 5
    assert await write_status(api, "default", "g", "pg-g", GroupStatus(PRE_SCHEDULING)) == (
        CONFLICT,
        None,
    )


async def test_write_status_skips_deleted_or_recreated_objects_and_equal_status() -> None:
    pending = GroupStatus(PENDING)
    assert await write_status(MemoryStatusApi(None), "default", "g", "pg-g", pending) == (
        GONE,
        None,
    )
    recreated = MemoryStatusApi(podgroup_object())
    assert await write_status(recreated, "default", "g", "other-uid", pending) == (GONE, None)
    api = MemoryStatusApi(podgroup_object(shown(pending)))
    assert await write_status(api, "default", "g", "pg-g", pending) == (UNCHANGED, pending)
    assert api.patches == []


async def test_write_status_keeps_a_finished_outcome_when_no_member_is_left() -> None:
    # The object shows no bound count (upstream has none): 0 scheduled.
    finished = GroupStatus(FINISHED, 0, 0, 3, 0, "2026-01-01T00:00:00Z")
    api = MemoryStatusApi(podgroup_object(shown(finished)))
    result = await write_status(
        api, "default", "g", "pg-g", GroupStatus(PENDING), keep_terminal=True
    )
    assert result == (KEPT, finished)
    assert api.patches == []
    # With members that could run (a new round), the object follows them.
    assert (await write_status(api, "default", "g", "pg-g", GroupStatus(PENDING)))[0] == WRITTEN


def test_a_terminal_phase_is_kept_until_new_members_arrive() -> None:
    finished = GroupStatus(FINISHED, 3, 0, 3, 0)
    assert compute_status(3, [], waiting_in_gate=False, previous=finished) == finished
    gone = [member("a", node="n1", phase="Succeeded", deleting=True)]
    assert compute_status(3, gone, waiting_in_gate=False, previous=finished) == finished
    failed = GroupStatus(FAILED, 2, 0, 0, 2)
    assert compute_status(2, [], waiting_in_gate=False, previous=failed) == failed
    new_round = [member("x")]
    assert compute_status(3, new_round, waiting_in_gate=False, previous=finished).phase == PENDING
    running = GroupStatus(RUNNING, 3, 3)
    assert compute_status(3, [], waiting_in_gate=False, previous=running).phase == PENDING


# ---- PodGroupStatus: batching and the metric ----------------------------------------------


def setup(
    min_member: int = 3,
) -> tuple[ClusterState, MemoryStatusApi, PodGroupStatus, Clock, Metrics]:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2")])
    state.apply_podgroup(podgroup("g", min_member))
    api = MemoryStatusApi(podgroup_object())
    clock = Clock()
    metrics = Metrics()
    writer = PodGroupStatus(
        state,
        {SOURCE_XK8S: api},
        metrics,
        clock=clock,
        settings=StatusSettings(min_interval_seconds=1.0),
    )
    state.add_pod_listener(writer.on_pod_change)
    return state, api, writer, clock, metrics


async def settle(writer: PodGroupStatus) -> None:
    """Run one reconcile and wait for the writes it started."""
    writer.reconcile()
    await writer.stop()
    await asyncio.sleep(0)


def phase_gauge(metrics: Metrics, phase: str) -> float:
    return metrics.registry.get_sample_value("gang_extender_podgroups", {"phase": phase}) or 0.0


async def test_a_new_podgroup_gets_pending_written_once() -> None:
    _, api, writer, clock, metrics = setup()
    await settle(writer)
    assert api.obj is not None and api.obj["status"]["phase"] == PENDING
    assert len(api.patches) == 1
    clock.now += 60  # resync: nothing changed, nothing written
    await settle(writer)
    assert len(api.patches) == 1
    assert phase_gauge(metrics, PENDING) == 1
    assert {p: phase_gauge(metrics, p) for p in PHASES if p != PENDING} == dict.fromkeys(
        set(PHASES) - {PENDING}, 0.0
    )


async def test_a_burst_of_pod_changes_costs_one_write_per_interval() -> None:
    state, api, writer, clock, _ = setup(min_member=100)
    await settle(writer)
    for i in range(100):
        state.apply_pod(pod(f"p{i}", group="g", node="n1", phase="Running"))
        clock.now += 0.005
        writer.reconcile()  # a tick between pod events: still within the interval
    clock.now += 0.6
    await settle(writer)
    assert len(api.patches) == 2
    assert api.obj is not None and api.obj["status"]["running"] == 100
    assert api.obj["status"]["phase"] == RUNNING


async def test_a_change_within_the_interval_waits_for_it() -> None:
    state, api, writer, clock, _ = setup(min_member=1)
    await settle(writer)
    state.apply_pod(pod("a", group="g", node="n1", phase="Running"))
    clock.now += 0.5
    await settle(writer)
    assert [p["status"]["phase"] for p in api.patches] == [PENDING]
    clock.now += 0.6
    await settle(writer)
    assert [p["status"]["phase"] for p in api.patches] == [PENDING, RUNNING]


async def test_waiting_in_the_gate_sets_scheduling_and_the_start_time() -> None:
    state, api, writer, _, _ = setup()
    for name in "abc":
        state.apply_pod(pod(name, group="g"))
    state.reserve("default/a", "n1")
    writer.member_waiting(MemberRef("default", "a", "uid-default-a", "n1"), "default/g", 1, 3)
    await settle(writer)
    assert api.obj is not None
    assert api.obj["status"]["phase"] == PRE_SCHEDULING
    assert api.obj["status"]["scheduleStartTime"] == "1970-01-01T00:16:40Z"
    assert writer.groups["default/g"].status.phase == PRE_SCHEDULING


async def test_label_only_groups_are_kept_in_memory_only() -> None:
    state, api, writer, _, metrics = setup()
    state.apply_pod(pod("x", light=("light", "2"), node="n1", phase="Running"))
    state.apply_pod(pod("y", light=("light", "2"), node="n2", phase="Running"))
    await settle(writer)
    view = writer.groups["default/light"]
    assert (view.source, view.min_member, view.status.phase) == ("labels", 2, RUNNING)
    assert all(p["metadata"]["uid"] == "pg-g" for p in api.patches)
    assert phase_gauge(metrics, RUNNING) == 1 and phase_gauge(metrics, PENDING) == 1


async def test_a_deleted_podgroup_is_forgotten() -> None:
    state, _, writer, clock, metrics = setup()
    await settle(writer)
    state.delete_podgroup("default", "g")
    clock.now += 60
    await settle(writer)
    assert writer.groups == {}
    assert phase_gauge(metrics, PENDING) == 0


async def test_a_failed_write_is_retried() -> None:
    _, api, writer, clock, metrics = setup()
    api.conflicts = 3
    await settle(writer)
    assert api.patches == []
    assert (
        metrics.registry.get_sample_value(
            "gang_extender_podgroup_status_writes_total", {"result": "conflict"}
        )
        == 1
    )
    clock.now += 1.1
    await settle(writer)
    assert len(api.patches) == 1


async def test_cleaning_up_a_finished_gang_keeps_it_finished() -> None:
    state, api, writer, clock, _ = setup(min_member=2)
    for name in "ab":
        state.apply_pod(pod(name, group="g", node="n1", phase="Succeeded"))
    await settle(writer)
    assert api.obj is not None and api.obj["status"]["phase"] == FINISHED
    for name in "ab":
        state.delete_pod("default", name)
    clock.now += 2
    await settle(writer)
    assert api.obj["status"]["phase"] == FINISHED and len(api.patches) == 1
    assert writer.groups["default/g"].status.phase == FINISHED


async def test_a_restarted_writer_learns_the_outcome_from_the_object() -> None:
    _, api, writer, clock, metrics = setup()
    finished = GroupStatus(FINISHED, 0, 0, 3, 0, "2026-01-01T00:00:00Z")
    api.obj = podgroup_object(shown(finished))
    await settle(writer)
    assert api.patches == []
    assert writer.groups["default/g"].status == finished
    clock.now += 60
    await settle(writer)
    assert api.patches == [] and api.reads == 1
    assert phase_gauge(metrics, FINISHED) == 1


async def test_a_standby_writes_nothing_until_it_leads() -> None:
    state = ClusterState()
    state.apply_podgroup(podgroup("g", 2))
    api = MemoryStatusApi(podgroup_object())
    leading = False
    clock = Clock()
    writer = PodGroupStatus(
        state, {SOURCE_XK8S: api}, Metrics(), clock=clock, is_leader=lambda: leading
    )
    state.add_pod_listener(writer.on_pod_change)
    for name in "ab":
        state.apply_pod(pod(name, group="g", node="n1", phase="Running"))
    await settle(writer)
    clock.now += 30
    await settle(writer)
    assert api.patches == [] and api.reads == 0
    assert writer.groups["default/g"].status.phase == RUNNING  # still known, for /debug
    leading = True
    await settle(writer)
    assert api.obj is not None and api.obj["status"]["phase"] == RUNNING


async def test_volcano_groups_are_written_in_volcanos_shape_native_not_at_all() -> None:
    state = ClusterState()
    volcano = {
        "apiVersion": VOLCANO_API.api_version,
        "kind": VOLCANO_API.kind,
        "metadata": {"name": "v", "namespace": "default", "uid": "pg-v", "resourceVersion": "3"},
        "spec": {"minMember": 2, "queue": "research"},
    }
    native = {
        "metadata": {"name": "n", "namespace": "default", "uid": "pg-n"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    state.apply_podgroup(volcano, SOURCE_VOLCANO)
    state.apply_podgroup(native, SOURCE_NATIVE)
    volcano_api = MemoryStatusApi(volcano)
    native_api = MemoryStatusApi(native)
    writer = PodGroupStatus(
        state,
        {SOURCE_XK8S: MemoryStatusApi(None), SOURCE_VOLCANO: volcano_api},
        Metrics(),
        clock=Clock(),
    )
    state.add_pod_listener(writer.on_pod_change)
    for name in "ab":
        annotations = {VOLCANO_GROUP_ANNOTATIONS[0]: "v"}
        raw = pod(f"v-{name}", node="n1", phase="Running")
        raw["metadata"]["annotations"] = annotations
        state.apply_pod(raw)
        raw = pod(f"n-{name}", node="n1", phase="Running")
        raw["spec"]["schedulingGroup"] = {"podGroupName": "n"}
        state.apply_pod(raw)
    await settle(writer)
    assert volcano_api.obj is not None
    shown = volcano_api.obj["status"]
    assert (shown["phase"], shown["running"]) == ("Running", 2)
    assert shown["conditions"][0]["type"] == "Scheduled"
    assert native_api.patches == [] and native_api.reads == 0
    assert writer.groups["native:default/n"].status.phase == RUNNING
    assert writer.groups["volcano:default/v"].queue == "research"  # shown in /debug/gangs


def test_x_k8s_status_fits_the_upstream_crd() -> None:
    """With scheduler-plugins' CRD installed instead of ours, nothing we write but the
    condition is pruned: every other field is one upstream declares."""
    upstream = {"phase", "occupiedBy", "running", "succeeded", "failed", "scheduleStartTime"}
    for phase in PHASES:
        fields = XK8sShape().render(GroupStatus(phase, 3, 2, 1, 0, "t"), {"scheduled": 1}, NOW)
        written = {k for k, v in fields.items() if v is not None}
        assert written - {"conditions"} <= upstream


async def test_a_composite_pod_group_trees_gang_writes_no_podgroup_status() -> None:
    """The tree's gang is keyed by its root, a CompositePodGroup: its status is not ours to
    write, and never goes to a PodGroup that bears the root's name."""
    state = ClusterState()
    state.trees.watched = True
    for i in range(3):
        state.apply_pod(tree_member(f"a{i}", "job-a"))
    state.apply_podgroup(tree_leaf("job-a"), SOURCE_NATIVE)
    state.apply_podgroup(tree_leaf("job-b"), SOURCE_NATIVE)
    state.trees.apply(tree_root("job"))
    assert [key for key, r in state.podgroups.items() if r.composite] == ["composite:ml/job"]
    api = MemoryStatusApi(podgroup_object())
    writer = PodGroupStatus(state, {SOURCE_NATIVE: api}, Metrics(), clock=Clock())
    await settle(writer)
    assert api.patches == [] and api.reads == 0
    assert "composite:ml/job" in writer.groups  # shown in /debug/gangs all the same
