"""Gang members without the member mark in the gang-only mode: reported once, on the pod."""

from __future__ import annotations

from typing import Any

from app.base.metrics import Metrics
from app.core.marking import member_patch
from app.core.observer import MemberRef
from app.core.resources import PREEMPTOR_RESOURCE
from app.core.state import ClusterState
from app.runtime.unmarked import UnmarkedMembers
from tests.unit.builders import pod
from tests.unit.test_marking import apply_patch


class Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def member_not_marked(self, member: MemberRef, group_key: str, message: str) -> None:
        self.seen.append((member.key, group_key, message))

    def preemptor_not_marked(self, pod: MemberRef, message: str) -> None:
        self.seen.append((pod.key, "", message))


def watched(
    scheduler_names: tuple[str, ...] = (), expect_marked_preemptors: bool = False
) -> tuple[ClusterState, Reports, Metrics]:
    state, reports, metrics = ClusterState(), Reports(), Metrics()
    listener = UnmarkedMembers(reports, metrics, scheduler_names, expect_marked_preemptors)
    state.add_pod_listener(listener.on_pod_change)
    return state, reports, metrics


def marked(raw: dict[str, Any]) -> dict[str, Any]:
    return apply_patch(raw, member_patch(raw))


def count(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("gang_extender_unmarked_members_total") or 0.0


def test_an_unmarked_pending_member_is_reported_once_with_what_to_do() -> None:
    state, reports, metrics = watched()
    raw = pod("w-0", group="train")
    state.apply_pod(raw)
    raw["metadata"]["resourceVersion"] = "2"
    raw["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    state.apply_pod(raw)  # an update of the same pod: not again
    assert [(key, group) for key, group, _ in reports.seen] == [("default/w-0", "default/train")]
    message = reports.seen[0][2]
    assert "gang-extender.dev/member" in message and "Delete the pod" in message
    assert count(metrics) == 1


def test_marked_members_plain_pods_bound_and_other_schedulers_pods_are_not_reported() -> None:
    state, reports, metrics = watched(("default-scheduler",))
    state.apply_pod(marked(pod("m-0", group="train")))
    state.apply_pod(pod("plain"))
    state.apply_pod(pod("old", group="train", node="n1", phase="Running"))
    other = pod("o-0", group="train")
    other["spec"]["schedulerName"] = "volcano"
    state.apply_pod(other)
    assert reports.seen == [] and count(metrics) == 0
    assert state.pods["default/m-0"].marked and not state.pods["default/plain"].marked


def preemptor(name: str, priority: int, **fields: Any) -> dict[str, Any]:
    raw = pod(name, **fields)
    raw["spec"]["priority"] = priority
    return raw


def test_with_marked_preemptors_an_unmarked_pending_preemptor_is_reported_once() -> None:
    state, reports, metrics = watched(expect_marked_preemptors=True)
    raw = preemptor("vip", 1000)
    state.apply_pod(raw)
    raw["metadata"]["resourceVersion"] = "2"
    # The policy runs in the API server for every namespace: a system pod too.
    state.apply_pod(preemptor("dns", 2000000000, namespace="kube-system"))
    state.apply_pod(raw)
    assert [key for key, _, _ in reports.seen] == ["default/vip", "kube-system/dns"]
    message = reports.seen[0][2]
    assert "gang-extender.dev/preemptor" in message and "priority 1000" in message
    assert "MutatingAdmissionPolicy" in message
    assert metrics.registry.get_sample_value("gang_extender_unmarked_preemptors_total") == 2
    assert count(metrics) == 0


def test_marked_low_priority_bound_and_unexpected_preemptors_are_not_reported() -> None:
    vip = preemptor("vip-marked", 1000)
    state, reports, metrics = watched(expect_marked_preemptors=True)
    state.apply_pod(apply_patch(vip, member_patch(vip, PREEMPTOR_RESOURCE)))
    state.apply_pod(preemptor("zero", 0))
    never = preemptor("polite", 1000)
    never["spec"]["preemptionPolicy"] = "Never"
    state.apply_pod(never)
    state.apply_pod(preemptor("bound", 1000, node="n1", phase="Running"))
    assert reports.seen == []
    # Without --expect-marked-preemptors nobody expects the mark.
    state, reports, metrics = watched()
    state.apply_pod(preemptor("vip", 1000))
    assert reports.seen == []
    assert metrics.registry.get_sample_value("gang_extender_unmarked_preemptors_total") == 0
