from app.core.admission import (
    Admission,
    DenyReason,
    FilterReason,
    PermitVerdict,
    WaitPolicy,
    permit,
    wholeness,
)
from app.core.groups import GroupSpec
from app.core.resources import Resources
from tests.unit.fakes import Clock


def free(cpu: int) -> Resources:
    return {"cpu": cpu, "pods": 100_000}


def test_too_few_siblings_uses_the_seed_message() -> None:
    admission = Admission(3, clock=Clock())
    verdict = admission.check(
        GroupSpec("ns/nginx", 3), wholeness(GroupSpec("ns/nginx", 3), 2), lambda: free(0)
    )
    assert not verdict.admitted
    assert verdict.reason == FilterReason.TOO_FEW_SIBLINGS
    assert (
        "cannot find enough sibling pods, current pods number: 2, minMember of group: 3"
        in verdict.message
    )


def test_min_resources_gap_denies_the_group_for_the_ttl() -> None:
    clock = Clock()
    admission = Admission(3, clock=clock)
    spec = GroupSpec("ns/big", 2, {"cpu": 10_000})
    calls: list[int] = []

    def cluster_free() -> Resources:
        calls.append(1)
        return free(6000)

    verdict = admission.check(spec, wholeness(spec, 2), cluster_free)
    assert verdict.reason == FilterReason.MIN_RESOURCES
    assert "short by cpu 4" in verdict.message
    clock.now += 1
    verdict = admission.check(spec, wholeness(spec, 2), cluster_free)
    assert verdict.reason == FilterReason.DENIED
    assert verdict.message.startswith("pod with pgName: ns/big last failed in 3s, deny")
    assert "short by cpu 4" in verdict.message
    assert len(calls) == 1  # the denied cache answered without a resource scan
    clock.now += 3
    assert (
        admission.check(spec, wholeness(spec, 2), lambda: free(10_000)).reason
        == FilterReason.ADMITTED
    )


def test_permitted_cache_skips_the_resource_check_but_not_the_sibling_count() -> None:
    clock = Clock()
    admission = Admission(3, clock=clock)
    spec = GroupSpec("ns/g", 2, {"cpu": 1000})
    assert (
        admission.check(spec, wholeness(spec, 2), lambda: free(1000)).reason
        == FilterReason.ADMITTED
    )

    def must_not_scan() -> Resources:
        raise AssertionError("resources scanned despite the permitted cache")

    assert admission.check(spec, wholeness(spec, 2), must_not_scan).reason == FilterReason.PERMITTED
    assert (
        admission.check(spec, wholeness(spec, 1), must_not_scan).reason
        == FilterReason.TOO_FEW_SIBLINGS
    )
    clock.now += 3.5
    assert (
        admission.check(spec, wholeness(spec, 2), lambda: free(0)).reason
        == FilterReason.MIN_RESOURCES
    )


def test_denial_from_the_gate_overrides_a_permit() -> None:
    clock = Clock()
    admission = Admission(5, clock=clock)
    spec = GroupSpec("ns/g", 2)
    assert admission.check(spec, wholeness(spec, 2), lambda: free(0)).admitted
    admission.deny("ns/g", DenyReason.TIMEOUT, "gang ns/g timed out")
    verdict = admission.check(spec, wholeness(spec, 2), lambda: free(0))
    assert verdict.reason == FilterReason.DENIED and "gang ns/g timed out" in verdict.message
    admission.forget("ns/g")
    assert admission.check(spec, wholeness(spec, 2), lambda: free(0)).admitted


# ---- the gang rule -------------------------------------------------------------------

VOLCANO = GroupSpec("volcano/ns/job", 4, min_task_member=(("ps", 1), ("worker", 2)))


def test_wholeness_counts_members_against_min_member() -> None:
    spec = GroupSpec("ns/g", 3)
    assert wholeness(spec, 2) == PermitVerdict(present=2, min_member=3)
    assert wholeness(spec, 2).missing == 1 and not wholeness(spec, 2).whole
    assert wholeness(spec, 3).missing == 0 and wholeness(spec, 3).whole
    # Extra members beyond minMember: nothing missing, never a negative count.
    assert wholeness(spec, 5).missing == 0 and wholeness(spec, 5).whole
    assert wholeness(spec, 0).missing == 3


def test_wholeness_reads_tasks_only_for_per_task_minimums() -> None:
    def must_not_read() -> list[str]:
        raise AssertionError("tasks read for a group without minTaskMember")

    assert wholeness(GroupSpec("ns/g", 2), 2, must_not_read).whole


def test_wholeness_needs_every_task_minimum_as_well() -> None:
    enough = ["ps", "worker", "worker", "worker"]
    assert wholeness(VOLCANO, 4, lambda: enough).whole
    short = wholeness(VOLCANO, 4, lambda: ["ps", "ps", "worker", "evaluator"])
    assert short.missing == 0 and not short.whole
    assert short.task_gap == (("worker", 1, 2),)
    none = wholeness(VOLCANO, 0, list)
    assert none.task_gap == (("ps", 0, 1), ("worker", 0, 2)) and none.missing == 4


def test_permit_counts_bound_binding_and_waiting_members() -> None:
    spec = GroupSpec("ns/g", 4)
    verdict = permit(spec, {"ns/a": ""}, {"ns/b": ""}, {"ns/c": "", "ns/d": ""})
    assert verdict.whole and verdict.present == 4
    waiting = permit(spec, {"ns/a": ""}, {}, {"ns/c": "", "ns/d": ""})
    assert not waiting.whole and waiting.missing == 1
    assert permit(spec, {}, {}, {}).missing == 4


def test_permit_counts_a_member_once_whatever_it_is_doing() -> None:
    # The watch echoed a binding still in flight: the pod is bound and binding.
    spec = GroupSpec("ns/g", 3)
    verdict = permit(spec, {"ns/a": "", "ns/b": ""}, {"ns/a": "", "ns/b": ""}, {})
    assert verdict.present == 2 and verdict.missing == 1


def test_permit_applies_volcano_task_minimums_to_the_counted_members() -> None:
    bound = {"ns/ps": "ps", "ns/w1": "worker"}
    assert permit(VOLCANO, bound, {}, {"ns/w2": "worker", "ns/w3": "worker"}).whole
    # Four members, but the second worker is still missing.
    verdict = permit(VOLCANO, bound, {"ns/ps2": "ps"}, {"ns/x": ""})
    assert verdict.missing == 0 and verdict.task_gap == (("worker", 1, 2),)
    assert not verdict.whole


def test_wait_policy_prefers_the_group_timeout_capped_by_the_maximum() -> None:
    policy = WaitPolicy(60, 80)
    assert policy.for_group(GroupSpec("ns/g", 2)) == 60
    assert policy.for_group(GroupSpec("ns/g", 2, schedule_timeout_seconds=30)) == 30
    assert policy.for_group(GroupSpec("ns/g", 2, schedule_timeout_seconds=300)) == 80


def test_reasons_keep_their_metric_label_values() -> None:
    # Metric labels, log fields and dashboards match these strings.
    assert [str(r) for r in FilterReason] == [
        "admitted",
        "permitted",
        "denied",
        "too-few-siblings",
        "min-resources",
        "bad-group",
        "no-group",
        "claimed",
        "holding",
        "complete",
        "waiting-behind",
        "insufficient-capacity",
        "queue-share",
    ]
    assert [str(r) for r in DenyReason] == ["min-resources", "timeout", "bind-failed", "capacity"]
