"""Every group source, and the PodGroups operators create, gang-scheduled by kube-scheduler.

The workloads are the files of deploy/examples/sources/, applied as a user
would (into the test's namespace). Each is first applied one member short:
nothing may be bound and the members must say why; then the last member
arrives and the whole gang must be bound within 15 s.
"""

from __future__ import annotations

import copy
import functools
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from app.core.groups import NATIVE_API, VOLCANO_API, VOLCANO_GROUP_ANNOTATIONS, XK8S_API, GroupApi
from hack.clusterkit import REPO, wait_for
from tests.cluster.kube import Kube
from tests.cluster.session import PERMIT_WAIT_SECONDS, Extender
from tests.packaging.helm import kube_bin

EXAMPLES = REPO / "deploy" / "examples" / "sources"
SIBLINGS = "cannot find enough sibling pods"
GROUP_APIS = {api.api_version: api for api in (XK8S_API, VOLCANO_API, NATIVE_API)}


def load(name: str, namespace: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return [d for d in docs if d["kind"] != "Namespace"]


def apply(kubeconfig: str, docs: list[dict[str, Any]]) -> None:
    if not docs:
        return
    result = subprocess.run(
        [str(kube_bin() / "kubectl"), "--kubeconfig", kubeconfig, "apply", "-f", "-"],
        input=yaml.safe_dump_all(docs),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kubectl apply: {result.stderr}"


def assert_never_bound(kube: Kube, namespace: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        bound = kube.bound(namespace)
        assert not bound, f"gang partly bound: {bound}"
        time.sleep(0.2)


def one_short(workload: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The Deployment or Job with one replica fewer, and its full size."""
    short = copy.deepcopy(workload)
    field = "replicas" if workload["kind"] == "Deployment" else "parallelism"
    size = int(workload["spec"][field])
    short["spec"][field] = size - 1
    return short, size


EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("00-"))


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_example_waits_for_its_last_member_then_binds_whole(
    kube: Kube, kubeconfig: str, namespace: str, example: str
) -> None:
    docs = load(example, namespace)
    groups = [d for d in docs if d["kind"] == "PodGroup"]
    pods = [d for d in docs if d["kind"] == "Pod"]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "Job")]
    apply(kubeconfig, groups)
    if pods:
        size = len(pods)
        apply(kubeconfig, pods[:-1])
    else:
        (workload,) = workloads
        short, size = one_short(workload)
        apply(kubeconfig, [short])
    first = wait_for(
        lambda: len(kube.pods(namespace)) == size - 1 and kube.pods(namespace),
        30,
        f"{size - 1} pods",
    )

    def told_why(name: str) -> bool:
        return any(SIBLINGS in e for e in kube.events(namespace, name))

    for name in [p.metadata.name for p in first]:
        wait_for(functools.partial(told_why, name), 30, f"the sibling message on {name}")
    assert_never_bound(kube, namespace, 2)

    apply(kubeconfig, pods[-1:] if pods else workloads)
    last = wait_for(
        lambda: [
            p
            for p in kube.pods(namespace)
            if p.metadata.name not in {q.metadata.name for q in first}
        ],
        30,
        "the last member",
    )[0]
    bound = wait_for(
        lambda: len(kube.bound(namespace)) == size and kube.bound(namespace),
        30,
        f"all {size} members bound",
    )
    elapsed = (datetime.now(UTC) - last.metadata.creation_timestamp).total_seconds()
    assert elapsed <= 15 + 1, f"gang bound {elapsed:.1f}s after its last member was created"
    assert set(bound) == {p.metadata.name for p in kube.pods(namespace)}
    for group in groups:
        check_status(kube, kubeconfig, GROUP_APIS[group["apiVersion"]], namespace, group, size)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}


def check_status(
    kube: Kube, kubeconfig: str, api: GroupApi, namespace: str, group: dict[str, Any], size: int
) -> None:
    """Each source's status, in its own shape, once the gang runs."""
    name = group["metadata"]["name"]

    def current() -> dict[str, Any]:
        return kube.group_object(api, namespace, name)

    if api is NATIVE_API:
        # kube-scheduler owns a native PodGroup's status; gang-extender writes none.
        time.sleep(2)
        assert "Scheduled" not in conditions(current())
        return
    # Volcano's phase is Running once minMember are bound (as Volcano's scheduler
    # counts allocated pods); the running count follows when the pods start.
    running = wait_for(
        lambda: (
            (s := current().get("status") or {}).get("phase") == "Running"
            and s.get("running") == size
            and s
        ),
        30,
        f"{api.api_version} PodGroup {name} Running with {size} running",
    )
    assert conditions(current())["Scheduled"]["status"] == "True"
    if api is XK8S_API:
        assert "scheduled" not in running, "scheduler-plugins has no status.scheduled"
        # What a user (or a pipeline step) waits on; the resource is spelled out because
        # `podgroup` alone means Kubernetes' own PodGroup when GenericWorkload is on.
        result = subprocess.run(
            [
                str(kube_bin() / "kubectl"),
                "--kubeconfig",
                kubeconfig,
                "-n",
                namespace,
                "wait",
                "--for=condition=Scheduled",
                f"{XK8S_API.plural}.{XK8S_API.group}/{name}",
                "--timeout=30s",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr


def test_schedule_timeout_zero_is_accepted_and_waits_the_default(
    kube: Kube, kubeconfig: str, namespace: str
) -> None:
    """mpi-operator's PodGroup (timeout 0) whose last worker is never placed: the gate waits
    the extender's default (--permit-waiting-time-seconds), then releases everybody.

    The last worker names a scheduler that does not run (one that fits no node
    would be turned away by --gang-feasibility before anything is reserved)."""
    docs = load("20-mpi-operator.yaml", namespace)
    group = next(d for d in docs if d["kind"] == "PodGroup")
    assert group["spec"]["scheduleTimeoutSeconds"] == 0
    pods = [d for d in docs if d["kind"] == "Pod"]
    pods[-1]["spec"]["schedulerName"] = "no-such-scheduler"
    apply(kubeconfig, [group, *pods])
    wait_for(
        lambda: any(
            f"timed out after waiting {PERMIT_WAIT_SECONDS}s in the permit gate" in e
            for e in kube.events(namespace, pods[0]["metadata"]["name"])
        ),
        60,
        f"a timeout after the default {PERMIT_WAIT_SECONDS}s",
    )
    assert kube.bound(namespace) == {}


def test_a_source_switched_off_leaves_its_pods_alone(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    extender.restart(*extender.extra_args, "--volcano-podgroups", "off")
    try:
        assert f"volcano PodGroups ({VOLCANO_API.api_version}) are off" in extender.log()
        kube.create_volcano_podgroup(namespace, "tf", 3)
        kube.create_pod(namespace, "alone", annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "tf"})
        # An ordinary pod for gang-extender now: bound without its 2 missing siblings.
        wait_for(lambda: "alone" in kube.bound(namespace), 30, "the pod bound on its own")
    finally:
        extender.restart(*extender.extra_args[:-2])
