from app.admission import Admission, DenyReason, FilterReason
from app.groups import GroupSpec
from app.resources import Resources


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def free(cpu: int) -> Resources:
    return {"cpu": cpu, "pods": 100_000}


def test_too_few_siblings_uses_the_seed_message() -> None:
    admission = Admission(3, clock=Clock())
    verdict = admission.check(GroupSpec("ns/nginx", 3), 2, lambda: free(0))
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

    verdict = admission.check(spec, 2, cluster_free)
    assert verdict.reason == FilterReason.MIN_RESOURCES
    assert "short by cpu 4" in verdict.message
    clock.now += 1
    verdict = admission.check(spec, 2, cluster_free)
    assert verdict.reason == FilterReason.DENIED
    assert verdict.message.startswith("pod with pgName: ns/big last failed in 3s, deny")
    assert "short by cpu 4" in verdict.message
    assert len(calls) == 1  # the denied cache answered without a resource scan
    clock.now += 3
    assert admission.check(spec, 2, lambda: free(10_000)).reason == FilterReason.ADMITTED


def test_permitted_cache_skips_the_resource_check_but_not_the_sibling_count() -> None:
    clock = Clock()
    admission = Admission(3, clock=clock)
    spec = GroupSpec("ns/g", 2, {"cpu": 1000})
    assert admission.check(spec, 2, lambda: free(1000)).reason == FilterReason.ADMITTED

    def must_not_scan() -> Resources:
        raise AssertionError("resources scanned despite the permitted cache")

    assert admission.check(spec, 2, must_not_scan).reason == FilterReason.PERMITTED
    assert admission.check(spec, 1, must_not_scan).reason == FilterReason.TOO_FEW_SIBLINGS
    clock.now += 3.5
    assert admission.check(spec, 2, lambda: free(0)).reason == FilterReason.MIN_RESOURCES


def test_denial_from_the_gate_overrides_a_permit() -> None:
    clock = Clock()
    admission = Admission(5, clock=clock)
    spec = GroupSpec("ns/g", 2)
    assert admission.check(spec, 2, lambda: free(0)).admitted
    admission.deny("ns/g", DenyReason.TIMEOUT, "gang ns/g timed out")
    verdict = admission.check(spec, 2, lambda: free(0))
    assert verdict.reason == FilterReason.DENIED and "gang ns/g timed out" in verdict.message
    admission.forget("ns/g")
    assert admission.check(spec, 2, lambda: free(0)).admitted
