#!/usr/bin/env python3
"""`make bench-plots`: BENCHMARKS.md's plots, drawn from the benchmarks' JSON results.

Each plot is one function that takes a script's `--json` output (as parsed)
and writes one PNG:

  - pods per second against nodes, from bench/e2e.py (cases a, b, c, d, n,
    p, q; the median of the rounds at each size it measured);
  - the contention timelines, from bench.contention (for each mode, the
    gangs waiting, partly bound, running and done over time, with the
    makespan and its lower bound);
  - admission time against line length, from bench/run.py --line-sweep (a
    fresh gang of 8's filter p50 and p99, without queues and with them).

`make bench` writes the JSON to bench/results/ and then runs this; `make
bench-plots` only runs this, on the committed JSON. The images go to
docs/benchmarks/img/. Same JSON, same bytes: a fixed size and resolution,
matplotlib's own defaults rather than a user's matplotlibrc, no software
version or date in the PNG's metadata.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib import rc_context, rcParamsDefault
from matplotlib.figure import Figure

# Run by path (`python bench/plots.py`), sys.path[0] is bench/: the repository root makes
# bench/ importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results import CONTENTION_JSON, E2E_JSON, LINE_BLOCKED_JSON, LINE_JSON
from hack.clusterkit import REPO

IMG = REPO / "docs" / "benchmarks" / "img"
SIZE_INCHES = (8.0, 4.5)
DPI = 100
SIZE_PIXELS = (int(SIZE_INCHES[0] * DPI), int(SIZE_INCHES[1] * DPI))
"""Every plot's width and height in pixels."""

E2E_CASES = "abcdnpq"
"""The end-to-end cases on the pods-per-second plot, in its legend's order."""

TIMELINE = ("waiting", "partial", "running", "done")
TIMELINE_LABELS = {
    "waiting": "no member bound",
    "partial": "some members bound",
    "running": "all bound, running",
    "done": "finished",
}
TIMELINE_COLOURS = {
    "waiting": "#bbbbbb",
    "partial": "#d62728",
    "running": "#1f77b4",
    "done": "#2ca02c",
}


class BadResults(ValueError):
    """A results file that lacks what a plot reads: the message says which file and what."""


def _figure(height: float = SIZE_INCHES[1]) -> Figure:
    return Figure(figsize=(SIZE_INCHES[0], height), dpi=DPI, layout="constrained")


def _save(figure: Figure, out: Path) -> Path:
    """PNG without the Software entry (matplotlib's version) and no date: same input, same bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=DPI, format="png", metadata={"Software": None})
    return out


def _caption(results: Mapping[str, Any]) -> str:
    """The run a plot shows: date, commit and machine, as far as the JSON says."""
    parts = [str(results[k]) for k in ("date", "commit") if results.get(k)]
    machine = results.get("machine")
    if machine:
        parts.append(str(machine).split(",")[0])
    return ", ".join(parts)


def _need(results: Mapping[str, Any], key: str, what: str) -> Any:
    if not isinstance(results, Mapping) or key not in results:
        raise BadResults(f"no {key!r} field ({what})")
    return results[key]


# ---- the plots -------------------------------------------------------------------------


def e2e_rates(results: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """bench/e2e.py's cases by letter: nodes -> the median pods/s of that case's rounds there."""
    rates: dict[str, dict[int, list[float]]] = {}
    for case in _need(results, "cases", "bench/e2e.py's cases"):
        try:
            letter = str(case["case"]).split("-")[0]
            nodes, rate = int(case["nodes"]), float(case["pods_per_second"])
        except (KeyError, TypeError, ValueError) as err:
            raise BadResults(f"a case without case, nodes and pods_per_second: {err}") from None
        rates.setdefault(letter, {}).setdefault(nodes, []).append(rate)
    return {
        letter: {n: statistics.median(values) for n, values in sorted(by_nodes.items())}
        for letter, by_nodes in rates.items()
    }


def pods_per_second(results: Mapping[str, Any], out: Path) -> Path:
    """Pods per second kube-scheduler placed against the cluster's nodes, one line per case."""
    rates = e2e_rates(results)
    descriptions = {
        str(c["case"]).split("-")[0]: str(c.get("description", "")) for c in results["cases"]
    }
    with rc_context(rcParamsDefault):
        figure = _figure()
        axes = figure.add_subplot()
        sizes: set[int] = set()
        # A marker of its own per case: two cases at the same rate still both show.
        for letter, marker in zip(E2E_CASES, "osD^vPX", strict=True):
            if letter not in rates:
                continue
            by_nodes = rates[letter]
            sizes.update(by_nodes)
            axes.plot(
                list(by_nodes),
                list(by_nodes.values()),
                marker=marker,
                markerfacecolor="none",
                label=f"({letter}) {descriptions[letter]}",
            )
        if not sizes:
            raise BadResults(f"none of the cases {', '.join(E2E_CASES)}")
        axes.set_xscale("log")
        axes.set_xticks(sorted(sizes), [f"{n:,}" for n in sorted(sizes)])
        axes.minorticks_off()
        axes.set_xlabel("nodes")
        axes.set_ylabel("pods per second (median of the rounds)")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small", loc="best")
        axes.set_title(f"kube-scheduler end to end\n{_caption(results)}", fontsize="medium")
        return _save(figure, out)


def contention_timelines(results: Mapping[str, Any], out: Path) -> Path:
    """Each mode's gangs over time (stacked: waiting, partly bound, running, done), with the
    makespan and the lower bound sum(work) / capacity marked."""
    modes = _need(results, "modes", "bench.contention's modes")
    if not modes:
        raise BadResults("no mode ran")
    with rc_context(rcParamsDefault):
        figure = _figure(2.6 * len(modes) + 0.6)
        grid = figure.subplots(len(modes), 1, sharex=True, squeeze=False)
        for axes, (mode, figures) in zip(
            grid[:, 0], sorted(modes.items(), reverse=True), strict=True
        ):
            timeline = _need(figures, "timeline", f"mode {mode}'s timeline")
            if not timeline:
                raise BadResults(f"mode {mode}'s timeline is empty")
            try:
                seconds = [float(sample[0]) for sample in timeline]
                columns = [[float(s[1 + i]) for s in timeline] for i in range(len(TIMELINE))]
                makespan = float(figures["makespan"])
                bound = float(figures["lower_bound"])
                partial = float(figures["longest_partial"])
            except (KeyError, IndexError, TypeError, ValueError) as err:
                raise BadResults(f"mode {mode}: {type(err).__name__} {err}") from None
            axes.stackplot(
                seconds,
                columns,
                labels=[TIMELINE_LABELS[k] for k in TIMELINE],
                colors=[TIMELINE_COLOURS[k] for k in TIMELINE],
                step="post",
            )
            axes.axvline(bound, color="black", linestyle="--", linewidth=1, label="lower bound")
            axes.axvline(makespan, color="black", linewidth=1, label="makespan")
            axes.set_ylabel("gangs")
            axes.set_title(
                f"--gang-feasibility={'true' if mode == 'on' else 'false'}: makespan "
                f"{makespan:.0f} s, {makespan / bound:.2f} x the lower bound; "
                f"longest partial binding {partial:.0f} s",
                fontsize="medium",
            )
            axes.margins(x=0, y=0)
        grid[-1, 0].set_xlabel("seconds since the first pod was created")
        grid[0, 0].legend(fontsize="small", loc="upper right")
        figure.suptitle(f"Gangs under contention, {_caption(results)}", fontsize="medium")
        return _save(figure, out)


def admission_by_line(results: Mapping[str, Any], out: Path) -> Path:
    """A fresh gang of 8's admission p50 and p99 against the gangs in line, per queue setting."""
    points = _need(results, "points", "bench/run.py --line-sweep's points")
    series: dict[str, dict[int, tuple[float, float]]] = {}
    try:
        for point in points:
            series.setdefault(str(point["queues"]), {})[int(point["line"])] = (
                float(point["p50_ms"]),
                float(point["p99_ms"]),
            )
    except (KeyError, TypeError, ValueError) as err:
        raise BadResults(f"a point without line, queues, p50_ms and p99_ms: {err}") from None
    if not series:
        raise BadResults("no points")
    lengths = sorted({n for by_line in series.values() for n in by_line})
    where = {n: i for i, n in enumerate(lengths)}  # evenly spaced: 0 has no place on a log axis
    with rc_context(rcParamsDefault):
        figure = _figure()
        axes = figure.add_subplot()
        ordered = sorted(series.items(), key=lambda item: (item[0] != "none", item[0]))
        for index, (queues, by_line) in enumerate(ordered):
            colour = f"C{index}"
            name = "no queues" if queues == "none" else f"{queues} queues"
            if results.get("blocked"):  # --line-blocked: the line's gangs are aged and hold room
                name = f"blocked line, {name}"
            xs = [where[n] for n in sorted(by_line)]
            axes.plot(
                xs,
                [by_line[n][0] for n in sorted(by_line)],
                color=colour,
                marker="o",
                label=f"{name}, p50",
            )
            axes.plot(
                xs,
                [by_line[n][1] for n in sorted(by_line)],
                color=colour,
                marker="^",
                linestyle="--",
                label=f"{name}, p99",
            )
        axes.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths])
        axes.set_yscale("log")
        axes.set_xlabel("gangs waiting in line")
        axes.set_ylabel("filter of a fresh gang of 8, ms")
        axes.grid(alpha=0.3, which="both")
        axes.legend(fontsize="small", loc="upper left")
        nodes, pods = results.get("nodes"), results.get("pods")
        size = f" ({nodes:,} nodes, {pods:,} pods)" if nodes and pods else ""
        axes.set_title(
            f"A fresh gang's admission against the line's length{size}\n{_caption(results)}",
            fontsize="medium",
        )
        return _save(figure, out)


Plot = Callable[[Mapping[str, Any], Path], Path]
PLOTS: tuple[tuple[Path, str, Plot], ...] = (
    (E2E_JSON, "pods-per-second.png", pods_per_second),
    (CONTENTION_JSON, "contention.png", contention_timelines),
    (LINE_JSON, "admission-by-line.png", admission_by_line),
    (LINE_BLOCKED_JSON, "admission-by-blocked-line.png", admission_by_line),
)
"""Each plot: the results file it reads, the image it writes (under IMG), the function."""


def draw(results_file: Path, image: Path, plot: Plot) -> Path:
    """One plot from one results file; a file that is not JSON or lacks a field is a
    BadResults naming the file."""
    try:
        results = json.loads(results_file.read_text())
        return plot(results, image)
    except json.JSONDecodeError as err:
        raise BadResults(f"{results_file}: not JSON ({err})") from None
    except BadResults as err:
        raise BadResults(f"{results_file}: {err}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--results", type=Path, help="read <name>.json from this directory (default bench/results)"
    )
    parser.add_argument("--out", type=Path, default=IMG, help=f"write the PNGs here ({IMG})")
    args = parser.parse_args(argv)
    failed = False
    for results_file, name, plot in PLOTS:
        source = args.results / results_file.name if args.results else results_file
        if not source.exists():
            print(f"{source}: not there, {name} not drawn (its benchmark has not run)")
            continue
        try:
            written = draw(source, args.out / name, plot)
        except (BadResults, OSError) as err:
            print(f"{name} not drawn: {err}", file=sys.stderr)
            failed = True
            continue
        print(f"{written} from {source}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
