"""How build_apps splits routes between the verbs' port and the operations port."""

import httpx
from kubernetes import client as k8s

from app.config import Settings
from app.groups import GROUP_APIS, SOURCE_NATIVE, SOURCE_VOLCANO, SOURCE_XK8S
from app.server import build_apps, reflector_kind


def paths(app: object) -> set[str]:
    return {route.path for route in app.routes}  # type: ignore[attr-defined]


def test_one_port_serves_everything() -> None:
    apps = build_apps(Settings(), k8s.ApiClient(k8s.Configuration()))
    assert apps.ops is None
    assert {"/scheduler/filter", "/scheduler/bind", "/metrics", "/debug/gangs", "/readyz"} <= (
        paths(apps.main)
    )


async def test_ops_port_gets_operations_and_no_verbs() -> None:
    apps = build_apps(Settings(ops_port=9090), k8s.ApiClient(k8s.Configuration()))
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
    }
