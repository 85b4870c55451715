"""--on-partial-bind: a binding refused after the gate opened never leaves a silent partial gang.

The real API server refusing a binding (a ValidatingAdmissionPolicy on
pods/binding) is exercised in tests/cluster/test_faults.py; here the
decision itself, with both policies and every count that matters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission, FilterReason, wholeness
from app.core.groups import GroupSpec
from app.core.observer import MemberRef, NullObserver
from app.core.state import ClusterState
from app.kube.errors import NotFound, Rejected, Transient
from app.runtime.gate import PermitGate
from app.runtime.gate_settings import GateLinks, GatePolicy, PartialBindPolicy
from app.runtime.waiting_room import GateError
from tests.unit.builders import cluster
from tests.unit.fakes import RecordingBinder, gauge

REFUSED = Rejected("API server answered 403: binding denied by policy")


class RecordingDeleter:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []
        self.fail: set[str] = set()

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        if name in self.fail:
            raise Transient("API server unreachable")
        self.deleted.append((name, uid))


class PartlyBound(NullObserver):
    def __init__(self) -> None:
        self.reports: list[tuple[str, list[str], str, bool]] = []

    def gang_partly_bound(
        self, group_key: str, bound: Sequence[MemberRef], message: str, rolled_back: bool
    ) -> None:
        self.reports.append((group_key, sorted(m.name for m in bound), message, rolled_back))


def setup(
    members: int, policy: PartialBindPolicy
) -> tuple[ClusterState, Admission, RecordingBinder, RecordingDeleter, PartlyBound, PermitGate]:
    state = cluster(members)
    admission = Admission(3)
    binder = RecordingBinder()
    deleter = RecordingDeleter()
    observer = PartlyBound()
    gate = PermitGate(
        state,
        admission,
        binder,
        Metrics(),
        GateLinks(observer=observer, deleter=deleter),
        GatePolicy(partial_bind=policy),
    )
    state.add_pod_listener(gate.on_pod_change)
    return state, admission, binder, deleter, observer, gate


async def admit_all(
    state: ClusterState, gate: PermitGate, names: list[str], min_member: int
) -> list[BaseException | None]:
    spec = GroupSpec("default/g", min_member)
    return await asyncio.gather(
        *(gate.admit(state.pods[f"default/{n}"], "n1", spec, 30) for n in names),
        return_exceptions=True,
    )


async def test_delete_bound_deletes_what_the_admission_bound_and_denies_the_gang() -> None:
    state, admission, binder, deleter, observer, gate = setup(3, PartialBindPolicy.DELETE_BOUND)
    binder.fail["p2"] = REFUSED
    results = await admit_all(state, gate, ["p0", "p1", "p2"], 3)
    await gate.drain()
    # The refused member's bind call fails with the whole story; the others were bound.
    assert results[:2] == [None, None]
    error = results[2]
    assert isinstance(error, GateError)
    assert "binding pod default/p2 to n1 failed: API server answered 403" in str(error)
    assert "members bound by this admission (p0, p1) are deleted" in str(error)
    assert "--on-partial-bind=delete-bound" in str(error)
    assert sorted(deleter.deleted) == [("p0", "uid-default-p0"), ("p1", "uid-default-p1")]
    assert observer.reports == [("default/g", ["p0", "p1"], observer.reports[0][2], True)]
    # Retried whole after the denial, not member by member.
    assert (
        admission.check(
            GroupSpec("default/g", 3), wholeness(GroupSpec("default/g", 3), 3), dict
        ).reason
        == FilterReason.DENIED
    )
    assert (
        gauge(gate._metrics, "gang_extender_gang_admissions_total", {"result": "rolled-back"}) == 1
    )


async def test_leave_keeps_the_bound_members_and_says_so() -> None:
    state, admission, binder, deleter, observer, gate = setup(3, PartialBindPolicy.LEAVE)
    binder.fail["p2"] = REFUSED
    results = await admit_all(state, gate, ["p0", "p1", "p2"], 3)
    await gate.drain()
    assert "2 of minMember 3 members stay bound (p0, p1) because --on-partial-bind=leave" in str(
        results[2]
    )
    assert deleter.deleted == []
    assert [(k, names, rolled) for k, names, _, rolled in observer.reports] == [
        ("default/g", ["p0", "p1"], False)
    ]
    # The failed member joins its bound siblings at once on the retry.
    del binder.fail["p2"]
    spec = GroupSpec("default/g", 3)
    assert admission.check(spec, wholeness(spec, 3), dict).admitted
    await asyncio.wait_for(gate.admit(state.pods["default/p2"], "n2", spec, 30), 1)
    assert sorted(n for n, _ in binder.bound) == ["p0", "p1", "p2"]


async def test_a_gang_still_at_min_member_is_not_rolled_back() -> None:
    """Four placed for minMember 3: one refusal still leaves a whole gang."""
    state, _, binder, deleter, observer, gate = setup(4, PartialBindPolicy.DELETE_BOUND)
    binder.fail["p3"] = REFUSED
    results = await admit_all(state, gate, ["p0", "p1", "p2", "p3"], 3)
    await gate.drain()
    assert "the gang keeps 3 bound members (minMember 3)" in str(results[3])
    assert deleter.deleted == [] and observer.reports == []


async def test_a_pod_deleted_between_gate_and_binding_rolls_the_wave_back() -> None:
    state, _, binder, deleter, _, gate = setup(2, PartialBindPolicy.DELETE_BOUND)
    binder.fail["p1"] = NotFound('API server answered 404: pods "p1" not found')
    results = await admit_all(state, gate, ["p0", "p1"], 2)
    await gate.drain()
    assert results[0] is None and isinstance(results[1], GateError)
    assert deleter.deleted == [("p0", "uid-default-p0")]


async def test_waves_in_flight_together_are_rolled_back_together() -> None:
    """p3 reached the gate while p0..p2 were binding and was admitted counting them;
    when two of those are refused, p3's binding belongs to the same partial gang."""
    state, _, binder, deleter, observer, gate = setup(4, PartialBindPolicy.DELETE_BOUND)
    binder.fail["p1"] = REFUSED
    binder.fail["p2"] = REFUSED
    binder.hold = asyncio.Event()
    spec = GroupSpec("default/g", 3)
    first = [
        asyncio.create_task(gate.admit(state.pods[f"default/p{i}"], "n1", spec, 30))
        for i in range(3)
    ]
    await asyncio.sleep(0.01)
    late = asyncio.create_task(gate.admit(state.pods["default/p3"], "n2", spec, 30))
    await asyncio.sleep(0.01)
    binder.hold.set()
    results = await asyncio.gather(*first, late, return_exceptions=True)
    await gate.drain()
    assert [r is None for r in results] == [True, False, False, True]
    assert sorted(name for name, _ in deleter.deleted) == ["p0", "p3"]
    assert [(names, rolled) for _, names, _, rolled in observer.reports] == [(["p0", "p3"], True)]
    assert "(p0, p3) are deleted" in str(results[1])


async def test_a_failed_deletion_is_logged_and_the_rest_still_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, _, binder, deleter, _, gate = setup(3, PartialBindPolicy.DELETE_BOUND)
    binder.fail["p2"] = REFUSED
    deleter.fail.add("p0")
    await admit_all(state, gate, ["p0", "p1", "p2"], 3)
    await gate.drain()
    assert deleter.deleted == [("p1", "uid-default-p1")]
    assert "could not delete a member of a partly bound gang" in caplog.text
