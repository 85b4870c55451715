"""YuniKorn's schedulingPolicyParameters against the real kube-scheduler.

A YuniKorn gang (task groups on its first pod, app id label on every pod)
with one member served by no scheduler: the others are placed and wait in
the permit gate for it. `placeholderTimeoutInSeconds` is that wait (3s here,
the session's default being PERMIT_WAIT_SECONDS); after it, style Soft
schedules the members as plain pods, style Hard keeps them waiting as a gang.
Each test brings its own 1-CPU nodes (tests/cluster/test_subgroups.py racks()).
"""

from __future__ import annotations

import functools
import json

from app.core.yunikorn import POLICY_ANNOTATION, TASK_GROUP_NAME_ANNOTATION, TASK_GROUPS_ANNOTATION
from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import racks, stays_unbound, told
from tests.cluster.session import PERMIT_WAIT_SECONDS

TIMEOUT = 3
assert TIMEOUT < PERMIT_WAIT_SECONDS  # so the event shows the annotation's wait, not the default
PLAIN = "every member is scheduled as a plain pod from now on"


def worker(
    kube: Kube, namespace: str, i: int, policy: str, *, scheduler: str = "default-scheduler"
) -> None:
    """Worker i of app `job` (3 workers, minMember 3); worker 0 declares groups and policy."""
    annotations = {TASK_GROUP_NAME_ANNOTATION: "worker"}
    if i == 0:
        groups = [{"name": "worker", "minMember": 3, "minResource": {"cpu": "1"}}]
        annotations[TASK_GROUPS_ANNOTATION] = json.dumps(groups)
        annotations[POLICY_ANNOTATION] = policy
    kube.create_pod(
        namespace,
        f"job-{i}",
        cpu="1",
        labels={"applicationId": "job"},
        annotations=annotations,
        scheduler=scheduler,
    )


def one_never_placed(kube: Kube, namespace: str, policy: str) -> None:
    """Workers 0 and 1 as usual, worker 2 named to a scheduler that does not run."""
    for i in range(2):
        worker(kube, namespace, i, policy)
    worker(kube, namespace, 2, policy, scheduler="no-such-scheduler")


def test_a_soft_gang_is_scheduled_as_plain_pods_after_its_placeholder_timeout(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        one_never_placed(
            kube, namespace, f"placeholderTimeoutInSeconds={TIMEOUT} gangSchedulingStyle=Soft"
        )
        event = wait_for(
            functools.partial(told, kube, namespace, PLAIN, "job-0"),
            60,
            "the timeout event saying the members go on as plain pods",
        )
        assert f"gang yunikorn:{namespace}/job timed out after waiting {TIMEOUT}s" in event
        bound = kube.wait_bound(namespace, "job-", 2)
        assert sorted(bound) == ["job-0", "job-1"]


def test_a_hard_gang_keeps_waiting_as_a_gang_after_its_placeholder_timeout(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        one_never_placed(
            kube, namespace, f"placeholderTimeoutInSeconds={TIMEOUT} gangSchedulingStyle=Hard"
        )
        timed_out = f"gang yunikorn:{namespace}/job timed out after waiting {TIMEOUT}s"
        event = wait_for(
            functools.partial(told, kube, namespace, timed_out, "job-0"),
            60,
            "the timeout event after the annotation's wait",
        )
        assert PLAIN not in event
        stays_unbound(kube, namespace, PERMIT_WAIT_SECONDS)
        # The missing member comes (recreated for a running scheduler): the gang lands whole.
        kube.core.delete_namespaced_pod("job-2", namespace, grace_period_seconds=0)
        wait_for(
            lambda: "job-2" not in {p.metadata.name for p in kube.pods(namespace)},
            30,
            "job-2 gone",
        )
        worker(kube, namespace, 2, "")
        assert sorted(kube.wait_bound(namespace, "job-", 3)) == ["job-0", "job-1", "job-2"]


def test_a_bad_policy_holds_the_gang_and_names_the_parameter(kube: Kube, namespace: str) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        for i in range(3):
            worker(kube, namespace, i, "placeholderTimeoutInSeconds=soon")
        for member in ("job-0", "job-2"):
            kube.wait_for_event(
                namespace,
                member,
                f"gang yunikorn:{namespace}/job: annotation {POLICY_ANNOTATION}: "
                "placeholderTimeoutInSeconds must be a whole number of seconds >= 0",
                what=f"{member}'s FailedScheduling naming the bad parameter",
            )
        stays_unbound(kube, namespace)
