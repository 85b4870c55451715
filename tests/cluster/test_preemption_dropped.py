"""A preemption kube-scheduler started and dropped (issue 49, found by the soak, seed 5).

kube-scheduler v1.37 deletes the victims of a preempt answer asynchronously:
it marks each with the condition DisruptionTarget, then deletes it. When a
write of that fails (in the soak, the API server restarting under it:
"Async Preemption finished completely ... result=error") it deletes nothing
and does not retry, and the member, parked as unschedulable, may not be
asked again for minutes while the gang's plan holds its room. The extender
evicts a victim it handed to kube-scheduler that is not being deleted
STALLED_SECONDS later (app/runtime/preemption/unasked.py, `follow`).

The failure is made, not hoped for: a ValidatingAdmissionPolicy refuses
kube-scheduler's write of that condition in the test's namespace (its user
only: the extender's eviction goes through), so its preemption fails every
time. Nodes: the session's 3 x 4 CPUs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kubernetes.client as k8s
import pytest

from hack.clusterkit import wait_for
from tests.cluster.kube import LOW, TOP, Kube
from tests.cluster.session import Extender
from tests.cluster.test_preemption import pinned_then_urgent, session_nodes

pytestmark = pytest.mark.usefixtures("priorities")

SCHEDULER_USER = "system:kube-scheduler"


@contextmanager
def scheduler_cannot_mark_victims(kube: Kube, namespace: str) -> Iterator[None]:
    """kube-scheduler's status write adding DisruptionTarget to a pod of `namespace` is
    refused while this lasts (a policy and its binding, both cluster-scoped, then gone)."""
    api: Any = k8s.AdmissionregistrationV1Api(kube.client)
    name = f"no-preemption-marks-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["pods/status"],
                    }
                ],
            },
            "matchConditions": [
                {
                    "name": "kube-scheduler",
                    "expression": f"request.userInfo.username == '{SCHEDULER_USER}'",
                }
            ],
            "validations": [
                {
                    "expression": "!has(object.status.conditions) || "
                    "!object.status.conditions.exists(c, c.type == 'DisruptionTarget')",
                    "message": "the test refuses kube-scheduler's preemption mark",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    api.create_validating_admission_policy(policy)
    api.create_validating_admission_policy_binding(binding)
    try:
        # The API server loads policies from its own watch: in force once it refuses.
        probe = kube.pod_body("mark-probe", cpu="10m", memory="1Mi")
        kube.core.create_namespaced_pod(namespace, probe)
        wait_for(lambda: _refused(kube, namespace, "mark-probe"), 30, "the policy in force")
        kube.core.delete_namespaced_pod("mark-probe", namespace, grace_period_seconds=0)
        yield
    finally:
        api.delete_validating_admission_policy_binding(name)
        api.delete_validating_admission_policy(name)


def _refused(kube: Kube, namespace: str, pod: str) -> bool:
    """Is kube-scheduler's mark on `pod` refused (a dry run, as kube-scheduler)?"""
    configuration = copy.copy(kube.client.configuration)
    as_scheduler: Any = k8s.ApiClient(configuration)
    as_scheduler.set_default_header("Impersonate-User", SCHEDULER_USER)
    as_scheduler.set_default_header("Impersonate-Group", "system:authenticated")
    mark = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    try:
        k8s.CoreV1Api(as_scheduler).patch_namespaced_pod_status(
            pod, namespace, {"status": {"conditions": [mark]}}, dry_run="All"
        )
    except k8s.exceptions.ApiException as error:
        if error.status == 422:
            return True
        raise
    return False


def test_a_victim_kube_scheduler_failed_to_delete_is_evicted_and_the_gang_placed(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    """node-1 runs a 4-CPU pod of low priority; node-2 and node-3 are full with pods of top
    priority. A gang of 2 x 2 CPUs of high priority preempts: its plan hands low-1 to
    kube-scheduler, whose mark is refused, so it deletes nothing. The extender evicts
    low-1 itself, the gang is placed on node-1, and nothing else is evicted."""
    schedulable = session_nodes(kube)
    node1, node2, node3 = schedulable
    pinned = [
        ("low-1", node1, "4", LOW),
        ("full-2", node2, "4", TOP),
        ("full-3", node3, "4", TOP),
    ]
    logged = len(extender.log())
    with scheduler_cannot_mark_victims(kube, namespace):
        members = pinned_then_urgent(kube, extender, namespace, pinned, cpu="2")
        placed = kube.wait_bound(namespace, "urgent-", 2)
    assert set(placed.values()) == {node1}, placed
    left = {p.metadata.name for p in kube.pods(namespace)}
    assert left == {"full-2", "full-3", *members}, left
    # The eviction was the extender's, after kube-scheduler's had failed; its Event names
    # the gang it made room for.
    assert "kube-scheduler did not delete the victim(s)" in extender.log()[logged:]
    assert kube.event_on(namespace, "low-1", "Preempted", "urgent"), kube.events(namespace, "low-1")
