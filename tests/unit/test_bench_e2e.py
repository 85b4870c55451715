"""The arithmetic and rendering of bench/e2e.py (its cluster part runs in `make bench`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.core.groups import LIGHT_MIN_AVAILABLE_LABEL, POD_GROUP_LABEL
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE
from bench import e2e, plots
from bench.roundtrips import RoundTrips


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert e2e.percentile(values, 0.5) == 50.0
    assert e2e.percentile(values, 0.99) == 99.0
    assert e2e.percentile(values, 1.0) == 100.0
    assert e2e.percentile([], 0.5) == 0.0
    assert e2e.percentile([3.0], 0.99) == 3.0


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    # 10 observations <= 1ms, 10 more <= 2ms, none above.
    buckets = {0.001: 10.0, 0.002: 20.0, float("inf"): 20.0}
    assert e2e.histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    assert e2e.histogram_quantile(0.75, buckets) == pytest.approx(0.0015)
    assert e2e.histogram_quantile(0.25, buckets) == pytest.approx(0.0005)
    assert e2e.histogram_quantile(0.99, {}) == 0.0
    # Everything above the last finite bound: the bound is all we know.
    assert e2e.histogram_quantile(0.99, {0.001: 0.0, float("inf"): 5.0}) == 0.001


def test_histogram_delta_and_parsing_take_one_run_out_of_cumulative_counters() -> None:
    text = "\n".join(
        [
            "# HELP x_seconds help",
            "# TYPE x_seconds histogram",
            'x_seconds_bucket{verb="filter",le="0.001"} 4',
            'x_seconds_bucket{verb="filter",le="+Inf"} 6',
            'x_seconds_count{verb="filter"} 6',
            'x_seconds_sum{verb="filter"} 0.01',
            'x_seconds_bucket{verb="bind",le="0.001"} 1',
            'x_seconds_bucket{verb="bind",le="+Inf"} 1',
            'x_seconds_count{verb="bind"} 1',
            'x_seconds_sum{verb="bind"} 0.0005',
            "",
        ]
    )
    parsed = e2e.parse_histograms(text, "x_seconds", "verb")
    assert parsed["filter"] == {0.001: 4.0, float("inf"): 6.0}
    delta = e2e.bucket_delta(parsed["filter"], {0.001: 1.0, float("inf"): 1.0})
    assert delta == {0.001: 3.0, float("inf"): 5.0}


def test_throughput_counts_the_intervals_between_first_and_last_bind() -> None:
    rate, span = e2e.throughput([10.0, 10.5, 11.0, 12.0])
    assert span == 2.0
    assert rate == 1.5
    assert e2e.throughput([1.0]) == (0.0, 0.0)


def test_gang_latency_is_the_last_member_bound_minus_the_gang_ready_time() -> None:
    bound = {"a0": 1.0, "a1": 3.0, "b0": 2.0, "b1": 2.5}
    gangs = {"a0": "a", "a1": "a", "b0": "b", "b1": "b"}
    assert sorted(e2e.gang_latencies(bound, gangs, {"a": 0.5, "b": 2.0})) == [0.5, 2.5]


def test_scheduler_config_sets_the_qps_and_only_then_the_extender() -> None:
    plain = json.loads(e2e.render_scheduler_config("/k", 2000, None))
    assert plain["clientConnection"] == {"kubeconfig": "/k", "qps": 2000, "burst": 2000}
    assert "extenders" not in plain
    assert plain["profiles"] == [{"schedulerName": e2e.SCHEDULER_NAME}]
    with_extender = json.loads(e2e.render_scheduler_config("/k", 2000, "http://x/scheduler"))
    (extender,) = with_extender["extenders"]
    assert extender["urlPrefix"] == "http://x/scheduler"
    assert extender["bindVerb"] == "bind"
    assert extender["nodeCacheCapable"] is True


def test_marked_preemptor_cases_scope_the_preempt_entry_as_the_chart_does() -> None:
    def entries(gang_only: bool, mark_preemptors: bool = False) -> list[dict[str, Any]]:
        config = json.loads(
            e2e.render_scheduler_config(
                "/k", 2000, "http://x/s", gang_only=gang_only, mark_preemptors=mark_preemptors
            )
        )
        return [
            {k: v for k, v in e.items() if k.endswith("Verb") or k == "managedResources"}
            for e in config["extenders"]
        ]

    member = {"name": MEMBER_RESOURCE, "ignoredByScheduler": True}
    assert entries(gang_only=True) == [
        {
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "bindVerb": "bind",
            "managedResources": [member],
        },
        {"preemptVerb": "preempt"},
    ]
    assert entries(gang_only=True, mark_preemptors=True) == [
        {
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "bindVerb": "bind",
            "preemptVerb": "preempt",
            "managedResources": [member],
        },
        {
            "preemptVerb": "preempt",
            "managedResources": [{"name": PREEMPTOR_RESOURCE, "ignoredByScheduler": True}],
        },
    ]
    assert e2e.CASES["p"].gang_only and e2e.CASES["p"].mark_preemptors
    assert e2e.CASES["p"].gangs is None and not e2e.CASES["p"].noop
    assert e2e.CASES["q"].gangs == "x-k8s" and e2e.CASES["q"].mark_preemptors


def test_only_case_o_turns_kube_schedulers_batching_off() -> None:
    assert [key for key, case in e2e.CASES.items() if not case.batching] == ["o"]
    assert not e2e.CASES["o"].extender and not e2e.CASES["o"].noop
    # (w): the extender runs, kube-scheduler is not told of it.
    assert [key for key, case in e2e.CASES.items() if case.watch_only] == ["w"]
    assert not e2e.CASES["w"].extender
    assert e2e.CASES["w"].runs_extender and e2e.CASES["b"].runs_extender
    assert not e2e.CASES["a"].runs_extender and not e2e.CASES["o"].runs_extender
    assert e2e.scheduler_feature_gates("", batching=True) == ""
    assert e2e.scheduler_feature_gates("", batching=False) == "OpportunisticBatching=false"
    assert (
        e2e.scheduler_feature_gates("GenericWorkload=true", batching=False)
        == "GenericWorkload=true,OpportunisticBatching=false"
    )


def test_pod_bodies_name_their_gang_the_way_each_scheduler_reads_it() -> None:
    x = e2e.pod_body("p0", x_group="g0")
    assert x["metadata"]["labels"][POD_GROUP_LABEL] == "g0"
    assert x["spec"]["schedulerName"] == e2e.SCHEDULER_NAME
    native = e2e.pod_body("p0", native_group="g0")
    assert native["spec"]["schedulingGroup"] == {"podGroupName": "g0"}
    assert POD_GROUP_LABEL not in native["metadata"]["labels"]
    cached = e2e.pod_body("c0", label_group=("g0", 8), node_name="node-1")
    assert cached["spec"]["nodeName"] == "node-1"
    assert cached["metadata"]["labels"][LIGHT_MIN_AVAILABLE_LABEL] == "8"


def _result(case: str, rate: float) -> e2e.CaseResult:
    return e2e.CaseResult(
        case=case,
        description=f"case {case}",
        pods=100,
        bound=100,
        span_seconds=1.0,
        pods_per_second=rate,
        pod_latency_p50=0.5,
        pod_latency_p99=0.9,
        extender_cpu_per_1000=1.5 if case in ("b", "c") else None,
        control_plane_cpu_per_1000=2.25 if case == "a" else None,
        verbs={"filter": (0.001, 0.002)} if case == "b" else {},
        nodes=500,
    )


def test_markdown_states_the_ratios_against_their_targets_and_replaces_the_old_section() -> None:
    cases = [_result("a", 200), _result("b", 180), _result("c", 110), _result("d", 100)]
    report: dict[str, Any] = {
        "date": "2026-11-23 12:00 UTC",
        "label": "test",
        "command": "python bench/e2e.py",
        "duration": 60.0,
        "machine": "x86_64",
        "kube_version": "v1.37.2",
        "python": "3.11",
        "qps": 2000,
        "cases": cases,
        "memory": {"end": (100.0, 120.0)},
        "notes": ["a note"],
    }
    section = e2e.render_markdown(report)
    assert "| (b)/(a) plain pods, extender / no extender | 0.90 | >= 0.8 |" in section
    assert "| (c)/(d) gangs, extender / in-tree GangScheduling | 1.10 | >= 1.0 |" in section
    assert "| (b) | 1.00 / 2.00 ms |" in section
    assert "| API server and etcd CPU s / 1,000 pods |" in section
    # (a): no extender, no kube-scheduler CPU given, the control plane's 2.25.
    assert "| (a) case a | 500 | 100/100 |" in section and "| - | - | 2.25 |" in section
    assert "OpportunisticBatching (on only" not in section  # no case told us about it
    batched = _result("a-r2", 200)
    batched.batch_hints_used, batched.batch_attempts = 3, 2000
    batched.batch_flushes = {"expired": 4, "pod_not_batchable": 1990}
    with_batching = e2e.render_markdown({**report, "cases": [*cases, batched]})
    assert "kept: (a-r2) 3/2,000 (dropped: expired 4, pod_not_batchable 1,990)." in with_batching
    with_o = e2e.render_markdown({**report, "cases": [*cases, _result("o", 190)]})
    assert "| (o)/(a) plain pods, no extender: OpportunisticBatching off / on | 0.95 | - |" in (
        with_o
    )
    report["cases"] = [*cases, _result("a-r2", 200), _result("b-r2", 140)]
    rounds = e2e.render_markdown(report)
    assert "| (b)/(a) plain pods, extender / no extender | 0.80 (median; rounds 0.90, 0.70) |" in (
        rounds
    )
    assert "| (c)/(d) gangs, extender / in-tree GangScheduling | 1.10 | >= 1.0 |" in rounds
    assert "| end | 100 MB | 120 MB |" in section
    first = e2e.update_benchmarks_md("# Benchmarks\n\nintro\n", section)
    assert first.count(e2e.MD_BEGIN) == 1
    again = e2e.update_benchmarks_md(first + "\n## later\n", section.replace("a note", "new"))
    assert again.count(e2e.MD_BEGIN) == 1
    assert "new" in again and "a note" not in again
    assert again.endswith("## later\n")


def test_targets_at_scale_read_the_wire_first_and_say_where_a_figure_comes_from() -> None:
    scale = _result("b-scale", 150)
    scale.nodes = 5000
    scale.verbs = {"filter": (0.0001, 0.0009), "prioritize": (0.0002, 0.003)}
    scale.wire = {"filter": (0.0003, 0.0025)}  # prioritize: not captured
    gangs = _result("q-scale", 160)
    gangs.nodes = 5000
    gangs.verbs = {"filter": (0.0004, 0.0018), "prioritize": (0.0, 0.0)}  # never called
    missing = _result("b", 180)
    missing.wire_missing = "tcpdump is not installed (apt-get install tcpdump)"
    report: dict[str, Any] = {
        "date": "today",
        "label": "test",
        "command": "python bench/e2e.py",
        "duration": 1.0,
        "machine": "x86_64",
        "kube_version": "v1.37.2",
        "python": "3.11",
        "qps": 2000,
        "cases": [_result("a-scale", 300), scale, gangs, missing],
        "memory": {
            "when stopped, 500 nodes": (100.0, 100.0),
            f"5,000 nodes, 50,000 {e2e.CACHED_LABEL}": (230.0, 240.0),
        },
    }
    section = e2e.render_markdown(report)
    assert (
        "| filter p99 at 5,000 nodes, every-verb plain pods (on kube-scheduler's connections) "
        "| 2.50 ms | <= 2 ms |" in section
    )
    assert (
        "| prioritize p99 at 5,000 nodes, every-verb plain pods (extender's own histogram) "
        "| 3.00 ms | <= 5 ms |" in section
    )
    assert (
        "| filter p99 at 5,000 nodes, gang-only gang members (extender's own histogram) "
        "| 1.80 ms | <= 2 ms |" in section
    )
    assert "prioritize p99 at 5,000 nodes, gang-only" not in section
    assert "| extender RSS, 5,000 nodes, 50,000 pods cached | 230 MB | <= 400 MB |" in section
    assert "| (b)/(a) at scale | 0.50 | - |" in section
    assert "| (b-scale) | 0.30 / 2.50 ms | - | - |" in section
    assert "| (b) | not measured: tcpdump is not installed (apt-get install tcpdump) | | |" in (
        section
    )


def test_wire_latencies_are_percentiles_of_the_captured_round_trips() -> None:
    trips = RoundTrips(by_verb={"filter": [0.001 * i for i in range(1, 101)]})
    wire, missing = e2e.wire_latencies(trips, None)
    assert missing is None
    assert list(wire) == ["filter"]
    assert wire["filter"] == pytest.approx((0.05, 0.099))
    why = "tcpdump did not start capturing: permission denied"
    assert e2e.wire_latencies(None, why) == ({}, why)
    assert e2e.wire_latencies(None, None) == ({}, "no capture")


def test_every_other_round_runs_the_cases_in_reverse() -> None:
    assert [e2e.round_order("abcdn", n) for n in (1, 2, 3)] == ["abcdn", "ndcba", "abcdn"]


def test_nodes_per_gang_counts_distinct_nodes_of_bound_members() -> None:
    gang_of = {"p0": "g0", "p1": "g0", "p2": "g0", "p3": "g1", "p4": "g1", "p5": "g2"}
    node_of = {"p0": "n1", "p1": "n1", "p2": "n2", "p3": "n3", "p4": "n3", "p5": ""}
    # g0 on two nodes, g1 on one, g2 not bound yet (left out).
    assert e2e.nodes_per_gang(node_of, gang_of) == 1.5
    assert e2e.nodes_per_gang({}, gang_of) is None


def test_the_json_it_writes_has_what_the_pods_per_second_plot_reads(tmp_path: Path) -> None:
    """--json's cases, rounds and the scale step alike, through the plot of bench/plots.py."""
    cases = [_result("a", 200), _result("a-r2", 180), _result("q", 150), _result("q-scale", 90)]
    cases[-1].nodes = 5000
    report = {"date": "2026-11-28 10:00 UTC", "commit": "abc1234", "machine": "x86_64 Some CPU",
              "cases": cases}  # fmt: skip
    written = json.loads(e2e.report_json(report))
    assert plots.e2e_rates(written) == {"a": {500: 190.0}, "q": {500: 150.0, 5000: 90.0}}
    assert plots.pods_per_second(written, tmp_path / "p.png").stat().st_size > 0


def test_a_profile_waits_for_kube_scheduler_to_serve(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """kube-scheduler serves its /debug/pprof once started, seconds later on a busy machine:
    a refused connection is tried again, another error is reported."""
    import io
    import urllib.error
    import urllib.request

    calls: list[str] = []

    def urlopen(url: str, **_kwargs: Any) -> Any:
        calls.append(url)
        if len(calls) < 3:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        return io.BytesIO(b"\x1f\x8bprofile")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    profile = e2e.SchedulerProfile(10259, tmp_path / "p.pprof", after=0, seconds=1)
    profile.wait()
    assert profile.error is None and len(calls) == 3
    assert (tmp_path / "p.pprof").read_bytes() == b"\x1f\x8bprofile"

    def forbidden(url: str, **_kwargs: Any) -> Any:
        raise urllib.error.URLError("403 Forbidden")

    monkeypatch.setattr(urllib.request, "urlopen", forbidden)
    failed = e2e.SchedulerProfile(10259, tmp_path / "q.pprof", after=0, seconds=1)
    failed.wait()
    assert failed.error is not None and "403" in failed.error
