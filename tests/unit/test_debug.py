import asyncio
import json

import httpx
from fastapi import FastAPI

from app.base.metrics import Metrics
from app.core.admission import Admission, DenyReason
from app.core.groups import GroupSpec
from app.core.state import ClusterState
from app.core.status import PENDING, SCHEDULING, GroupStatus, GroupView
from app.ops.debug import GangDebug, add_debug_routes
from app.runtime.gate import PermitGate
from app.runtime.gate_settings import GateLinks
from tests.unit.builders import cluster
from tests.unit.fakes import Clock


class NeverBinds:
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        raise AssertionError("the gang is incomplete: nothing may be bound")


def world() -> tuple[ClusterState, Admission, PermitGate, Clock]:
    clock = Clock(100.0)
    state = cluster(3)
    admission = Admission(3, clock=clock)
    gate = PermitGate(state, admission, NeverBinds(), Metrics(), GateLinks(clock=clock))
    state.add_pod_listener(gate.on_pod_change)
    return state, admission, gate, clock


GROUPS = {
    "default/g": GroupView("default/g", "podgroup", 3, 3, GroupStatus(SCHEDULING)),
    "default/light": GroupView("default/light", "labels", 2, 1, GroupStatus(PENDING)),
}


async def test_snapshot_shows_groups_gate_waiters_and_cache_entries_with_ttl() -> None:
    state, admission, gate, clock = world()
    spec = GroupSpec("default/g", 3)
    waits = [
        asyncio.create_task(gate.admit(state.pods["default/p0"], "n1", spec, 30)),
        asyncio.create_task(gate.admit(state.pods["default/p1"], "n2", spec, 30)),
    ]
    await asyncio.sleep(0)
    admission.deny("default/old", DenyReason.TIMEOUT, "gang default/old timed out")
    admission.permitted["default/g"] = clock.now
    clock.now += 1.5

    doc = GangDebug(GROUPS, gate, admission, clock).snapshot()

    assert json.loads(json.dumps(doc)) == doc  # plain JSON
    assert doc["groups"] == [
        {
            "key": "default/g",
            "source": "podgroup",
            "minMember": 3,
            "members": 3,
            "phase": SCHEDULING,
            "scheduled": 0,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "scheduleStartTime": None,
            "waitingInGate": 2,
        },
        {
            "key": "default/light",
            "source": "labels",
            "minMember": 2,
            "members": 1,
            "phase": PENDING,
            "scheduled": 0,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "scheduleStartTime": None,
            "waitingInGate": 0,
        },
    ]
    assert doc["gate"] == {
        "default/g": [
            {"pod": "default/p0", "uid": "uid-default-p0", "node": "n1", "waitingSeconds": 1.5},
            {"pod": "default/p1", "uid": "uid-default-p1", "node": "n2", "waitingSeconds": 1.5},
        ]
    }
    assert doc["denied"] == [
        {
            "group": "default/old",
            "reason": "timeout",
            "message": "gang default/old timed out",
            "ageSeconds": 1.5,
            "ttlSecondsLeft": 1.5,
        }
    ]
    assert doc["permitted"] == [{"group": "default/g", "ageSeconds": 1.5, "ttlSecondsLeft": 1.5}]
    assert doc["deniedTTLSeconds"] == 3
    assert doc["leader"] is True  # one replica, no election: always the leader

    clock.now += 2  # both cache entries expired: shown no more, and not purged by reading
    later = GangDebug(GROUPS, gate, admission, clock, is_leader=lambda: False).snapshot()
    assert later["denied"] == [] and later["permitted"] == []
    assert later["leader"] is False  # a standby says so: kubectl gang asks again
    gate.release_all("test over")
    await asyncio.gather(*waits, return_exceptions=True)


async def test_route_serves_the_snapshot() -> None:
    _, admission, gate, clock = world()
    app = FastAPI()
    add_debug_routes(app, GangDebug(GROUPS, gate, admission, clock))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/debug/gangs")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert [g["key"] for g in body["groups"]] == ["default/g", "default/light"]
    assert body["gate"] == {} and body["denied"] == [] and body["permitted"] == []
