"""bench/plots.py: each plot drawn from small JSON, at the fixed size, the same bytes each time,
and a clear message for a results file that lacks what a plot reads.

That each benchmark's own JSON carries the fields its plot reads is checked beside
that benchmark's other tests (test_bench_e2e.py, test_bench_run.py, test_bench_contention.py).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from bench import plots


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def e2e_results() -> dict[str, Any]:
    def case(label: str, nodes: int, rate: float) -> dict[str, Any]:
        return {"case": label, "description": f"case {label[0]}", "nodes": nodes,
                "pods_per_second": rate}  # fmt: skip

    return {
        "date": "2026-11-28 10:00 UTC",
        "commit": "abc1234",
        "machine": "x86_64 Some CPU, 2 CPUs, 24 GiB",
        "cases": [
            case("a", 500, 400.0),
            case("a-r2", 500, 300.0),
            case("a-r3", 500, 350.0),
            case("b", 500, 280.0),
            case("q", 500, 390.0),
            case("g", 500, 380.0),  # not one of the plotted cases
            case("a-scale", 5000, 330.0),
            case("q-scale", 5000, 290.0),
        ],
    }


def contention_results() -> dict[str, Any]:
    def mode(makespan: float) -> dict[str, Any]:
        timeline = [[t * 0.5, max(0, 10 - t), min(t, 2), 3, t // 4, 20] for t in range(40)]
        return {"makespan": makespan, "lower_bound": 15.0, "longest_partial": 4.0,
                "timeline": timeline}  # fmt: skip

    return {"date": "2026-11-28 10:00 UTC", "modes": {"on": mode(20.0), "off": mode(30.0)}}


def line_results() -> dict[str, Any]:
    points = [
        {"line": n, "queues": q, "p50_ms": 1.0 + n / 100, "p99_ms": 2.0 + n / 50}
        for n in (0, 100, 1000, 10_000)
        for q in ("none", "20")
    ]
    return {"nodes": 5000, "pods": 50_000, "points": points}


PLOTS = [
    (plots.pods_per_second, e2e_results),
    (plots.contention_timelines, contention_results),
    (plots.admission_by_line, line_results),
]


@pytest.mark.parametrize(("plot", "results"), PLOTS, ids=lambda p: getattr(p, "__name__", ""))
def test_each_plot_writes_a_png_of_the_fixed_width_the_same_bytes_each_time(
    plot: plots.Plot, results: Any, tmp_path: Path
) -> None:
    first = plot(results(), tmp_path / "one.png")
    again = plot(results(), tmp_path / "two.png")
    width, height = png_size(first)
    assert width == plots.SIZE_PIXELS[0]
    assert height >= plots.SIZE_PIXELS[1]
    assert first.read_bytes() == again.read_bytes()
    assert b"matplotlib version" not in first.read_bytes()


def test_the_e2e_rates_are_each_cases_median_over_its_rounds_at_each_size() -> None:
    rates = plots.e2e_rates(e2e_results())
    assert rates["a"] == {500: 350.0, 5000: 330.0}
    assert rates["q"] == {500: 390.0, 5000: 290.0}
    assert rates["b"] == {500: 280.0}


@pytest.mark.parametrize(
    ("plot", "results", "message"),
    [
        (plots.pods_per_second, {"cases": []}, "none of the cases"),
        (plots.pods_per_second, {"cases": [{"case": "a"}]}, "without case, nodes"),
        (plots.contention_timelines, {}, "no 'modes' field"),
        (plots.contention_timelines, {"modes": {"on": {"timeline": []}}}, "timeline is empty"),
        (plots.admission_by_line, {"points": [{"line": 0}]}, "without line, queues"),
    ],
)
def test_results_without_what_a_plot_reads_say_what_is_missing(
    plot: plots.Plot, results: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(plots.BadResults, match=message):
        plot(results, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_main_draws_what_it_has_names_what_it_lacks_and_fails_on_bad_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, out = tmp_path / "results", tmp_path / "img"
    results.mkdir()
    (results / "line.json").write_text(json.dumps(line_results()))
    (results / "e2e.json").write_text(json.dumps(e2e_results()))
    assert plots.main(["--results", str(results), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["admission-by-line.png", "pods-per-second.png"]
    assert "contention.json: not there, contention.png not drawn" in capsys.readouterr().out
    (results / "line-blocked.json").write_text(json.dumps({**line_results(), "blocked": True}))
    assert plots.main(["--results", str(results), "--out", str(out)]) == 0
    assert (out / "admission-by-blocked-line.png").exists()

    (results / "contention.json").write_text("{not json")
    assert plots.main(["--results", str(results), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "contention.png not drawn" in err and "contention.json: not JSON" in err
