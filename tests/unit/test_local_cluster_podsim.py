"""hack/local_cluster's pod simulator: what it does next to a pod, and what it reports.

The decisions and status patches are pure functions of the pod and the time;
`PodSimulator.handle` is checked against a recording stand-in for the API.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from local_cluster.api import Api
from local_cluster.podsim import (
    EXIT_AFTER_ANNOTATION,
    EXIT_PHASE_ANNOTATION,
    Action,
    PlannedExit,
    PodSimulator,
    exit_plan,
    next_pod_action,
    planned_exit,
    running_status_patch,
    started_at,
    terminal_status_patch,
)

FAKE = "node-1"
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC).timestamp()


def pod(
    phase: str | None = None,
    node: str | None = FAKE,
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
    start_time: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u-1"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if start_time is not None:
        status["startTime"] = start_time
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox"}, {"name": "side", "image": "x"}]
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": metadata, "spec": spec, "status": status}


def is_fake(name: str) -> bool:
    return name == FAKE


def exits(after: str, phase: str | None = None) -> dict[str, str]:
    annotations = {EXIT_AFTER_ANNOTATION: after}
    if phase is not None:
        annotations[EXIT_PHASE_ANNOTATION] = phase
    return annotations


# ---- next action ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("the_pod", "action"),
    [
        (pod(node=None), None),  # not bound: the scheduler's business
        (pod(node="real-node"), None),  # a real kubelet's node
        (pod(), Action.RUN),  # bound, no status yet
        (pod("Pending"), Action.RUN),
        (pod("Running"), None),  # runs until deleted
        (pod("Running", annotations=exits("5")), Action.EXIT),
        (pod("Running", annotations=exits("5", "Failed")), Action.EXIT),
        (pod("Running", annotations=exits("soon")), None),  # an invalid plan is ignored
        (pod("Succeeded", annotations=exits("5")), None),  # already exited
        (pod("Failed"), None),
        (pod("Pending", deleting=True), Action.DELETE),  # the kubelet's final delete
        (pod("Running", annotations=exits("5"), deleting=True), Action.DELETE),
        (pod(node="real-node", deleting=True), None),
    ],
)
def test_next_pod_action(the_pod: dict[str, Any], action: Action | None) -> None:
    assert next_pod_action(the_pod, is_fake) == action


def test_next_pod_action_asks_about_the_pods_node_only() -> None:
    asked: list[str] = []

    def fake(name: str) -> bool:
        asked.append(name)
        return True

    assert next_pod_action(pod(node="node-7"), fake) == Action.RUN
    assert next_pod_action(pod(node=None), fake) is None
    assert asked == ["node-7"]


@pytest.mark.parametrize(
    ("annotations", "plan"),
    [
        (None, None),
        ({}, None),
        (exits("30"), (30.0, "Succeeded")),
        (exits("0"), (0.0, "Succeeded")),
        (exits("1.5", "Failed"), (1.5, "Failed")),
        (exits("30", ""), (30.0, "Succeeded")),
        (exits("-1"), None),
        (exits("ten"), None),
        (exits("30", "Unknown"), None),
        ({EXIT_PHASE_ANNOTATION: "Failed"}, None),
    ],
)
def test_exit_plan(annotations: dict[str, str] | None, plan: tuple[float, str] | None) -> None:
    assert exit_plan(pod("Running", annotations=annotations)) == plan


def test_planned_exit_counts_from_the_start() -> None:
    running = pod("Running", annotations=exits("10", "Failed"))
    assert planned_exit(running, started=T0, now=T0 + 3) == PlannedExit(7.0, "Failed")
    # Time already up (e.g. the simulator restarted): exit at once.
    assert planned_exit(running, started=T0, now=T0 + 60) == PlannedExit(0.0, "Failed")
    assert planned_exit(pod("Running"), started=T0, now=T0) is None


def test_started_at_reads_the_start_time_or_falls_back_to_now() -> None:
    assert started_at(pod("Running", start_time="2026-01-02T03:04:05Z"), T0 + 99) == T0
    assert started_at(pod("Running"), T0 + 99) == T0 + 99
    assert started_at(pod("Running", start_time="yesterday"), T0 + 99) == T0 + 99


# ---- status patches -----------------------------------------------------------------------


def test_running_status_patch_is_what_a_kubelet_reports() -> None:
    the_pod = pod("Pending")
    the_pod["spec"]["initContainers"] = [{"name": "init", "image": "i"}]
    patch = running_status_patch(the_pod, T0)
    assert patch["metadata"] == {"uid": "u-1"}  # a recreated pod is left alone
    status = patch["status"]
    assert status["phase"] == "Running"
    assert status["startTime"] == "2026-01-02T03:04:05Z"
    assert {c["type"] for c in status["conditions"] if c["status"] == "True"} >= {
        "Ready",
        "ContainersReady",
    }
    assert [(c["name"], c["ready"], list(c["state"])) for c in status["containerStatuses"]] == [
        ("main", True, ["running"]),
        ("side", True, ["running"]),
    ]
    (init,) = status["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert status["podIP"].startswith("10.244.") and status["hostIP"].startswith("10.0.")
    # Made-up addresses are stable, so a repeated patch changes nothing.
    assert running_status_patch(the_pod, T0) == patch


@pytest.mark.parametrize(
    ("phase", "code", "reason", "container_reason"),
    [("Succeeded", 0, "PodCompleted", "Completed"), ("Failed", 1, "PodFailed", "Error")],
)
def test_terminal_status_patch(phase: str, code: int, reason: str, container_reason: str) -> None:
    patch = terminal_status_patch(pod("Running"), phase, started=T0, now=T0 + 5)
    assert patch["metadata"] == {"uid": "u-1"}
    status = patch["status"]
    assert status["phase"] == phase
    assert {(c["type"], c["status"], c["reason"]) for c in status["conditions"]} == {
        ("Ready", "False", reason),
        ("ContainersReady", "False", reason),
    }
    for container in status["containerStatuses"]:
        assert container["ready"] is False
        assert container["state"]["terminated"] == {
            "exitCode": code,
            "reason": container_reason,
            "startedAt": "2026-01-02T03:04:05Z",
            "finishedAt": "2026-01-02T03:04:10Z",
        }


# ---- the simulator's bookkeeping ------------------------------------------------------------


class RecordingApi(Api):
    """Answers node lookups and accepts every write, recording what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        if method == "GET" and path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            labels = {"type": "fake-node"} if name == FAKE else {}
            return 200, {"metadata": {"labels": labels}}
        self.sent.append((method, path))
        return 200, {}


def test_each_action_is_sent_once_per_pod() -> None:
    api = RecordingApi()
    simulator = PodSimulator(api, lambda _: None)
    pending = pod("Pending")
    simulator.handle("ADDED", pending)
    simulator.handle("MODIFIED", pending)  # the same event again: nothing new to do
    simulator.handle("MODIFIED", pod("Pending", node="real-node"))
    assert api.sent == [("PATCH", "/api/v1/namespaces/ns/pods/p/status")]
    simulator.handle("MODIFIED", pod("Running", deleting=True))
    simulator.handle("MODIFIED", pod("Running", deleting=True))
    assert api.sent[1:] == [("DELETE", "/api/v1/namespaces/ns/pods/p")]
    # Deleted and recreated under the same uid (as in tests): acted on afresh.
    simulator.handle("DELETED", pod("Running"))
    simulator.handle("ADDED", pending)
    assert api.sent[2:] == [("PATCH", "/api/v1/namespaces/ns/pods/p/status")]


def test_a_pod_whose_time_is_up_exits_once() -> None:
    api = RecordingApi()
    simulator = PodSimulator(api, lambda _: None)
    running = pod("Running", annotations=exits("1"), start_time="2026-01-02T03:04:05Z")
    simulator.handle("ADDED", running)
    deadline = time.monotonic() + 5
    while not api.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    simulator.handle("MODIFIED", running)  # the exit was sent; not scheduled again
    time.sleep(0.1)
    assert api.sent == [("PATCH", "/api/v1/namespaces/ns/pods/p/status")]


class FlakyApi(RecordingApi):
    """The API server away for the first `away` writes (no answer, or `status`), then back.

    `pod` is what a fresh GET of the pod returns (None: it is gone, 404).
    """

    def __init__(self, away: int, status: int | None, current: dict[str, Any] | None) -> None:
        super().__init__()
        self.away = away
        self.status = status
        self.current = current

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        if method == "GET" and path.startswith("/api/v1/namespaces/"):
            self.sent.append((method, path))
            return (200, self.current) if self.current is not None else (404, {})
        if method != "GET" and self.away > 0:
            self.away -= 1
            if self.status is None:
                raise ConnectionRefusedError("connection refused")
            return self.status, {"message": "etcd leader changed"}
        return super().request(method, path, *args, **kwargs)


def wait_sent(api: RecordingApi, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(api.sent) < count and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("status", [None, 503])
def test_a_failed_delete_is_retried_though_no_event_comes(
    status: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A terminating pod does not change until it is gone: without a retry of our own it
    would stay Terminating, its room counted by kube-scheduler, for ever (issue 49's soak)."""
    monkeypatch.setattr("local_cluster.podsim.RETRY_FIRST_SECONDS", 0.01)
    terminating = pod("Running", deleting=True)
    api = FlakyApi(away=2, status=status, current=terminating)
    simulator = PodSimulator(api, lambda _: None)
    simulator.handle("MODIFIED", terminating)  # no exception reaches the watch loop
    path = "/api/v1/namespaces/ns/pods/p"
    wait_sent(api, 3)
    # The first DELETE found nobody (not recorded), a fresh read, the second failed too,
    # a fresh read, the third went through.
    assert api.sent[:3] == [("GET", path), ("GET", path), ("DELETE", path)]
    time.sleep(0.1)
    assert len(api.sent) == 3  # done: nothing more


def test_a_pod_gone_meanwhile_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("local_cluster.podsim.RETRY_FIRST_SECONDS", 0.01)
    api = FlakyApi(away=1, status=None, current=None)
    simulator = PodSimulator(api, lambda _: None)
    simulator.handle("MODIFIED", pod("Pending"))
    wait_sent(api, 1)
    time.sleep(0.1)
    assert api.sent == [("GET", "/api/v1/namespaces/ns/pods/p")]  # read once, then forgotten


def test_an_exit_the_api_server_missed_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("local_cluster.podsim.RETRY_FIRST_SECONDS", 0.01)
    running = pod("Running", annotations=exits("0"), start_time="2026-01-02T03:04:05Z")
    api = FlakyApi(away=1, status=None, current=running)
    simulator = PodSimulator(api, lambda _: None)
    simulator.handle("ADDED", running)
    wait_sent(api, 2)
    status_path = "/api/v1/namespaces/ns/pods/p/status"
    assert api.sent[:2] == [("GET", "/api/v1/namespaces/ns/pods/p"), ("PATCH", status_path)]
