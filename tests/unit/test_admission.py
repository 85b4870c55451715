from app.admission import (
    ADMITTED,
    DENIED,
    MIN_RESOURCES,
    PERMITTED,
    TOO_FEW_SIBLINGS,
    Admission,
)
from app.groups import GroupSpec
from app.resources import Resources
from tests.unit.fakes import Clock


def free(cpu: int) -> Resources:
    return {"cpu": cpu, "pods": 100_000}


def test_too_few_siblings_uses_the_seed_message() -> None:
    admission = Admission(3, clock=Clock())
    verdict = admission.check(GroupSpec("ns/nginx", 3), 2, lambda: free(0))
    assert not verdict.admitted
    assert verdict.reason == TOO_FEW_SIBLINGS
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
    assert verdict.reason == MIN_RESOURCES
    assert "short by cpu 4" in verdict.message
    clock.now += 1
    verdict = admission.check(spec, 2, cluster_free)
    assert verdict.reason == DENIED
    assert verdict.message.startswith("pod with pgName: ns/big last failed in 3s, deny")
    assert "short by cpu 4" in verdict.message
    assert len(calls) == 1  # the denied cache answered without a resource scan
    clock.now += 3
    assert admission.check(spec, 2, lambda: free(10_000)).reason == ADMITTED


def test_permitted_cache_skips_the_resource_check_but_not_the_sibling_count() -> None:
    clock = Clock()
    admission = Admission(3, clock=clock)
    spec = GroupSpec("ns/g", 2, {"cpu": 1000})
    assert admission.check(spec, 2, lambda: free(1000)).reason == ADMITTED

    def must_not_scan() -> Resources:
        raise AssertionError("resources scanned despite the permitted cache")

    assert admission.check(spec, 2, must_not_scan).reason == PERMITTED
    assert admission.check(spec, 1, must_not_scan).reason == TOO_FEW_SIBLINGS
    clock.now += 3.5
    assert admission.check(spec, 2, lambda: free(0)).reason == MIN_RESOURCES


def test_denial_from_the_gate_overrides_a_permit() -> None:
    clock = Clock()
    admission = Admission(5, clock=clock)
    spec = GroupSpec("ns/g", 2)
    assert admission.check(spec, 2, lambda: free(0)).admitted
    admission.deny("ns/g", "timeout", "gang ns/g timed out")
    verdict = admission.check(spec, 2, lambda: free(0))
    assert verdict.reason == DENIED and "gang ns/g timed out" in verdict.message
    admission.forget("ns/g")
    assert admission.check(spec, 2, lambda: free(0)).admitted
