"""How build_apps splits routes between the verbs' port and the operations port, and wires."""

from collections.abc import Callable

import httpx
from fastapi import FastAPI
from kubernetes import client as k8s
from pytest import MonkeyPatch

from app.config import Settings
from app.core.groups import GROUP_APIS, SOURCE_KAI, SOURCE_NATIVE, SOURCE_VOLCANO, SOURCE_XK8S
from app.core.state import ClusterState
from app.runtime.gate import PermitGate
from app.runtime.watches import reflector_kind
from app.server import build_apps
from app.web.verbs_asgi import VerbRouter


def paths(app: FastAPI) -> set[str]:
    """The paths an app answers: its routes, and those its VerbRouter answers ahead of them."""
    stack = app.build_middleware_stack()
    verbs = set(stack.verbs) if isinstance(stack, VerbRouter) else set()
    return {route.path for route in app.routes} | verbs  # type: ignore[attr-defined]


def test_one_port_serves_everything() -> None:
    apps = build_apps(Settings(), k8s.Configuration())
    assert apps.ops is None
    assert {"/scheduler/filter", "/scheduler/bind", "/metrics", "/debug/gangs", "/readyz"} <= (
        paths(apps.main)
    )


async def test_ops_port_gets_operations_and_no_verbs() -> None:
    apps = build_apps(Settings(ops_port=9090), k8s.Configuration())
    assert apps.ops is not None
    assert "/scheduler/bind" not in paths(apps.ops)
    assert {"/metrics", "/debug/gangs", "/healthz", "/readyz"} <= paths(apps.ops)
    assert "/debug/gangs" not in paths(apps.main)
    transport = httpx.ASGITransport(app=apps.ops)
    async with httpx.AsyncClient(transport=transport, base_url="http://ops") as client:
        response = await client.get("/debug/gangs")
    assert response.status_code == 200
    assert response.json()["groups"] == []


def test_reflector_kinds_keep_their_metric_labels() -> None:
    kinds = {source: reflector_kind(api) for source, api in GROUP_APIS.items()}
    assert kinds == {
        SOURCE_XK8S: "podgroups",
        SOURCE_VOLCANO: "volcano-podgroups",
        SOURCE_NATIVE: "native-podgroups",
        SOURCE_KAI: "kai-podgroups",
    }


def test_listeners_are_wired_in_the_order_server_py_states(monkeypatch: MonkeyPatch) -> None:
    # The gate must hear of a pod change before the arbiter (see build_apps).
    heard: list[str] = []

    def record(kind: str) -> Callable[..., None]:
        return lambda _self, listener: heard.append(f"{kind}:{type(listener.__self__).__name__}")

    monkeypatch.setattr(ClusterState, "add_pod_listener", record("pod"))
    monkeypatch.setattr(ClusterState, "add_node_listener", record("node"))
    monkeypatch.setattr(ClusterState, "add_placement_listener", record("placement"))
    monkeypatch.setattr(PermitGate, "add_settle_listener", record("settle"))
    build_apps(Settings(gang_feasibility=True), k8s.Configuration())
    assert heard == [
        "pod:SiblingWaker",
        "pod:PodGroupStatus",
        "pod:GangEvents",
        "pod:PermitGate",
        "settle:Arbiter",
        "pod:Arbiter",
        "node:Arbiter",
        "pod:PreemptionFollower",
        "pod:PreemptionPlans",
        "placement:PreemptionPlans",
        "pod:UnaskedPreemption",
        "node:PreemptionPlans",
        "pod:HeldMembers",
    ]
