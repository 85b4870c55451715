"""The gang-only mode, the local cluster's default: kube-scheduler calls us for gang members only.

The session cluster runs deploy/scheduler-config.yaml (one extender entry
for filter, prioritize, preempt and bind with managedResources
gang-extender.dev/member, one for preempt with gang-extender.dev/preemptor)
and deploy/webhook.yaml (the MutatingWebhookConfiguration pointing at the
session extender, the ValidatingAdmissionPolicy refusing unmarked members,
and the MutatingAdmissionPolicy marking plain pods that may preempt). What is asserted is
what the API server shows, plus the extender's own verb counters.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from app.core.groups import (
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_COUNT_ANNOTATION,
    LIGHT_MIN_AVAILABLE_LABEL,
    LIGHT_NAME_LABEL,
)
from app.core.marking import refusal_message
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE
from bench import e2e
from hack.clusterkit import wait_for
from tests.cluster.bench_runner import bench_runner
from tests.cluster.kube import HIGH, Kube
from tests.cluster.session import GANG_ONLY, Extender
from tests.cluster.test_preemption import assert_stays, fill_node3_and_start_low_gang
from tests.packaging.helm import kube_bin

pytestmark = pytest.mark.skipif(not GANG_ONLY, reason="the session cluster runs every-verb")

VERBS = ("filter", "prioritize", "preempt", "bind")
POLICY = "gang-extender-member-mark"


def verb_calls(extender: Extender) -> dict[str, float]:
    """Verb calls the extender answered so far, by verb (every status code)."""
    samples = extender.metrics()
    calls = dict.fromkeys(VERBS, 0.0)
    for (name, labels), value in samples.items():
        if name == "gang_extender_requests_total":
            verb = dict(labels).get("verb", "")
            if verb in calls:
                calls[verb] += value
    return calls


def marked(pod: Any) -> bool:
    return any(
        MEMBER_RESOURCE in (c.resources.requests or {})
        and MEMBER_RESOURCE in (c.resources.limits or {})
        for c in pod.spec.containers
    )


class NeverPartlyBound:
    """Samples the namespace every 0.2 s: bound members are 0 or at least min_member.

    (A list can land between the bindings of one admission, made at once; a
    partial state fails when it lasts 2 s or more, as in test_faults.py.)
    """

    def __init__(self, kube: Kube, namespace: str, min_member: int, prefix: str = "") -> None:
        self.kube, self.namespace, self.min_member = kube, namespace, min_member
        self.prefix = prefix
        self.stop = threading.Event()
        self.partial_since: float | None = None
        self.worst: float = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            bound = self.count()
            now = time.monotonic()
            if 0 < bound < self.min_member:
                self.partial_since = self.partial_since or now
                self.worst = max(self.worst, now - self.partial_since)
            else:
                self.partial_since = None

    def count(self) -> int:
        """Bound members (pods whose name starts with the prefix)."""
        return sum(1 for name in self.kube.bound(self.namespace) if name.startswith(self.prefix))

    def __enter__(self) -> NeverPartlyBound:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()
        assert self.worst < 2, f"gang partly bound for {self.worst:.1f}s"
        bound = self.count()
        assert bound == 0 or bound >= self.min_member, f"gang partly bound at the end: {bound}"


def member_kwargs(source: str, kube: Kube, namespace: str, size: int) -> dict[str, Any]:
    """Create the group object of `source`; the pod fields that name it."""
    if source == "x-k8s":
        kube.create_podgroup(namespace, "g", size)
        return {"group": "g"}
    if source == "volcano":
        kube.create_volcano_podgroup(namespace, "g", size)
        return {"annotations": {"scheduling.k8s.io/group-name": "g"}}
    if source == "native":
        kube.create_native_podgroup(namespace, "g", size)
        return {"scheduling_group": "g"}
    if source == "kueue":
        return {
            "labels": {KUEUE_GROUP_LABEL: "g"},
            "annotations": {KUEUE_TOTAL_COUNT_ANNOTATION: str(size)},
        }
    return {"labels": {LIGHT_NAME_LABEL: "g", LIGHT_MIN_AVAILABLE_LABEL: str(size)}}


@pytest.mark.parametrize("source", ["x-k8s", "volcano", "native", "labels", "kueue"])
def test_every_source_is_marked_and_placed_all_or_nothing(
    kube: Kube, namespace: str, extender: Extender, source: str
) -> None:
    size = 3
    fields = member_kwargs(source, kube, namespace, size)
    before = extender.sample("gang_extender_webhook_reviews_total", result="marked")
    with NeverPartlyBound(kube, namespace, size):
        for i in range(size - 1):
            kube.create_pod(namespace, f"m-{i}", cpu="1", **fields)
        # The real kube-apiserver called the webhook: the stored pods carry the mark.
        pods = kube.pods(namespace)
        assert len(pods) == size - 1 and all(marked(p) for p in pods), [
            p.spec.containers[0].resources for p in pods
        ]
        # They reached our filter (gang-only: only marked pods do), which says why they wait.
        wait_for(
            lambda: all(
                any("sibling" in e for e in kube.events(namespace, f"m-{i}"))
                for i in range(size - 1)
            ),
            30,
            "the sibling message on the first members",
        )
        assert kube.bound(namespace) == {}
        kube.create_pod(namespace, f"m-{size - 1}", cpu="1", **fields)
        wait_for(lambda: len(kube.bound(namespace)) == size, 30, "the whole gang bound")
    assert extender.sample("gang_extender_webhook_reviews_total", result="marked") >= before + size


def test_a_plain_pod_is_bound_by_kube_scheduler_without_a_call_to_the_extender(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    before = verb_calls(extender)
    for i in range(5):
        kube.create_pod(namespace, f"plain-{i}", cpu="100m")
    wait_for(lambda: len(kube.bound(namespace)) == 5, 30, "the plain pods bound")
    assert not any(marked(p) for p in kube.pods(namespace))
    # Give a late call (if any) the time to be counted.
    time.sleep(1)
    assert verb_calls(extender) == before
    # Bound by kube-scheduler's own binder: its Scheduled event, no extender in between.
    assert any(e.startswith("Scheduled:") for e in kube.events(namespace, "plain-0"))


@pytest.mark.usefixtures("priorities")
def test_a_plain_high_priority_pod_still_cannot_break_a_running_gang(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    fill_node3_and_start_low_gang(kube, namespace, "batch")
    members = {n for n in kube.bound(namespace) if n.startswith("batch-")}
    preempts = verb_calls(extender)["preempt"]
    # Fits nowhere: kube-scheduler preempts, and asks the preempt-only entry first,
    # which is interested in it through the mark the API server's policy gave it.
    kube.create_pod(namespace, "vip-1", cpu="2", priority_class=HIGH)
    vip = kube.core.read_namespaced_pod("vip-1", namespace)
    assert PREEMPTOR_RESOURCE in (vip.spec.containers[0].resources.requests or {})
    wait_for(lambda: kube.bound(namespace).get("vip-1"), 60, "vip-1 bound by preemption")
    assert verb_calls(extender)["preempt"] > preempts
    left = {n for n in kube.bound(namespace) if n.startswith("batch-")}
    assert len(left) == 3 and left < members
    kube.create_pod(namespace, "vip-2", cpu="2", priority_class=HIGH)
    # A second eviction would leave the gang below minMember: it must not happen.
    assert_stays(kube, namespace, left, 15)
    assert "vip-2" not in kube.bound(namespace)


def apiserver_denials(kubeconfig: str) -> float:
    """kube-apiserver's count of pods our policy refused (its own /metrics)."""
    out = subprocess.run(
        [str(kube_bin() / "kubectl"), "--kubeconfig", kubeconfig, "get", "--raw", "/metrics"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = 0.0
    for line in out.splitlines():
        if line.startswith("apiserver_validating_admission_policy_check_total{") and (
            f'policy="{POLICY}"' in line and 'enforcement_action="deny"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def webhook_down(extender: Extender) -> Iterator[None]:
    extender.stop()
    try:
        yield
    finally:
        if extender.process is None:
            extender.start(*extender.extra_args)


def test_a_member_created_with_the_webhook_down_is_refused_never_bound_alone(
    kube: Kube, namespace: str, kubeconfig: str, extender: Extender, webhook_down: None
) -> None:
    denials = apiserver_denials(kubeconfig)
    # A bare pod: the API server refuses it and says what to fix.
    with pytest.raises(k8s.ApiException) as refused:
        kube.create_pod(namespace, "lonely", group="g")
    assert refused.value.status in (403, 422)
    assert refusal_message() in str(refused.value.body)
    # A plain pod is not held up by the webhook being down (failurePolicy Ignore).
    kube.create_pod(namespace, "plain", cpu="100m")
    # A controller's members: refused too; the ReplicaSet reports it and retries.
    labels = {LIGHT_NAME_LABEL: "web", LIGHT_MIN_AVAILABLE_LABEL: "2"}
    with NeverPartlyBound(kube, namespace, 2, prefix="web-"):
        kube.create_deployment(namespace, "web", 2, labels=labels)

        def failed_create() -> bool:
            return any(
                e.startswith("FailedCreate:") and refusal_message() in e
                for e in kube.events(namespace)
            )

        wait_for(failed_create, 30, "the ReplicaSet's FailedCreate event with our message")
        assert {p.metadata.name for p in kube.pods(namespace)} == {"plain"}
        assert apiserver_denials(kubeconfig) >= denials + 2
        # Back up: the controller's retry is marked and the gang is placed whole.
        extender.start(*extender.extra_args)
        wait_for(
            lambda: sum(1 for n in kube.bound(namespace) if n.startswith("web-")) == 2,
            90,
            "the Deployment's gang bound once the webhook answers",
        )
    web = [p for p in kube.pods(namespace) if p.metadata.name.startswith("web-")]
    assert all(marked(p) for p in web)
    assert "plain" in kube.bound(namespace)


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [str(kube_bin() / "kubectl"), "--kubeconfig", kubeconfig, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture
def no_member_policy(kubeconfig: str) -> Iterator[None]:
    """The policy's binding removed (a cluster that installed the webhook only), then restored."""
    saved = json.loads(
        kubectl(kubeconfig, "get", "validatingadmissionpolicybinding", POLICY, "-o", "json")
    )
    kubectl(kubeconfig, "delete", "validatingadmissionpolicybinding", POLICY)
    try:
        yield
    finally:
        meta = saved["metadata"]
        saved["metadata"] = {"name": meta["name"], "labels": meta.get("labels") or {}}
        kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(saved))


def test_an_unmarked_member_the_policy_let_through_gets_an_event_and_is_counted(
    kube: Kube,
    namespace: str,
    extender: Extender,
    webhook_down: None,
    no_member_policy: None,
) -> None:
    def created() -> bool:
        # Until kube-apiserver's policy cache drops the binding, the pod is refused.
        try:
            # More CPU than any node has: kube-scheduler cannot bind it alone meanwhile.
            kube.create_pod(namespace, "stray", group="g", cpu="500")
        except k8s.ApiException as err:
            assert refusal_message() in str(err.body), err.body
            return False
        return True

    wait_for(created, 30, "an unmarked member admitted without the policy")
    assert not marked(kube.pods(namespace)[0])
    extender.start(*extender.extra_args)
    kube.wait_for_event(
        namespace,
        "stray",
        "GangMemberNotMarked:",
        "Delete the pod",
        what="the extender's Warning Event on the unmarked member",
    )
    assert extender.sample("gang_extender_unmarked_members_total") == 1
    assert kube.bound(namespace) == {}


def test_bench_gang_only_cases_place_every_pod_and_plain_pods_call_no_verb(
    kubeconfig: str, extender: Extender
) -> None:
    """bench/e2e.py's (g), (h), (p) and (q), small: what `make bench` measures for this mode."""
    runner = bench_runner(kubeconfig, "bench-smoke-gang-only", extender)
    before = verb_calls(extender)
    plain = runner.run_case(e2e.CASES["g"], 6, 3, "-smoke")
    # Plain pods: kube-scheduler called none of our verbs.
    assert verb_calls(extender) == before
    gangs = runner.run_case(e2e.CASES["h"], e2e.GANG_SIZE, 3, "-smoke")
    # Bind calls are answered (and counted) a moment after the API server shows the pods bound.
    after = wait_for(
        lambda: (calls := verb_calls(extender))["bind"] >= before["bind"] + gangs.bound and calls,
        30,
        "the gang's bind calls answered",
    )
    assert after["filter"] >= before["filter"] + e2e.GANG_SIZE
    # The same with the preempt entry scoped to marked preemptors (p, q).
    plain_p = runner.run_case(e2e.CASES["p"], 6, 3, "-smoke")
    assert verb_calls(extender) == after
    gangs_q = runner.run_case(e2e.CASES["q"], e2e.GANG_SIZE, 3, "-smoke")
    wait_for(
        lambda: verb_calls(extender)["bind"] >= after["bind"] + gangs_q.bound,
        30,
        "the gang's bind calls answered",
    )
    for result in (plain, gangs, plain_p, gangs_q):
        assert result.bound == result.pods, result
        assert result.pods_per_second > 0


def test_a_plain_pod_cannot_join_a_group_later_members_stay_updatable(
    kube: Kube, namespace: str
) -> None:
    """Container resources are immutable, so the webhook could not mark a pod that
    becomes a member by a later label: the policy refuses that update instead."""
    kube.create_pod(namespace, "plain", cpu="100m")
    with pytest.raises(k8s.ApiException) as refused:
        kube.core.patch_namespaced_pod(
            "plain", namespace, {"metadata": {"labels": {LIGHT_NAME_LABEL: "g"}}}
        )
    assert refusal_message() in str(refused.value.body)
    kube.create_pod(namespace, "member", group="g")
    kube.core.patch_namespaced_pod("member", namespace, {"metadata": {"labels": {"x": "y"}}})
    assert kube.core.read_namespaced_pod("member", namespace).metadata.labels["x"] == "y"
