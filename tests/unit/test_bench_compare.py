"""bench/compare.py's figures, table and BENCHMARKS.md section (`make bench-compare` runs it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench import compare, e2e
from bench import run as bench_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_results() -> dict[str, Any]:
    """bench/run.py's figures on a small cluster, through the JSON its --json writes."""
    figures = asyncio.run(bench_run.main(nodes=200, pods=2000, waiters=8, runs=4, rounds=1))
    parsed: dict[str, Any] = json.loads(json.dumps(figures))
    return parsed


def test_in_process_figures_are_every_latency_rate_and_memory_figure_of_bench_run(
    run_results: dict[str, Any],
) -> None:
    figures = compare.in_process_figures(run_results)
    for row in ("filter_plain", "filter_gang_fresh", "prioritize", "preempt_gang_from_plan"):
        assert figures[f"{row} p50 ms"] == run_results[row]["p50_ms"]
        assert figures[f"{row} p99 ms"] == run_results[row]["p99_ms"]
    assert figures["watch_events_per_second_status_only /s"] > 0
    assert figures["bytes_per_cached_pod bytes"] > 0
    assert figures["hypernodes_relabel ms"] == run_results["hypernodes_relabel_ms"]
    # Behaviour checks and same-run ratios are not speeds to compare.
    assert not [f for f in figures if f.startswith(("ratio_", "threads_", "plan_evictions"))]
    assert all(f.rsplit(" ", 1)[1] in {"ms", "/s", "bytes"} for f in figures)


def test_a_gang_members_calls_add_prioritize_only_when_the_filter_passed_several_nodes(
    run_results: dict[str, Any],
) -> None:
    figures = compare.in_process_figures(run_results)
    assert run_results["filter_gang_cached_nodes"] == 1  # this main's filter names the node
    assert (
        figures["gang member filter and prioritize p50 ms"]
        == (run_results["filter_gang_cached"]["p50_ms"])
    )
    older = {k: v for k, v in run_results.items() if k != "filter_gang_cached_nodes"}
    summed = compare.gang_member_calls(older)
    assert summed["gang member filter and prioritize p99 ms"] == (
        run_results["filter_gang_cached"]["p99_ms"] + run_results["prioritize"]["p99_ms"]
    )
    assert compare.gang_member_calls({"filter_gang_cached": {"p50_ms": 1}}) == {}


def _case(case: str, rate: float, cpu: float | None = 2.0) -> e2e.CaseResult:
    return e2e.CaseResult(
        case=case,
        description="x",
        pods=2000,
        bound=2000,
        span_seconds=10.0,
        pods_per_second=rate,
        pod_latency_p50=1.0,
        pod_latency_p99=2.0,
        extender_cpu_per_1000=cpu,
        verbs={"filter": (0.0004, 0.0012), "bind": (0.001, 0.003), "preempt": (0.0, 0.0)},
    )


def test_e2e_figures_read_what_bench_e2e_writes() -> None:
    plain, gangs = _case("b", 180.5), _case("c", 150.25)
    plain.wire = {"filter": (0.0005, 0.002), "metrics": (0.002, 0.002)}
    written = e2e.report_json({"date": "today", "cases": [plain, gangs, _case("a", 300, None)]})
    figures = compare.e2e_figures(json.loads(written))
    assert figures["e2e (b) pods/s"] == 180.5
    assert figures["e2e (c) pods/s"] == 150.25
    assert figures["e2e (b) extender CPU per 1000 pods s"] == 2.0
    assert figures["e2e (b) filter p50 ms"] == pytest.approx(0.4)
    assert figures["e2e (b) bind p99 ms"] == pytest.approx(3.0)
    assert figures["e2e (b) filter wire p99 ms"] == pytest.approx(2.0)
    assert "e2e (c) filter wire p50 ms" not in figures
    assert not [f for f in figures if "preempt" in f or "metrics" in f]  # not called / harness
    assert "e2e (a) extender CPU per 1000 pods s" not in figures  # no extender in (a)


def test_verdict_follows_the_figures_direction_and_the_tolerance() -> None:
    assert compare.Row("filter p50 ms", 1.0, 1.04).verdict(0.05) == "within 5%"
    assert compare.Row("filter p50 ms", 1.0, 1.06).verdict(0.05) == "WORSE"
    assert compare.Row("filter p50 ms", 1.0, 0.90).verdict(0.05) == "better"
    assert compare.Row("e2e (b) pods/s", 100.0, 96.0).verdict(0.05) == "within 5%"
    assert compare.Row("e2e (b) pods/s", 100.0, 94.0).verdict(0.05) == "WORSE"
    assert compare.Row("e2e (b) pods/s", 100.0, 110.0).verdict(0.05) == "better"
    assert compare.Row("bytes_per_cached_pod bytes", 1000.0, 1200.0).verdict(0.05) == "WORSE"
    assert compare.Row("only new p50 ms", None, 1.0).verdict(0.05) == "-"
    assert compare.Row("only new p50 ms", None, 1.0).ratio is None


def test_samples_take_each_sides_median_over_the_rounds_and_keep_the_first_order() -> None:
    samples = compare.Samples()
    for old, new in ((1.0, 1.1), (3.0, 0.9), (2.0, 1.0)):
        samples.add("old", {"filter_plain p50 ms": old, "e2e (b) pods/s": 100.0})
        samples.add("new", {"filter_plain p50 ms": new, "e2e (b) pods/s": 120.0, "new p99 ms": 1})
    rows = samples.rows()
    assert [r.figure for r in rows] == ["filter_plain p50 ms", "e2e (b) pods/s", "new p99 ms"]
    assert rows[0] == compare.Row("filter_plain p50 ms", 2.0, 1.0)
    assert rows[0].ratio == 0.5
    assert rows[2].old is None
    table = compare.render_table(rows, 0.05)
    assert table[:2] == ["| figure | old | new | new/old | verdict |", "|---|---|---|---|---|"]
    assert table[2] == "| filter_plain p50 ms | 2.00 | 1.00 | 0.500 | better |"
    assert table[3] == "| e2e (b) pods/s | 100.00 | 120.00 | 1.200 | better |"
    assert table[4] == "| new p99 ms | - | 1.00 | - | - |"
    wide = compare.render_table([compare.Row("watch_events_per_second_x /s", 60795.2, 58000)], 0.05)
    assert wide[2] == "| watch_events_per_second_x /s | 60,795 | 58,000 | 0.954 | within 5% |"


def test_rounds_alternate_which_side_goes_first() -> None:
    assert [compare.side_order(n) for n in (1, 2, 3)] == [
        ("old", "new"),
        ("new", "old"),
        ("old", "new"),
    ]


def _info() -> compare.RunInfo:
    return compare.RunInfo(
        old="985d682",
        new="ce123ef-dirty",
        rounds=3,
        command="python bench/compare.py --base 985d682 --write",
        machine="x86_64 Some CPU, 2 CPUs, 23 GiB, Python 3.11.7",
        load_before=(0.5, 0.25, 0.125),
        load_after=(1.0, 0.75, 0.5),
        date="2026-11-26 10:00 UTC",
    )


def test_the_section_replaces_its_previous_self_in_benchmarks_md(tmp_path: Path) -> None:
    rows = [compare.Row("filter_plain p50 ms", 0.8, 0.82)]
    section = compare.render_section(_info(), rows, 0.05)
    assert section.startswith(compare.MD_BEGIN + "\n## Old main vs new main (2026-11-26 10:00 UTC)")
    assert section.endswith(compare.MD_END + "\n")
    assert "`python bench/compare.py --base 985d682 --write`: old is 985d682" in section
    assert "x86_64 Some CPU, 2 CPUs" in section
    assert "0.50 / 0.25 / 0.12 before the run, 1.00 / 0.75 / 0.50 after it" in section
    assert "| filter_plain p50 ms | 0.80 | 0.82 | 1.025 | within 5% |" in section

    # The real BENCHMARKS.md, as it was before any comparison was written into it.
    real = (REPO / "BENCHMARKS.md").read_text()
    if compare.MD_BEGIN in real:
        start = real.index(compare.MD_BEGIN)
        end = real.index(compare.MD_END) + len(compare.MD_END) + 1
        # In place: what surrounds the section (readings written by hand) stays.
        replaced = compare.update_benchmarks_md(real, section)
        assert replaced == real[:start] + section + real[end:]
        real = real[:start] + real[end:]
    copy = tmp_path / "BENCHMARKS.md"
    copy.write_text(real)
    original = copy.read_text()
    first = compare.update_benchmarks_md(original, section)
    assert first.startswith(original.rstrip("\n")) and first.endswith(section)
    # Text written after the section survives a second run; the old figures do not.
    copy.write_text(first + "\n## later\n")
    later = compare.render_section(_info(), [compare.Row("filter_plain p50 ms", 0.8, 0.9)], 0.05)
    again = compare.update_benchmarks_md(copy.read_text(), later)
    assert again.count(compare.MD_BEGIN) == 1 and again.count(compare.MD_END) == 1
    assert "| 0.80 | 0.90 | 1.125 | WORSE |" in again and "1.025" not in again
    assert again.startswith(original.rstrip("\n")) and again.endswith("## later\n")
    # The e2e section is another benchmark's: untouched.
    assert again.count(e2e.MD_BEGIN) == original.count(e2e.MD_BEGIN)


def test_missing_kube_binaries_reads_build_kubes_own_list(tmp_path: Path) -> None:
    script = (REPO / "hack" / "build-kube").read_text()
    versions = (REPO / "hack" / "kube" / "versions.env").read_text()
    missing = compare.missing_kube_binaries(script, versions, tmp_path)
    assert {"etcd", "kube-apiserver", "kube-scheduler", "kubectl", "noop-extender"} <= set(missing)
    version = next(
        line.split("=", 1)[1] for line in versions.splitlines() if line.startswith("KUBE_VERSION=")
    )
    bin_dir = tmp_path / "kube" / version / "bin"
    bin_dir.mkdir(parents=True)
    for name in missing:
        (bin_dir / name).write_text("")
        (bin_dir / name).chmod(0o755)
    assert compare.missing_kube_binaries(script, versions, tmp_path) == []
    (bin_dir / "etcd").chmod(0o644)  # not executable: not usable
    assert compare.missing_kube_binaries(script, versions, tmp_path) == ["etcd"]
    assert compare.missing_kube_binaries("", versions, tmp_path) != []
