"""GET /debug/gangs: what the extender believes about every gang, as JSON, read-only.

When a gang does not start, the questions are always the same: does the
extender know the group (and its minMember)? Which members are held in the
permit gate, and for how long? Is the group turned away (denied) and until
when, or is a passed resource check still trusted (permitted)? This answers
them from memory, without touching the API server or changing any state
(expired cache entries are skipped, not purged).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache
from fastapi import FastAPI, Response

from app.core.admission import Admission, Denial
from app.core.clock import Clock, monotonic
from app.core.status import GroupView
from app.runtime.gate import PermitGate
from app.runtime.waiting_room import Waiter


def snapshot(
    groups: Mapping[str, GroupView],
    waiting: Mapping[str, Sequence[Waiter]],
    gate_now: float,
    denied: TTLCache[str, Denial],
    permitted: TTLCache[str, float],
    ttl_seconds: float,
) -> dict[str, Any]:
    """The JSON document; pure, so its shape is unit-tested without a cluster.

    `gate_now` is on the gate's clock (Waiter.arrived); the caches carry
    their own clock (TTLCache.timer).
    """
    gate = _gate(waiting, gate_now)
    cache_now = denied.timer()
    return {
        "groups": [
            _group(view, len(gate.get(view.key, ())))
            for view in sorted(groups.values(), key=lambda v: v.key)
        ],
        "gate": gate,
        "denied": _denials(denied, cache_now, ttl_seconds),
        "permitted": _permits(permitted, cache_now, ttl_seconds),
        "deniedTTLSeconds": ttl_seconds,
    }


def _group(view: GroupView, waiting_in_gate: int) -> dict[str, Any]:
    return {
        "key": view.key,
        "source": view.source,
        "minMember": view.min_member,
        "members": view.members,
        "phase": view.status.phase,
        "scheduled": view.status.scheduled,
        "running": view.status.running,
        "succeeded": view.status.succeeded,
        "failed": view.status.failed,
        "scheduleStartTime": view.status.schedule_start_time,
        "waitingInGate": waiting_in_gate,
        **_extras(view),
    }


def _gate(waiting: Mapping[str, Sequence[Waiter]], now: float) -> dict[str, list[dict[str, Any]]]:
    return {
        key: [
            {
                "pod": w.pod_key,
                "uid": w.uid,
                "node": w.node,
                "waitingSeconds": round(max(0.0, now - w.arrived), 3),
            }
            for w in sorted(waiters, key=lambda w: w.arrived)
        ]
        for key, waiters in sorted(waiting.items())
    }


def _denials(denied: TTLCache[str, Denial], now: float, ttl_seconds: float) -> list[dict[str, Any]]:
    return [
        {
            "group": key,
            "reason": denial.reason,
            "message": denial.message,
            **_ages(denial.at, now, ttl_seconds),
        }
        for key, denial in sorted(denied.items(), key=_by_group)
        if denial.at + ttl_seconds > now
    ]


def _permits(
    permitted: TTLCache[str, float], now: float, ttl_seconds: float
) -> list[dict[str, Any]]:
    return [
        {"group": key, **_ages(at, now, ttl_seconds)}
        for key, at in sorted(permitted.items(), key=_by_group)
        if at + ttl_seconds > now
    ]


def _by_group(item: tuple[str, object]) -> str:
    return item[0]


def _ages(at: float, now: float, ttl_seconds: float) -> dict[str, float]:
    """A cache entry's age and time left, as both lists show them."""
    return {
        "ageSeconds": round(now - at, 3),
        "ttlSecondsLeft": round(at + ttl_seconds - now, 3),
    }


@dataclass(frozen=True)
class GangDebug:
    """The live objects the snapshot reads."""

    groups: Mapping[str, GroupView]
    gate: PermitGate
    admission: Admission
    # The gate's clock (Waiter.arrived is on it).
    gate_clock: Clock = monotonic
    # --gang-feasibility: who holds capacity and who waits in line ("contention").
    contention: Callable[[], dict[str, Any]] | None = None
    # Live preemption plans (app/runtime/preemption/plans.py).
    preemption: Callable[[], list[dict[str, Any]]] | None = None
    # Does this replica hold the Lease (app/runtime/leader.py)? A client reaching the
    # replicas through a Service (kubectl gang) asks again until the leader answers:
    # a standby's gate is empty and its plans are not the ones carried out.
    is_leader: Callable[[], bool] | None = None

    def snapshot(self) -> dict[str, Any]:
        now = self.gate_clock()
        doc = snapshot(
            self.groups,
            self.gate.waiting_groups(),
            now,
            self.admission.denied,
            self.admission.permitted,
            self.admission.denied_ttl_seconds,
        )
        if self.contention is not None:
            doc["contention"] = self.contention()
        if self.preemption is not None:
            doc["preemptionPlans"] = self.preemption()
        doc["leader"] = True if self.is_leader is None else self.is_leader()
        return doc


def add_debug_routes(app: FastAPI, debug: GangDebug) -> None:
    """Register GET /debug/gangs, serving `debug`'s snapshot."""

    @app.get("/debug/gangs")
    async def debug_gangs() -> Response:
        return Response(json.dumps(debug.snapshot()), media_type="application/json")


def _extras(view: GroupView) -> dict[str, str]:
    """Fields only some sources have (Volcano's queue, a priority class name)."""
    extras = {"queue": view.queue, "priorityClassName": view.priority_class_name}
    return {k: v for k, v in extras.items() if v}
