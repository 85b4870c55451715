"""bench/e2e.py's Runner on the session's cluster, for the tests that run its cases small.

Each runner starts kube-scheduler processes of its own (profile
bench-scheduler, next to the session's schedulers) on a free port, and
points them at the session's extender when one is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import e2e
from tests.cluster.chart_pod import free_port
from tests.cluster.session import CLUSTER_DIR, Extender


def bench_runner(
    kubeconfig: str, work: str, extender: Extender | None = None, **options: Any
) -> e2e.Runner:
    """A Runner working in CLUSTER_DIR/`work`; `options` go to e2e.Runner (profile_dir, ...)."""
    state = json.loads((CLUSTER_DIR / "state.json").read_text())
    cluster = e2e.Cluster(
        kubeconfig=kubeconfig,
        scheduler_kubeconfig=str(CLUSTER_DIR / "kube-scheduler.kubeconfig"),
        bin_dir=Path(state["bin_dir"]),
        scheduler_port=free_port(),
        work_dir=CLUSTER_DIR / work,
        control_plane_pids=e2e.control_plane_pids(CLUSTER_DIR / "pids"),
    )
    if extender is not None:
        assert extender.process is not None
        cluster.extender_url = f"{extender.url}/scheduler"
        cluster.extender_pid = extender.process.pid
    return e2e.Runner(cluster, qps=200, log=lambda _: None, settle_seconds=0, **options)
