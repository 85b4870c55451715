"""bench/run.py's preempt rows run, on a small cluster, and answer as kube-scheduler expects."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from bench import plots
from bench import run as bench_run


async def test_preempt_rows_make_a_plan_and_answer_from_it() -> None:
    rows = await bench_run.preempt_rows(nodes=40, pods=400, runs=8)
    assert rows.pop("plan_evictions") == 40  # 8 members of 2 CPUs: 4 nodes emptied
    assert set(rows) == {"preempt_gang_plan_made", "preempt_gang_from_plan", "preempt_plain"}
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p99_ms"]


async def test_queue_rows_admit_the_fresh_gang_also_after_nodes_changed() -> None:
    rows = await bench_run.queue_rows(nodes=40, pods=400, runs=4, queues=3, pending=20, churn=5)
    assert rows.pop("filter_gang_admit_queues_first_ms") > 0
    assert rows.pop("ratio_filter_p99_queues_vs_none") > 0
    assert set(rows) == {
        f"filter_gang_admit_queues_{label}{after}"
        for label in ("none", "3")
        for after in ("", "_node_changed")
    }
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p99_ms"]


async def test_retry_rows_answer_every_retry_from_the_verdict_kept() -> None:
    rows = await bench_run.retry_rows(nodes=40, pods=400, runs=4, pending=20)
    assert rows.pop("ratio_filter_p50_retry_vs_fresh") > 0
    assert set(rows) == {"filter_gang_turned_away_fresh", "filter_gang_turned_away_retry"}
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p99_ms"]


async def test_loop_rows_time_every_step_and_admit_the_fresh_gang() -> None:
    rows = await bench_run.loop_rows(nodes=40, pods=400, pending=20, queues=3)
    assert set(rows) == {
        f"loop_held_{measure}_{step}"
        for measure in ("ms", "cpu_ms")
        for step in (
            "tally_caught_up_in_slices",
            "line_warmed_in_slices",
            "first_admission",
            "admission",
            "node_cordoned",
            "line_warmed_after_node",
            "admission_after_node",
            "relist_pods_in_slices",
            "tally_caught_up_after_relist",
            "admission_after_relist",
            "longest",
        )
    }
    for measure in ("ms", "cpu_ms"):
        held = {k: v for k, v in rows.items() if k.startswith(f"loop_held_{measure}_")}
        assert rows[f"loop_held_{measure}_longest"] == max(held.values()) > 0


async def test_loop_rows_behind_a_blocked_line_time_the_steps_without_queues() -> None:
    rows = await bench_run.loop_rows(nodes=40, pods=400, pending=20, blocked=True)
    steps = {k.removeprefix("loop_held_ms_") for k in rows if k.startswith("loop_held_ms_")}
    assert "tally_caught_up_in_slices" not in steps
    assert {"line_warmed_in_slices", "admission_after_node", "relist_pods_in_slices"} <= steps
    assert rows["loop_held_ms_longest"] > 0


def _spin(seconds: float) -> None:
    """Hold the loop `seconds` of this thread's CPU time."""
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


async def test_the_loop_probe_sees_a_step_that_holds_the_loop() -> None:
    async with bench_run.LoopProbe() as probe:
        held = await probe.held(lambda: time.sleep(0.05))
        # The OS ran something else meanwhile (here: nothing): late, but no CPU time of ours.
        assert 40 <= held < 1000 and probe.longest_cpu * 1000 < 20
        busy = await probe.held(lambda: _spin(0.05))
        assert 40 <= busy < 1000 and 40 <= probe.longest_cpu * 1000 < 1000


async def test_device_rows_admit_both_gangs_and_count_the_devices() -> None:
    rows = await bench_run.device_rows(nodes=40, pods=400, runs=4)
    assert rows.pop("ratio_filter_p99_devices_vs_cpu") > 0
    assert set(rows) == {"filter_gang_admit_cpu", "filter_gang_admit_devices"}
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    # One device a node, none of them 64Gi: the device gang is not admitted, so the
    # row times an admission that counts devices, not one that ignores them.
    with pytest.raises(AssertionError, match="gang devices was not admitted"):
        await bench_run.device_rows(nodes=40, pods=400, runs=2, devices=1)


async def test_slice_rows_admit_the_gang_of_64_slice_by_slice_next_to_a_flat_one() -> None:
    rows = await bench_run.slice_rows(nodes=200, pods=400, runs=3)
    assert rows.pop("ratio_filter_p99_sliced_vs_flat") > 0
    assert set(rows) == {"filter_gang_admit_block_64_flat", "filter_gang_admit_block_64_sliced"}
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p99_ms"]


async def test_the_line_sweep_admits_at_every_length_and_feeds_its_plot(tmp_path: Path) -> None:
    points = await bench_run.line_sweep(40, 400, [0, 5, 20], queues=3, runs=4, churn=5)
    assert [(p["line"], p["queues"]) for p in points] == [
        (n, q) for n in (0, 5, 20) for q in ("none", "3")
    ]
    for point in points:
        assert point["calls"] == 4
        assert 0 < point["p50_ms"] <= point["p99_ms"] <= point["max_ms"]
        assert point["first_ms"] > 0
    drawn = plots.admission_by_line(
        {"nodes": 40, "pods": 400, "points": points}, tmp_path / "a.png"
    )
    assert drawn.stat().st_size > 0


async def test_a_blocked_line_holds_room_and_the_fresh_gang_is_backfilled_into_the_rest() -> None:
    # The line's gangs (4 x 54.5 CPUs) fit no node now (54 CPUs free on each) and aged,
    # each holds what it could use: half a CPU per node is left, so the fresh gang's 8
    # members of 400m go one per node. With no line they share the first node.
    placed = {}
    for length in (0, 6):
        cluster = bench_run.queue_cluster(20, 200, 1, length, blocked=True)
        arbiter, app = bench_run.queue_arbiter(cluster, [])
        async with bench_run.verbs_client(app) as client:
            await bench_run.fresh_admissions(client, cluster, arbiter, 2, 5)
        (claim,) = arbiter.claims.values()
        placed[length] = len(set(claim.plan.values()))
    assert placed == {0: 1, 6: 8}
    points = await bench_run.line_sweep(20, 200, [0, 6], runs=3, churn=5, blocked=True)
    assert [(p["line"], p["queues"], p["calls"]) for p in points] == [
        (0, "none", 3),
        (6, "none", 3),
    ]


async def test_a_sweep_point_stops_at_its_time_budget_after_three_calls() -> None:
    points = await bench_run.line_sweep(40, 400, [10], queues=2, runs=50, budget_seconds=0)
    assert [p["calls"] for p in points] == [3, 3]


def test_line_lengths_are_whole_numbers_or_a_clear_error() -> None:
    assert bench_run.line_lengths("0,100,1_000, 10000") == [0, 100, 1000, 10000]
    for bad in ("0,x", "", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"whole numbers|none negative"):
            bench_run.line_lengths(bad)
