"""Gang lifecycle as users and operators see it, against the real control plane.

PodGroup status is read from the API server, Events with the Events API,
metrics from /metrics through the Prometheus text parser and the gate from
/debug/gangs. The local cluster's pod simulator plays the kubelet: bound
pods go Running, and pods annotated local-cluster.dev/exit-after-seconds
finish on their own, so the whole lifecycle runs without a node.
"""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from typing import Any

from local_cluster.podsim import EXIT_AFTER_ANNOTATION, EXIT_PHASE_ANNOTATION

from app.core.groups import LIGHT_MIN_AVAILABLE_LABEL, LIGHT_NAME_LABEL, XK8S_API
from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.session import DENIED_SECONDS, PERMIT_WAIT_SECONDS, Extender

# ---- helpers ---------------------------------------------------------------------------


def create_pod(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    annotations: dict[str, str] | None = None,
    grace_seconds: int | None = None,
    **kwargs: Any,
) -> None:
    body = kube.pod_body(name, **kwargs)
    if annotations:
        body["metadata"]["annotations"] = annotations
    if grace_seconds is not None:
        body["spec"]["terminationGracePeriodSeconds"] = grace_seconds
    kube.core.create_namespaced_pod(namespace, body)


def podgroup_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj = kube.group_object(XK8S_API, namespace, name)
    status: dict[str, Any] = obj.get("status") or {}
    return status


def events(kube: Kube, namespace: str, kind: str, name: str) -> list[Any]:
    """Events the extender wrote about one object."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    items = kube.core.list_namespaced_event(namespace, field_selector=selector).items
    return [e for e in items if e.source and e.source.component == "gang-extender"]


def reasons(kube: Kube, namespace: str, kind: str, name: str) -> set[str]:
    return {e.reason for e in events(kube, namespace, kind, name)}


def debug_gangs(extender: Extender) -> dict[str, Any]:
    with urllib.request.urlopen(f"{extender.url}/debug/gangs", timeout=5) as response:
        assert response.headers["Content-Type"] == "application/json"
        doc: dict[str, Any] = json.loads(response.read())
        return doc


class PhaseRecorder:
    """Polls a PodGroup's status and remembers every distinct phase, in order."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.phases: list[str] = []
        self.last: dict[str, Any] = {}

    def poll(self) -> dict[str, Any]:
        self.last = podgroup_status(self.kube, self.namespace, self.name)
        phase = self.last.get("phase")
        if phase and (not self.phases or self.phases[-1] != phase):
            self.phases.append(phase)
        return self.last

    def until(self, phase: str, timeout: float) -> dict[str, Any]:
        return wait_for(  # type: ignore[no-any-return]
            lambda: self.poll().get("phase") == phase and self.last,
            timeout,
            f"PodGroup {self.name} phase {phase} (seen {self.phases})",
            interval=0.1,
        )


# ---- the pod simulator ----------------------------------------------------------------------


def test_pod_simulator_runs_finishes_and_deletes_pods_like_a_kubelet(
    kube: Kube, namespace: str
) -> None:
    create_pod(kube, namespace, "runs", grace_seconds=30)
    create_pod(
        kube,
        namespace,
        "fails",
        annotations={EXIT_AFTER_ANNOTATION: "1", EXIT_PHASE_ANNOTATION: "Failed"},
    )

    def running(name: str) -> Any:
        pod = kube.core.read_namespaced_pod(name, namespace)
        return pod.status.phase == "Running" and pod

    pod = wait_for(lambda: running("runs"), 30, "the pod Running")
    conditions = {c.type: c.status for c in pod.status.conditions}
    assert {conditions.get(t) for t in ("Ready", "ContainersReady", "Initialized")} == {"True"}
    assert conditions.get("PodScheduled") == "True"
    assert pod.status.pod_ip.startswith("10.") and pod.status.host_ip.startswith("10.")
    assert pod.status.container_statuses[0].ready and pod.status.start_time

    failed = wait_for(
        lambda: (
            (p := kube.core.read_namespaced_pod("fails", namespace)).status.phase == "Failed" and p
        ),
        30,
        "the annotated pod Failed",
    )
    assert failed.status.container_statuses[0].state.terminated.exit_code == 1

    # A graceful delete (30s) completes at once: the simulator confirms it like a kubelet.
    kube.core.delete_namespaced_pod("runs", namespace)
    wait_for(
        lambda: "runs" not in {p.metadata.name for p in kube.pods(namespace)},
        10,
        "the deleted pod gone",
    )


# ---- a gang from Pending to Finished ---------------------------------------------------------


def test_gang_lifecycle_status_events_and_metrics(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    before = extender.metrics()

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return extender.metrics().get(key, 0.0) - before.get(key, 0.0)

    kube.create_podgroup(namespace, "train", 3)
    phases = PhaseRecorder(kube, namespace, "train")
    first = phases.until("Pending", 15)
    # scheduler-plugins' status fields: no `scheduled` (upstream removed it).
    assert "scheduled" not in first
    assert (first["running"], first["succeeded"], first["failed"]) == (0, 0, 0)
    done = {EXIT_AFTER_ANNOTATION: "4"}
    for i in range(2):
        create_pod(kube, namespace, f"train-{i}", group="train", annotations=done)
    wait_for(
        lambda: "WaitingForSiblings" in reasons(kube, namespace, "PodGroup", "train"),
        30,
        "WaitingForSiblings on the PodGroup",
    )
    # One event per distinct message: "current pods number: 1", then 2 (counted per retry).
    waiting = wait_for(
        lambda: [
            e
            for e in events(kube, namespace, "PodGroup", "train")
            if e.reason == "WaitingForSiblings" and "current pods number: 2," in e.message
        ],
        30,
        "WaitingForSiblings for 2 of 3 pods",
    )[0]
    assert waiting.type == "Normal"
    assert "current pods number: 2, minMember of group: 3" in waiting.message
    assert waiting.involved_object.api_version == XK8S_API.api_version
    assert not reasons(kube, namespace, "Pod", "train-0") & {"WaitingForSiblings"}
    assert phases.poll()["phase"] == "Pending"

    create_pod(kube, namespace, "train-2", group="train", annotations=done)
    running = phases.until("Running", 30)
    assert running["running"] == 3 and "scheduled" not in running
    assert running["scheduleStartTime"].endswith("Z")
    finished = phases.until("Finished", 30)
    assert (finished["succeeded"], finished["running"]) == (3, 0)
    assert phases.phases[0] == "Pending" and phases.phases[-2:] == ["Running", "Finished"]
    assert set(phases.phases) <= {"Pending", "PreScheduling", "Scheduling", "Running", "Finished"}

    got = reasons(kube, namespace, "PodGroup", "train")
    assert {"WaitingForSiblings", "GangWaiting", "GangAdmitted"} <= got
    [admitted] = [
        e for e in events(kube, namespace, "PodGroup", "train") if e.reason == "GangAdmitted"
    ]
    assert "3 member(s) bound together (train-0, train-1, train-2)" in admitted.message
    gang_waiting = [
        e for e in events(kube, namespace, "PodGroup", "train") if e.reason == "GangWaiting"
    ]
    assert any(e.message.startswith("1 of minMember 3 members placed") for e in gang_waiting)

    assert moved("gang_extender_gang_admissions_total", result="admitted") >= 1
    # The bind calls are answered (and counted) once the bindings are done: a moment after
    # the API server shows the pods bound.
    wait_for(
        lambda: moved("gang_extender_requests_total", verb="bind", code="200") >= 3,
        30,
        "the three bind calls answered",
    )
    assert moved("gang_extender_gate_wait_seconds_count") >= 3
    assert moved("gang_extender_events_total", result="created") >= 3
    assert moved("gang_extender_podgroup_status_writes_total", result="written") >= 3
    wait_for(
        lambda: extender.sample("gang_extender_podgroups", phase="Finished") >= 1,
        10,
        "the Finished gang in gang_extender_podgroups",
    )

    # Cleaning up the finished pods leaves the outcome on the PodGroup.
    kube.delete_pods_now(namespace)
    wait_for(lambda: not kube.pods(namespace), 10, "the finished pods deleted")
    time.sleep(2)
    assert podgroup_status(kube, namespace, "train")["phase"] == "Finished"


def test_a_failed_member_fails_the_gang(kube: Kube, namespace: str) -> None:
    kube.create_podgroup(namespace, "job", 2)
    create_pod(kube, namespace, "job-0", group="job")
    create_pod(
        kube,
        namespace,
        "job-1",
        group="job",
        annotations={EXIT_AFTER_ANNOTATION: "2", EXIT_PHASE_ANNOTATION: "Failed"},
    )
    phases = PhaseRecorder(kube, namespace, "job")
    failed = phases.until("Failed", 40)
    assert (failed["running"], failed["failed"]) == (1, 1)
    assert "Running" in phases.phases


# ---- a gang that cannot complete ----------------------------------------------------------------


def test_a_stuck_gang_shows_scheduling_in_the_gate_then_times_out(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    timeouts = extender.sample("gang_extender_gang_admissions_total", result="timeout")
    kube.create_podgroup(namespace, "stuck", 3)
    create_pod(kube, namespace, "stuck-0", group="stuck")
    create_pod(kube, namespace, "stuck-1", group="stuck")
    # Served by no scheduler: never placed, so the others wait in the gate until the
    # timeout (a member that fits nowhere would be turned away before any reservation).
    create_pod(kube, namespace, "stuck-2", group="stuck", scheduler="no-such-scheduler")
    key = f"{namespace}/stuck"

    def two_waiting() -> dict[str, Any] | None:
        doc = debug_gangs(extender)
        waiters = doc["gate"].get(key, [])
        return (
            doc if len(waiters) == 2 and all(w["waitingSeconds"] > 0.5 for w in waiters) else None
        )

    doc = wait_for(two_waiting, 40, "two members waiting in the gate for over 0.5s")
    assert {w["pod"] for w in doc["gate"][key]} == {f"{namespace}/stuck-0", f"{namespace}/stuck-1"}
    assert all(w["node"].startswith("node-") for w in doc["gate"][key])
    assert all(w["waitingSeconds"] < PERMIT_WAIT_SECONDS for w in doc["gate"][key])
    [group] = [g for g in doc["groups"] if g["key"] == key]
    assert (group["source"], group["minMember"], group["members"]) == ("x-k8s", 3, 3)
    assert group["waitingInGate"] == 2
    assert any(p["group"] == key and p["ttlSecondsLeft"] > 0 for p in doc["permitted"])

    phases = PhaseRecorder(kube, namespace, "stuck")
    scheduling = phases.until("PreScheduling", 10)
    assert scheduling["running"] == 0 and scheduling["scheduleStartTime"]
    assert extender.sample("gang_extender_podgroups", phase="PreScheduling") >= 1
    assert extender.sample("gang_extender_gate_waiting_pods") >= 2

    wait_for(
        lambda: "GangTimedOut" in reasons(kube, namespace, "PodGroup", "stuck"),
        PERMIT_WAIT_SECONDS + 20,
        "GangTimedOut on the PodGroup",
    )
    [timed_out] = [
        e for e in events(kube, namespace, "PodGroup", "stuck") if e.reason == "GangTimedOut"
    ]
    assert timed_out.type == "Warning"
    assert f"timed out after waiting {PERMIT_WAIT_SECONDS}s in the permit gate" in timed_out.message
    assert "(waiting: stuck-0, stuck-1)" in timed_out.message
    assert f"retried in {DENIED_SECONDS}s" in timed_out.message
    for name in ("stuck-0", "stuck-1"):
        assert "GangTimedOut" in reasons(kube, namespace, "Pod", name)
    assert "GangTimedOut" not in reasons(kube, namespace, "Pod", "stuck-2")
    assert extender.sample("gang_extender_gang_admissions_total", result="timeout") > timeouts

    def denied() -> list[dict[str, Any]]:
        return [d for d in debug_gangs(extender)["denied"] if d["group"] == key]

    [denial] = wait_for(denied, 5, "the denial in /debug/gangs")
    assert denial["reason"] == "timeout" and 0 < denial["ttlSecondsLeft"] <= DENIED_SECONDS
    phases.until("Pending", 10)
    assert kube.bound(namespace) == {}


def test_insufficient_resources_event_names_the_gap(kube: Kube, namespace: str) -> None:
    kube.create_podgroup(namespace, "huge", 2, min_resources={"cpu": "100"})
    for i in range(2):
        create_pod(kube, namespace, f"huge-{i}", group="huge")
    wait_for(
        lambda: "InsufficientResources" in reasons(kube, namespace, "PodGroup", "huge"),
        30,
        "InsufficientResources on the PodGroup",
    )
    [event] = [
        e
        for e in events(kube, namespace, "PodGroup", "huge")
        if e.reason == "InsufficientResources"
    ]
    assert event.type == "Warning" and "short by cpu 88" in event.message


def test_label_only_group_events_go_on_the_pods(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    labels = {LIGHT_NAME_LABEL: "light", LIGHT_MIN_AVAILABLE_LABEL: "3"}
    for i in range(2):
        create_pod(kube, namespace, f"light-{i}", labels=labels)

    def waiting_on(name: str) -> bool:
        return "WaitingForSiblings" in reasons(kube, namespace, "Pod", name)

    for i in range(2):
        wait_for(
            functools.partial(waiting_on, f"light-{i}"), 30, f"WaitingForSiblings on light-{i}"
        )
    [group] = wait_for(
        lambda: [g for g in debug_gangs(extender)["groups"] if g["key"] == f"{namespace}/light"],
        10,
        "the label-only group in /debug/gangs",
    )
    assert (group["source"], group["minMember"], group["phase"]) == ("labels", 3, "Pending")


def test_preemption_victims_get_an_event_naming_the_gang(kube: Kube, namespace: str) -> None:
    kube.ensure_priority_class("lifecycle-low", 10)
    kube.ensure_priority_class("lifecycle-high", 10_000)
    for i in range(3):
        create_pod(kube, namespace, f"low-{i}", cpu="3", priority_class="lifecycle-low")
    wait_for(lambda: len(kube.bound(namespace)) == 3, 30, "the low-priority pods bound")
    kube.create_podgroup(namespace, "urgent", 2)
    for i in range(2):
        create_pod(
            kube, namespace, f"urgent-{i}", group="urgent", cpu="2", priority_class="lifecycle-high"
        )

    def preempted() -> list[Any]:
        return [
            e
            for i in range(3)
            for e in events(kube, namespace, "Pod", f"low-{i}")
            if e.reason == "Preempted"
        ]

    found = wait_for(preempted, 60, "a Preempted event from gang-extender on a victim")
    assert all(e.type == "Warning" for e in found)
    assert any(f"so that gang {namespace}/urgent can be placed" in e.message for e in found)
