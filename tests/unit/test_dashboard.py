"""The Grafana dashboard queries only metrics the extender really exposes."""

import json
import re
from pathlib import Path
from typing import Any

from app.base.metrics import Metrics

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gang-extender-dashboard.json"
)
METRIC = re.compile(r"\b((?:gang_extender|process|python)_[a-z0-9_]+)\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed_names() -> set[str]:
    """Sample names of every family registered by Metrics (as Prometheus scrapes them)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_dashboard_is_json_and_queries_only_existing_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    unknown = used - exposed_names()
    assert not unknown, f"the dashboard queries metrics the extender does not expose: {unknown}"
    # What operators ask for first: all of it is on the dashboard.
    wanted = {
        "gang_extender_requests_total",
        "gang_extender_request_duration_seconds_bucket",
        "gang_extender_gate_waiting_pods",
        "gang_extender_gate_wait_seconds_bucket",
        "gang_extender_gang_admissions_total",
        "gang_extender_podgroups",
        "gang_extender_bind_errors_total",
        "gang_extender_cache_objects",
        "gang_extender_watch_lag_seconds",
        "gang_extender_watch_restarts_total",
    }
    assert wanted <= used, f"missing from the dashboard: {wanted - used}"


def test_every_panel_has_a_unique_id_and_a_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
