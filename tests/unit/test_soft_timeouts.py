"""YuniKorn's schedulingPolicyParameters: the gang's timeout, and Soft gangs turning plain."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission, FilterReason, wholeness
from app.core.groups import GroupSpec, PodGroupSpecError
from app.core.soft_timeouts import SoftTimeouts
from app.core.yunikorn import (
    POLICY_ANNOTATION,
    TASK_GROUP_NAME_ANNOTATION,
    TASK_GROUPS_ANNOTATION,
    SchedulingPolicy,
    TaskGroupsError,
    scheduling_policy,
)
from app.runtime.gate import PermitGate
from app.runtime.waiting_room import GateError
from tests.unit.builders import cluster, pod
from tests.unit.fakes import Clock, RecordingBinder, gauge
from tests.unit.test_arbiter import World as ArbiterWorld

GROUPS = json.dumps([{"name": "worker", "minMember": 2, "minResource": {"cpu": "1"}}])


def yk_pod(name: str, *, policy: str | None = None, declares: bool = True) -> dict[str, Any]:
    raw = pod(name, namespace="ml")
    raw["metadata"]["labels"]["applicationId"] = "etl"
    annotations = {TASK_GROUP_NAME_ANNOTATION: "worker"}
    if declares:
        annotations[TASK_GROUPS_ANNOTATION] = GROUPS
    if policy is not None:
        annotations[POLICY_ANNOTATION] = policy
    raw["metadata"]["annotations"] = annotations
    return raw


# ---- reading the annotation ----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "policy"),
    [
        (None, SchedulingPolicy(0, soft=True)),
        ("", SchedulingPolicy(0, soft=True)),
        ("placeholderTimeoutInSeconds=60 gangSchedulingStyle=Hard", SchedulingPolicy(60, False)),
        ("gangSchedulingStyle=Soft  placeholderTimeoutInSeconds=0", SchedulingPolicy(0, True)),
        ("placeholderTimeoutInSeconds=5 placeholderTimeoutInSeconds=9", SchedulingPolicy(9, True)),
    ],
)
def test_the_policy_is_read_as_yunikorn_reads_it(raw: str | None, policy: SchedulingPolicy) -> None:
    assert scheduling_policy(raw) == policy


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("placeholderTimeoutInSeconds", "is not key=value"),
        ("placeholderTimeoutInSeconds=a=b", "is not key=value"),
        ("placeholderTimeoutInSeconds=-5", "must be a whole number of seconds >= 0"),
        ("placeholderTimeoutInSeconds=1.5", "got '1.5'"),
        ("gangSchedulingStyle=hard", "must be Soft or Hard (case matters"),
        # The name YuniKorn's own Spark example uses, which its code does not read.
        ("placeholderTimeoutSeconds=60", "unknown parameter 'placeholderTimeoutSeconds'"),
    ],
)
def test_a_bad_policy_says_what_is_wrong(raw: str, words: str) -> None:
    with pytest.raises(TaskGroupsError, match=POLICY_ANNOTATION) as err:
        scheduling_policy(raw)
    assert words in str(err.value)


def test_the_gang_takes_timeout_and_style_from_its_declaring_pod() -> None:
    state = cluster()
    state.apply_pod(yk_pod("w0", policy="placeholderTimeoutInSeconds=30 gangSchedulingStyle=Hard"))
    # A later pod's own parameters do not count (YuniKorn reads the first pod's).
    state.apply_pod(yk_pod("w1", policy="gangSchedulingStyle=Soft", declares=False))
    ref = state.members("yunikorn:ml/etl")[1].group
    assert ref is not None
    spec = state.group_spec(ref)
    assert (spec.schedule_timeout_seconds, spec.plain_after_timeout) == (30, False)


def test_without_the_annotation_a_gang_is_soft_with_the_default_wait() -> None:
    state = cluster()
    state.apply_pod(yk_pod("w0"))
    ref = state.members("yunikorn:ml/etl")[0].group
    assert ref is not None
    spec = state.group_spec(ref)
    assert (spec.schedule_timeout_seconds, spec.plain_after_timeout) == (None, True)


def test_a_bad_policy_on_the_declaring_pod_holds_every_member_with_the_message() -> None:
    state = cluster()
    state.apply_pod(yk_pod("w0", policy="gangSchedulingStyle=Strict"))
    state.apply_pod(yk_pod("w1", declares=False))
    for member in state.members("yunikorn:ml/etl"):
        assert member.group is not None
        with pytest.raises(PodGroupSpecError, match="gangSchedulingStyle must be Soft or Hard"):
            state.group_spec(member.group)


# ---- the clocks ----------------------------------------------------------------------


def test_a_gangs_clock_runs_from_its_first_member_until_it_is_bound() -> None:
    clock = Clock()
    soft = SoftTimeouts(clock)
    soft.start("g")
    clock.now += 30
    soft.start("g")  # a later member does not restart it
    assert soft.due("g", 30) and not soft.due("g", 31)
    soft.stop("g")
    assert not soft.due("g", 0) and not soft.tracks("g")
    soft.start("g")
    soft.fall_back("g")
    assert soft.is_plain("g") and not soft.due("g", 0)
    soft.forget("g")
    assert not soft.is_plain("g") and not soft.tracks("g")


# ---- the gate -------------------------------------------------------------------------


def gate_for(spec: GroupSpec) -> tuple[Admission, PermitGate, Metrics, Any]:
    state = cluster(3)
    admission = Admission(3)
    metrics = Metrics()
    gate = PermitGate(state, admission, RecordingBinder(), metrics)
    state.add_pod_listener(gate.on_pod_change)
    return admission, gate, metrics, state


async def wait_out(gate: PermitGate, state: Any, spec: GroupSpec, seconds: float) -> str:
    """Two members of three wait `seconds` in the gate; the message they are released with."""
    waits = [gate.admit(state.pods[f"default/p{i}"], "n1", spec, seconds) for i in range(2)]
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(r, GateError) for r in results)
    return str(results[0])


async def test_a_soft_gang_whose_timeout_ran_out_turns_plain_and_is_not_denied() -> None:
    spec = GroupSpec("default/g", 3, schedule_timeout_seconds=None, plain_after_timeout=True)
    admission, gate, metrics, state = gate_for(spec)
    message = await wait_out(gate, state, spec, 0.05)
    assert "timed out after waiting 0.05s" in message
    assert "every member is scheduled as a plain pod from now on" in message
    assert admission.soft.is_plain("default/g")
    assert admission.check(spec, wholeness(spec, 3), dict).reason is FilterReason.ADMITTED
    assert gauge(metrics, "gang_extender_gang_admissions_total", {"result": "timeout"}) == 1
    # The gang's pods all gone: a new run under the same name is a gang again.
    for i in range(3):
        state.delete_pod("default", f"p{i}")
    assert not admission.soft.is_plain("default/g")


async def test_a_hard_gang_stays_a_gang_after_its_timeout() -> None:
    spec = GroupSpec("default/g", 3, schedule_timeout_seconds=1, plain_after_timeout=False)
    admission, gate, _, state = gate_for(spec)
    message = await wait_out(gate, state, spec, 0.05)
    assert "plain pod" not in message
    assert not admission.soft.is_plain("default/g")
    assert admission.check(spec, wholeness(spec, 3), dict).reason is FilterReason.DENIED


async def test_a_soft_timeout_longer_than_one_wait_spans_the_gates_retries() -> None:
    """YuniKorn's timeout may exceed a gate wait (capped): the first wait ends as a plain
    timeout (denied, retried), the clock keeps running, a later wait past it falls back."""
    spec = GroupSpec("default/g", 3, schedule_timeout_seconds=1, plain_after_timeout=True)
    admission, gate, _, state = gate_for(spec)
    first = await wait_out(gate, state, spec, 0.05)
    assert "plain pod" not in first and not admission.soft.is_plain("default/g")
    await asyncio.sleep(0.9)
    admission.forget("default/g")  # the denial expired
    second = await wait_out(gate, state, spec, 0.1)
    assert "plain pod from now on" in second and admission.soft.is_plain("default/g")


async def test_a_bound_soft_gang_stops_its_clock() -> None:
    spec = GroupSpec("default/g", 2, schedule_timeout_seconds=1, plain_after_timeout=True)
    admission, gate, _, state = gate_for(spec)
    await asyncio.gather(*(gate.admit(state.pods[f"default/p{i}"], "n1", spec, 5) for i in (0, 1)))
    assert not admission.soft.tracks("default/g")


@pytest.mark.parametrize("soft", [True, False])
async def test_a_gang_turned_plain_leaves_the_line_a_hard_one_keeps_its_place(soft: bool) -> None:
    """A claim released at the timeout puts a gang back in line; a Soft gang whose members
    are now plain pods must not stay there (no member asks for it, and aged it would hold
    every gang behind it)."""
    world = ArbiterWorld()
    a = dataclasses.replace(world.gang("a", 3, "1"), plain_after_timeout=soft)
    assert world.filter(a, "a-0").reason is FilterReason.CLAIMED
    world.clock.now += 1  # the gang's clock (the fake one) ran out by the time the wait ends
    with pytest.raises(GateError):
        await world.gate.admit(world.state.pods["default/a-0"], "n0", a, 0.01)
    assert list(world.arbiter.waiting) == ([] if soft else ["default/a"])
