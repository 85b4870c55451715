#!/usr/bin/env python3
"""`make demo`: a real kube-scheduler placing gangs through gang-extender, step by step.

Starts (or reuses) the local control plane and an extender on port 8888,
applies deploy/examples/, and prints what happened to every pod and why,
as `kubectl describe` would show it. Exits 1 when a step did not end as
it says it should (tests/cluster/test_demo.py runs it). Leaves everything
running; `make demo-down` (or `python hack/demo.py --stop` +
`hack/local-cluster down`) stops it. DEMO_EXTENDER_PORT (default 8888) and
LOCAL_CLUSTER_DIR / LOCAL_CLUSTER_PORT_OFFSET run it beside another cluster.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from app.core.groups import POD_GROUP_LABEL

# Run by path (`python hack/demo.py`), sys.path[0] is hack/: the repository root makes
# hack.clusterkit importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hack.clusterkit import (
    REPO,
    answers,
    api_client,
    kubeconfig_of,
    local_cluster,
    start_extender,
    wait_webhook_marks,
    webhook_args,
)

STATE = Path(os.environ.get("LOCAL_CLUSTER_DIR", REPO / ".local-cluster"))
PID_FILE = STATE / "extender.pid"
LOG_FILE = STATE / "logs" / "extender.log"
PORT = int(os.environ.get("DEMO_EXTENDER_PORT", "8888"))
URL = f"http://127.0.0.1:{PORT}"
NAMESPACE = "gang-demo"


def say(text: str = "") -> None:
    print(text, flush=True)


def run(*cmd: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"demo: {' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def running_pid() -> int | None:
    try:
        pid = int(PID_FILE.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"app\x00serve" in cmdline else None


def start_demo_extender(kubeconfig: str) -> None:
    if running_pid() and answers(f"{URL}/readyz"):
        say(f"extender already running (pid {running_pid()}), reusing it")
        return
    try:
        # Its own session: it keeps running after the demo exits.
        # The local cluster's gang-only mode: the webhook marks gang members.
        process = start_extender(
            kubeconfig, PORT, LOG_FILE, webhook_args(PORT), timeout=30, detach=True
        )
    except (RuntimeError, TimeoutError):
        sys.exit(f"demo: the extender did not start; see {LOG_FILE}")
    PID_FILE.write_text(str(process.pid))
    say(f"extender started (pid {process.pid}), logs in {LOG_FILE}")


def stop_extender() -> None:
    pid = running_pid()
    if pid is None:
        say("no demo extender running")
        return
    os.kill(pid, signal.SIGTERM)
    say(f"stopped the demo extender (pid {pid})")
    PID_FILE.unlink(missing_ok=True)


def report(core: Any, title: str) -> None:
    """Each pod with its node, or the latest reason it is not placed."""
    say(f"\n--- {title}")
    pods = sorted(core.list_namespaced_pod(NAMESPACE).items, key=lambda p: p.metadata.name)
    events: dict[str, Any] = {}
    for event in core.list_namespaced_event(NAMESPACE).items:
        if event.reason != "FailedScheduling":
            continue
        name = event.involved_object.name
        when = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
        if name not in events or when >= events[name][0]:
            events[name] = (when, event.message)
    for pod in pods:
        group = (pod.metadata.labels or {}).get(POD_GROUP_LABEL, "-")
        if pod.spec.node_name:
            line = f"bound to {pod.spec.node_name}"
        else:
            line = "Pending: " + events.get(pod.metadata.name, (None, "not tried yet"))[1]
        say(f"  {pod.metadata.name:<28} group={group:<8} {line}")


def wait(core: Any, seconds: float, done: Any = None) -> bool:
    """Until `done(pods)` (True) or `seconds` passed (False; always so without `done`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done is not None and done(core.list_namespaced_pod(NAMESPACE).items):
            return True
        time.sleep(0.5)
    return False


def bound(pods: Any, prefix: str) -> int:
    return sum(1 for p in pods if p.metadata.name.startswith(prefix) and p.spec.node_name)


class Steps:
    """What each step should have led to; the demo fails if one did not."""

    def __init__(self) -> None:
        self.missed: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.missed.append(what)
            say(f"!!! expected: {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stop", action="store_true", help="stop the demo extender")
    if parser.parse_args().stop:
        stop_extender()
        return 0

    say("== starting the local control plane (hack/local-cluster up)")
    kubeconfig = kubeconfig_of(
        local_cluster(
            "up",
            *("--nodes", "3", "--node-cpu", "4", "--node-memory", "8Gi"),
            *("--extender-url", f"{URL}/scheduler"),
        )
    )
    kubectl = str(Path(run(str(REPO / "hack" / "build-kube")).strip()) / "kubectl")
    start_demo_extender(kubeconfig)

    core = k8s.CoreV1Api(api_client(kubeconfig))
    wait_webhook_marks(core)
    examples = REPO / "deploy" / "examples"

    def kubectl_run(*args: str) -> str:
        return run(kubectl, "--kubeconfig", kubeconfig, *args)

    say("\n== 1. nginx: PodGroup minMember 3, Deployment with 2 replicas")
    kubectl_run(
        "delete",
        "namespace",
        NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
        "--grace-period=0",
        "--force",
    )
    kubectl_run("apply", "-f", str(examples / "00-namespace.yaml"))
    kubectl_run("apply", "-f", str(examples / "10-nginx-gang.yaml"))
    steps = Steps()
    wait(core, 8)
    report(core, "after 8s: both replicas wait for a third sibling")
    steps.expect(
        bound(core.list_namespaced_pod(NAMESPACE).items, "nginx-") == 0, "no nginx pod bound"
    )

    say("\n== 2. kubectl -n gang-demo scale deployment nginx --replicas=3")
    kubectl_run("-n", NAMESPACE, "scale", "deployment", "nginx", "--replicas=3")
    start = time.monotonic()
    complete = wait(core, 30, lambda pods: bound(pods, "nginx-") >= 3)
    report(core, f"after {time.monotonic() - start:.1f}s: the gang is complete")
    steps.expect(complete, "the 3 nginx pods bound within 30 s")

    say("\n== 3. trainer: 4 workers x 3 CPUs must start together; the cluster fits 3")
    kubectl_run("apply", "-f", str(examples / "20-gang-that-does-not-fit.yaml"))
    wait(core, 15)
    report(core, "after 15s: none of the trainer pods is bound (all or nothing)")
    steps.expect(
        bound(core.list_namespaced_pod(NAMESPACE).items, "trainer-") == 0, "no trainer bound"
    )

    say("\n== 4. hack/local-cluster add-node node-4: now there is room for the whole gang")
    local_cluster("add-node", "node-4", "--cpu", "4", "--memory", "8Gi")
    start = time.monotonic()
    placed = wait(core, 60, lambda pods: bound(pods, "trainer-") >= 4)
    report(core, f"after {time.monotonic() - start:.1f}s: all four trainer pods bound together")
    steps.expect(placed, "the 4 trainer pods bound within 60 s of node-4")

    say(
        "\nThe cluster and the extender keep running. Try it yourself:\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        f"  {kubectl} -n {NAMESPACE} get pods -o wide\n"
        f"  {kubectl} -n {NAMESPACE} describe pod -l {POD_GROUP_LABEL}=trainer\n"
        "  hack/local-cluster add-node node-5 --label topology.kubernetes.io/zone=b\n"
        f"  tail -f {LOG_FILE}\n"
        "Stop everything with: make demo-down"
    )
    if steps.missed:
        say(
            f"\ndemo: {len(steps.missed)} step(s) did not end as expected: "
            + "; ".join(steps.missed)
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
