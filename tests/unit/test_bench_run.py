"""bench/run.py's preempt rows run, on a small cluster, and answer as kube-scheduler expects."""

from __future__ import annotations

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
