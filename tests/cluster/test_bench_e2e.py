"""A tiny run of bench/e2e.py's cases against the test cluster: its code works, no timing asserted.

The full benchmark (its own control plane, hundreds of nodes, thousands of
pods) runs in `make bench`; here its runner schedules a few pods with a
kube-scheduler of its own (profile bench-scheduler, next to the session's
schedulers) and the session's extender.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import e2e
from bench.roundtrips import Capture
from tests.cluster.bench_runner import bench_runner
from tests.cluster.chart_pod import free_port
from tests.cluster.session import CLUSTER_DIR, Extender


def test_bench_cases_schedule_every_pod_and_report_their_figures(
    kubeconfig: str, extender: Extender
) -> None:
    state = json.loads((CLUSTER_DIR / "state.json").read_text())
    runner = bench_runner(kubeconfig, "bench-smoke", extender)
    cluster = runner.cluster
    plain = runner.run_case(e2e.CASES["a"], 6, 3, "-smoke")
    through = runner.run_case(e2e.CASES["b"], 6, 3, "-smoke")
    gangs = runner.run_case(e2e.CASES["c"], e2e.GANG_SIZE, 3, "-smoke")
    # The yardstick: kube-scheduler calling the no-op Go extender (hack/kube/cmd/noop-extender).
    noop = e2e.NoopExtender(
        Path(state["bin_dir"]), kubeconfig, free_port(), 200, cluster.work_dir / "noop.log"
    )
    cluster.noop_url, cluster.noop_pid = noop.url, noop.process.pid
    try:
        yardstick = runner.run_case(e2e.CASES["n"], 6, 3, "-smoke")
    finally:
        noop.stop()

    for result in (plain, through, gangs, yardstick):
        assert result.bound == result.pods, result
        assert result.pods_per_second > 0, result
        assert result.algorithm_p50 > 0, result  # kube-scheduler's metrics were read
    assert plain.extender_cpu_per_1000 is None, plain
    assert through.extender_cpu_per_1000 is not None, through
    assert {"filter", "prioritize", "bind"} <= set(through.verbs), through
    assert gangs.gang_latency_p50 is not None, gangs
    assert yardstick.extender_cpu_per_1000 is not None, yardstick  # the no-op's own CPU
    assert not yardstick.verbs, yardstick  # it has no gang-extender metrics
    # kube-scheduler's calls timed on the wire (bench/roundtrips.py), where tcpdump can
    # capture (.ci/run installs it); else the report says why they are missing.
    assert plain.wire == {} and plain.wire_missing is None, plain  # no extender, no wire
    if capture_possible():
        for result in (through, yardstick):
            assert result.wire_missing is None, result.wire_missing
            assert {"filter", "prioritize", "bind"} <= set(result.wire), result.wire
            assert all(0 < p50 <= p99 < 30 for p50, p99 in result.wire.values()), result
        assert "bind" in gangs.wire, gangs
    else:
        assert through.wire == {} and through.wire_missing, through
    for result in (plain, through, gangs, yardstick):
        assert 0 < result.machine_busy <= 1, result
        # kube-apiserver and etcd did work for every case (bindings, watches).
        assert result.control_plane_cpu_per_1000 is not None, result
        assert result.control_plane_cpu_per_1000 > 0, result
    section = e2e.render_markdown(
        {
            "date": "today",
            "label": "smoke",
            "command": "pytest",
            "duration": 1.0,
            "machine": "test",
            "kube_version": state["kube_version"],
            "python": "3",
            "qps": 200,
            "cases": [plain, through, gangs, yardstick],
        }
    )
    assert "| (b-smoke) plain pods through the extender | 3 | 6/6 |" in section
    assert "| (n-smoke) plain pods through a no-op Go extender | 3 | 6/6 |" in section


def test_bench_case_o_runs_kube_scheduler_without_opportunistic_batching(kubeconfig: str) -> None:
    """(o): no extender, and the batching kube-scheduler drops once any extender is configured."""
    runner = bench_runner(kubeconfig, "bench-batching")
    result = runner.run_case(e2e.CASES["o"], 6, 3, "-smoke")
    assert result.bound == result.pods and result.extender_cpu_per_1000 is None
    log = (runner.cluster.work_dir / "bench-scheduler-o-smoke.log").read_text()
    assert "OpportunisticBatching=false" in log  # kube-scheduler's own echo of its flags
    assert "Disabling signatures for profile because it has extenders" not in log


def capture_possible() -> bool:
    """tcpdump is installed and may capture on lo here (root, or CAP_NET_RAW)."""
    probe = Capture(1, CLUSTER_DIR / "bench-smoke" / "probe.pcap")
    probe.stop()
    return probe.why_not is None


def test_bench_profiles_each_case_kube_scheduler(kubeconfig: str, tmp_path: Path) -> None:
    """--profile-scheduler: a CPU profile from the case's kube-scheduler's own /debug/pprof."""
    runner = bench_runner(kubeconfig, "bench-profile", profile_dir=tmp_path)
    result = runner.run_case(e2e.CASES["a"], 6, 3, "-profile")
    assert result.bound == result.pods
    profile = (tmp_path / "kube-scheduler-a-profile.pprof").read_bytes()
    assert profile[:2] == b"\x1f\x8b", profile[:200]  # pprof's gzipped protobuf, not an error page
