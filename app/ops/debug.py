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
from app.runtime.gate import PermitGate, Waiter


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
    cache_now = denied.timer()
    denials = [
        {
            "group": key,
            "reason": denial.reason,
            "message": denial.message,
            "ageSeconds": round(cache_now - denial.at, 3),
            "ttlSecondsLeft": round(denial.at + ttl_seconds - cache_now, 3),
        }
        for key, denial in list(denied.items())
        if denial.at + ttl_seconds > cache_now
    ]
    permits = [
        {
            "group": key,
            "ageSeconds": round(cache_now - at, 3),
            "ttlSecondsLeft": round(at + ttl_seconds - cache_now, 3),
        }
        for key, at in list(permitted.items())
        if at + ttl_seconds > cache_now
    ]
    gate = {
        key: [
            {
                "pod": w.pod_key,
                "uid": w.uid,
                "node": w.node,
                "waitingSeconds": round(max(0.0, gate_now - w.arrived), 3),
            }
            for w in sorted(waiters, key=lambda w: w.arrived)
        ]
        for key, waiters in sorted(waiting.items())
    }
    return {
        "groups": [
            {
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
                "waitingInGate": len(gate.get(view.key, ())),
                **_extras(view),
            }
            for view in sorted(groups.values(), key=lambda v: v.key)
        ],
        "gate": gate,
        "denied": sorted(denials, key=lambda d: str(d["group"])),
        "permitted": sorted(permits, key=lambda p: str(p["group"])),
        "deniedTTLSeconds": ttl_seconds,
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
    # Live preemption plans (app/runtime/preemption.py).
    preemption: Callable[[], list[dict[str, Any]]] | None = None

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
