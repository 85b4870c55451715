"""The pod simulator: the kubelet of the fake nodes.

Without a kubelet, a bound pod stays Pending and a pod deleted with a grace
period stays Terminating forever, so nothing downstream of binding (pod
phases, preemption victims leaving, jobs finishing) could be tested. This
loop does the few things a kubelet does that the control plane can see.

The decisions (`next_pod_action`, `planned_exit`) and the status patches are
pure functions of the pod and the time; `PodSimulator` only watches and sends.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .api import Api, message
from .nodes import FAKE_NODE_LABEL
from .report import ClusterError

# A failed call is tried again from a fresh read after this, doubling up to the maximum.
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 10.0
EXIT_AFTER_ANNOTATION = "local-cluster.dev/exit-after-seconds"
EXIT_PHASE_ANNOTATION = "local-cluster.dev/exit-phase"
EXIT_PHASES = ("Succeeded", "Failed")
SIMULATOR_WATCH_SECONDS = 300
SIMULATOR_READY_LINE = "watching pods"


class Action(StrEnum):
    """What the simulator does next to a pod (see next_pod_action)."""

    RUN = "run"
    DELETE = "delete"
    EXIT = "exit"


@dataclass(frozen=True)
class PlannedExit:
    """When (seconds from now) a running pod exits, and in which phase."""

    delay: float
    phase: str


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _fake_ip(prefix: str, key: str) -> str:
    """A stable made-up address under 10.0.0.0/8 (fake nodes have no network)."""
    h = hashlib.sha256(key.encode()).digest()
    return f"{prefix}.{h[0]}.{h[1] % 254 + 1}"


def exit_plan(pod: dict[str, Any]) -> tuple[float, str] | None:
    """(seconds after Running, final phase) from the exit annotations, None if absent or invalid."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(EXIT_AFTER_ANNOTATION)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None
    phase = annotations.get(EXIT_PHASE_ANNOTATION) or "Succeeded"
    if seconds < 0 or phase not in EXIT_PHASES:
        return None
    return seconds, phase


def next_pod_action(pod: dict[str, Any], is_fake_node: Callable[[str], bool]) -> Action | None:
    """What a kubelet on the pod's node would do next: RUN, DELETE, EXIT or nothing."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or not is_fake_node(node):
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        # The kubelet's final delete after the containers stopped.
        return Action.DELETE
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase == "Pending":
        return Action.RUN
    if phase == "Running" and exit_plan(pod) is not None:
        return Action.EXIT
    return None


def started_at(pod: dict[str, Any], now: float) -> float:
    """When a running pod started (its status.startTime), `now` if that is unreadable."""
    return _parse_rfc3339((pod.get("status") or {}).get("startTime")) or now


def planned_exit(pod: dict[str, Any], started: float, now: float) -> PlannedExit | None:
    """The exit of a pod that started running at `started`, seen at `now`.

    None without a valid plan; a pod whose time is already up exits at once
    (delay 0), e.g. after the simulator restarted.
    """
    plan = exit_plan(pod)
    if plan is None:
        return None
    seconds, phase = plan
    return PlannedExit(max(0.0, started + seconds - now), phase)


def running_status_patch(pod: dict[str, Any], now: float) -> dict[str, Any]:
    """Status a kubelet reports once every container started and is ready."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ts = _rfc3339(now)
    host_ip = _fake_ip("10.0", spec.get("nodeName") or "")
    pod_ip = _fake_ip("10.244", meta.get("uid") or "")
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": ts}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
    ]
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": ts,
        "containerStatuses": [
            _container_status(meta, c, {"running": {"startedAt": ts}}, ready=True)
            for c in spec.get("containers") or ()
        ],
    }
    init = [
        _container_status(meta, c, _terminated(0, ts, ts), ready=True)
        for c in spec.get("initContainers") or ()
    ]
    if init:
        status["initContainerStatuses"] = init
    # metadata.uid is a precondition: a recreated pod of the same name is left alone.
    return {"metadata": {"uid": meta.get("uid")}, "status": status}


def terminal_status_patch(
    pod: dict[str, Any], phase: str, started: float, now: float
) -> dict[str, Any]:
    """Status after every container exited with 0 (Succeeded) or 1 (Failed)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ts = _rfc3339(now)
    code = 0 if phase == "Succeeded" else 1
    reason = "PodCompleted" if code == 0 else "PodFailed"
    return {
        "metadata": {"uid": meta.get("uid")},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "False", "reason": reason, "lastTransitionTime": ts}
                for t in ("Ready", "ContainersReady")
            ],
            "containerStatuses": [
                _container_status(meta, c, _terminated(code, _rfc3339(started), ts), ready=False)
                for c in spec.get("containers") or ()
            ],
        },
    }


def _terminated(code: int, started: str, finished: str) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": finished,
        }
    }


def _container_status(
    meta: dict[str, Any], container: dict[str, Any], state: dict[str, Any], *, ready: bool
) -> dict[str, Any]:
    name = container.get("name") or ""
    return {
        "name": name,
        "image": container.get("image") or "",
        "imageID": "",
        "containerID": f"fake://{meta.get('uid')}/{name}",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


class WatchExpired(Exception):
    """410 Gone: list again."""


class PodSimulator:
    """List + watch every pod and act as the kubelet of fake nodes.

    Each action is sent once per pod (remembered by uid). A failed call is
    tried again on a timer (RETRY_FIRST_SECONDS, doubling to RETRY_MAX_SECONDS)
    from a fresh read of the pod: the next event about it may never come (a
    terminating pod does not change until it is gone, and kube-scheduler counts
    its room as taken all that while, as it would a kubelet that never finished).
    """

    def __init__(self, api: Api, log: Callable[[str], None]) -> None:
        self._api = api
        self._log = log
        self._fake_nodes: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._sent: dict[str, Action] = {}  # uid -> action already sent
        self._timers: dict[str, threading.Timer] = {}  # uid -> pending exit
        # uid -> (the retry timer not fired yet or None, its delay)
        self._retries: dict[str, tuple[threading.Timer | None, float]] = {}

    def run(self, stop: threading.Event) -> None:
        resource_version = ""
        backoff = 0.5
        while not stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._list()
                resource_version = self._watch(resource_version, stop)
                backoff = 0.5
            except WatchExpired:
                self._log("watch expired (410 Gone); listing again")
                resource_version = ""
            except (OSError, ssl.SSLError, ValueError, ClusterError) as err:
                # List again rather than resume: after `down` + `up` the new
                # etcd's resourceVersions restart, and a watch from our old,
                # now future, version would hang silently.
                self._log(f"watch failed, listing again in {backoff:.1f}s: {err}")
                resource_version = ""
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self) -> str:
        status, body = self._api.request("GET", "/api/v1/pods", timeout=30)
        if status != 200:
            raise ClusterError(f"listing pods failed: HTTP {status}: {message(body)}")
        items = body.get("items") or []
        uids = {(p.get("metadata") or {}).get("uid") for p in items}
        with self._lock:
            for uid in [u for u in self._sent if u not in uids]:
                self._forget_locked(uid)
        for pod in items:
            self.handle("ADDED", pod)
        self._log(f"listed {len(items)} pods; {SIMULATOR_READY_LINE}")
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, resource_version: str, stop: threading.Event) -> str:
        query = urllib.parse.urlencode(
            {
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(SIMULATOR_WATCH_SECONDS),
            }
        )
        events = self._api.stream(f"/api/v1/pods?{query}", SIMULATOR_WATCH_SECONDS + 30)
        for event in events:
            if stop.is_set():
                break
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(obj.get("message", ""))
                raise ClusterError(f"watch error: {message(obj)}")
            resource_version = (obj.get("metadata") or {}).get(
                "resourceVersion"
            ) or resource_version
            if event.get("type") != "BOOKMARK":
                self.handle(str(event.get("type")), obj)
        return resource_version

    def handle(self, event_type: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        if event_type == "DELETED":
            with self._lock:
                self._forget_locked(uid)
            return
        action = next_pod_action(pod, self._is_fake_node)
        with self._lock:
            if action is None or self._sent.get(uid) == action:
                return
            if action == Action.EXIT and uid in self._timers:
                return
            if action != Action.EXIT:
                self._sent[uid] = action
        try:
            if action == Action.DELETE:
                self._delete(pod)
            elif action == Action.RUN:
                self._run(pod)
            else:
                self._schedule_exit(pod, started_at(pod, time.time()))
        except (OSError, ssl.SSLError) as err:
            # No answer (the API server restarting): the action is not sent. A relist
            # alone would not retry it: the uid is still remembered as sent.
            self._failed(pod, f"{action.value} of", 0, str(err))

    def _forget_locked(self, uid: str) -> None:
        self._sent.pop(uid, None)
        timer = self._timers.pop(uid, None)
        if timer is not None:
            timer.cancel()
        retry = self._retries.pop(uid, None)
        if retry is not None and retry[0] is not None:
            retry[0].cancel()

    def _key(self, pod: dict[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def _path(self, pod: dict[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"

    def _is_fake_node(self, name: str) -> bool:
        known = self._fake_nodes.get(name)
        if known is not None:
            return known
        status, body = self._api.request("GET", f"/api/v1/nodes/{urllib.parse.quote(name)}")
        if status != 200:
            return False  # not cached: the node may be created later
        labels = (body.get("metadata") or {}).get("labels") or {}
        fake = labels.get(FAKE_NODE_LABEL[0]) == FAKE_NODE_LABEL[1]
        self._fake_nodes[name] = fake
        return fake

    def _failed(self, pod: dict[str, Any], what: str, status: int, body: Any) -> None:
        """Forget the action and read the pod again later (see the class docstring)."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        with self._lock:
            self._sent.pop(uid, None)
            earlier = self._retries.get(uid)
            if earlier is not None and earlier[0] is not None:
                delay = earlier[1]  # a retry is already on its way
            else:
                delay = RETRY_FIRST_SECONDS if earlier is None else earlier[1] * 2
                delay = min(delay, RETRY_MAX_SECONDS)
                timer = threading.Timer(delay, self._retry, (pod,))
                timer.daemon = True
                self._retries[uid] = (timer, delay)
                timer.start()
        self._log(
            f"{what} {self._key(pod)} failed: {status or 'no answer'}: {message(body)}; "
            f"reading it again in {delay:g}s"
        )

    def _retry(self, pod: dict[str, Any]) -> None:
        """Act on a fresh read of a pod whose last call failed (on the retry timer's thread)."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        with self._lock:
            retry = self._retries.get(uid)
            if retry is None:
                return  # forgotten meanwhile (the pod was deleted)
            self._retries[uid] = (None, retry[1])
        try:
            status, fresh = self._api.request("GET", self._path(pod))
            if status == 404 or (status == 200 and (fresh.get("metadata") or {}).get("uid") != uid):
                with self._lock:
                    self._forget_locked(uid)
                return
            if status != 200:
                self._failed(pod, "reading", status, fresh)
                return
            self.handle("MODIFIED", fresh)
        except (OSError, ssl.SSLError) as err:
            self._failed(pod, "reading", 0, str(err))

    def _delete(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        status, body = self._api.request("DELETE", self._path(pod), options)
        if status in (200, 202, 404, 409):
            self._log(f"deleted {self._key(pod)} (grace period over)")
        else:
            self._failed(pod, "deleting", status, body)

    def _patch_status(self, pod: dict[str, Any], patch: dict[str, Any]) -> tuple[int, Any]:
        return self._api.request(
            "PATCH",
            self._path(pod) + "/status",
            patch,
            "application/strategic-merge-patch+json",
        )

    def _run(self, pod: dict[str, Any]) -> None:
        now = time.time()
        status, body = self._patch_status(pod, running_status_patch(pod, now))
        if status == 200:
            self._log(f"{self._key(pod)} is Running on {pod['spec']['nodeName']}")
            if exit_plan(pod) is not None:
                self._schedule_exit(pod, now)
        elif status in (404, 409):
            self._log(f"{self._key(pod)} is gone or was recreated; not started")
        else:
            self._failed(pod, "starting", status, body)

    def _schedule_exit(self, pod: dict[str, Any], started: float) -> None:
        planned = planned_exit(pod, started, time.time())
        if planned is None:
            return
        uid = (pod.get("metadata") or {}).get("uid") or ""
        timer = threading.Timer(planned.delay, self._exit, (pod, planned.phase, started))
        timer.daemon = True
        with self._lock:
            if uid in self._timers:
                return
            self._timers[uid] = timer
        timer.start()

    def _exit(self, pod: dict[str, Any], phase: str, started: float) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        with self._lock:
            if self._timers.pop(uid, None) is None:
                return  # deleted meanwhile
            self._sent[uid] = Action.EXIT
        patch = terminal_status_patch(pod, phase, started, time.time())
        try:
            status, body = self._patch_status(pod, patch)
        except (OSError, ssl.SSLError) as err:  # the API server is away (a restart)
            status, body = 0, str(err)
        if status == 200:
            self._log(f"{self._key(pod)} exited: {phase}")
        elif status not in (404, 409):
            self._failed(pod, f"setting phase {phase} of", status, body)
