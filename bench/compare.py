#!/usr/bin/env python3
"""`make bench-compare`: an older main and this checkout measured side by side in one run.

Figures measured on different days on a shared machine say little about a
change; the same figures measured in the same run, the two sides taking
turns, do. This exports BASE (default 985d682, main before app/ was split
into layers) with `git archive` into a temporary directory outside the
repository and runs, for --rounds rounds (old then new in odd rounds, new
then old in even ones, so that a noisy neighbour or a drift over the run hits
both sides alike):

  - bench/run.py, each side's own (the verbs in process over the real ASGI
    app), with that side's checkout on PYTHONPATH;
  - with --e2e, this checkout's bench/e2e.py (the real kube-scheduler against
    a local control plane) with the extender started from that side's
    checkout (--extender-checkout): plain pods and gangs per second, and the
    verbs' latency as the extender's histogram and the wire saw them.

Each figure is the median of its rounds; the table gives new/old and whether
the new one is within --tolerance of the old one (or better). --write puts
the table, the machine and the command into BENCHMARKS.md's section
"Old main vs new main", replacing the previous one.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run by path (`python bench/compare.py`), sys.path[0] is bench/: the repository root makes
# bench/ importable as a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e import replace_marked_section
from bench.results import machine_description
from hack.clusterkit import REPO

DEFAULT_BASE = "985d682"
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
MD_BEGIN = "<!-- compare:begin (written by bench/compare.py) -->"
MD_END = "<!-- compare:end -->"
SIDES = ("old", "new")
VERBS = ("filter", "prioritize", "preempt", "bind")
"""What kube-scheduler calls the extender for."""

Figures = dict[str, float]
"""Figure name -> value; the name's last word is its unit (ms, s, bytes, /s, pods/s)."""


# ---- pure parts (unit-tested in tests/unit/test_bench_compare.py) ----------------------


def in_process_figures(results: Mapping[str, Any]) -> Figures:
    """The comparable figures of bench/run.py's --json: latencies, event rates, memory.

    Same-run ratios (ratio_*), thread counts and plan sizes are left out: they
    are checks of behaviour, not speeds to hold within a tolerance.
    """
    figures: Figures = {}
    for key, value in results.items():
        if isinstance(value, Mapping) and "p50_ms" in value and "p99_ms" in value:
            figures[f"{key} p50 ms"] = float(value["p50_ms"])
            figures[f"{key} p99 ms"] = float(value["p99_ms"])
        elif key.startswith("watch_events_per_second_"):
            figures[f"{key} /s"] = float(value)
        elif key.startswith("bytes_per_"):
            figures[f"{key} bytes"] = float(value)
        elif key.endswith("_ms") and not key.startswith("ratio_"):
            figures[f"{key.removesuffix('_ms')} ms"] = float(value)
    figures.update(gang_member_calls(results))
    return figures


def gang_member_calls(results: Mapping[str, Any]) -> Figures:
    """What kube-scheduler waits for per admitted gang member: the filter, then prioritize
    unless the filter answered one node (kube-scheduler then scores nothing).

    Comparable where the two verbs are not: a filter that names the member's
    node does prioritize's work. bench/run.py writes how many nodes that
    filter answered since it started naming one; an older one did not, and
    its filter passed every node. Sums of the two verbs' p50s (p99s).
    """
    filtered, scored = results.get("filter_gang_cached"), results.get("prioritize")
    if not isinstance(filtered, Mapping) or not isinstance(scored, Mapping):
        return {}
    named = results.get("filter_gang_cached_nodes") == 1
    return {
        f"gang member filter and prioritize {q} ms": float(filtered[f"{q}_ms"])
        + (0.0 if named else float(scored[f"{q}_ms"]))
        for q in ("p50", "p99")
    }


def e2e_figures(report: Mapping[str, Any]) -> Figures:
    """The comparable figures of bench/e2e.py's --json, per case that ran.

    Throughput, the extender's CPU per 1,000 pods, and each verb's p50/p99
    from the extender's own histogram and, when captured, on the wire. A verb
    not called in the case (all zero) and the harness's own /metrics scrapes
    seen on the wire are not kube-scheduler's latency: left out.
    """
    figures: Figures = {}
    for case in report.get("cases", []):
        name = f"e2e ({case['case']})"
        figures[f"{name} pods/s"] = float(case["pods_per_second"])
        if case.get("extender_cpu_per_1000") is not None:
            figures[f"{name} extender CPU per 1000 pods s"] = float(case["extender_cpu_per_1000"])
        for where, latencies in (("", case.get("verbs") or {}), (" wire", case.get("wire") or {})):
            for verb, (p50, p99) in latencies.items():
                if verb in VERBS and (p50 or p99):
                    figures[f"{name} {verb}{where} p50 ms"] = float(p50) * 1000
                    figures[f"{name} {verb}{where} p99 ms"] = float(p99) * 1000
    return figures


def higher_is_better(figure: str) -> bool:
    """Rates (a unit per second) improve upwards; times and bytes downwards."""
    return figure.endswith("/s")


@dataclass(frozen=True)
class Row:
    figure: str
    old: float | None
    new: float | None

    @property
    def ratio(self) -> float | None:
        if self.old is None or self.new is None or self.old == 0:
            return None
        return self.new / self.old

    def verdict(self, tolerance: float) -> str:
        """ "better", "within N%" or "WORSE" (beyond the tolerance), in the figure's direction."""
        if self.ratio is None:
            return "-"
        gain = self.ratio - 1 if higher_is_better(self.figure) else 1 - self.ratio
        if gain > tolerance:
            return "better"
        if gain >= -tolerance:
            return f"within {tolerance:.0%}"
        return "WORSE"


class Samples:
    """Every round's figures of both sides; a figure's value is the median of its rounds."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
        self.order: dict[str, None] = {}

    def add(self, side: str, figures: Figures) -> None:
        for figure, value in figures.items():
            self.values[side].setdefault(figure, []).append(value)
            self.order.setdefault(figure)

    def median(self, side: str, figure: str) -> float | None:
        values = self.values[side].get(figure)
        return statistics.median(values) if values else None

    def rows(self) -> list[Row]:
        return [Row(f, self.median("old", f), self.median("new", f)) for f in self.order]


def _number(figure: str, value: float | None) -> str:
    if value is None:
        return "-"
    if figure.endswith(("bytes", "/s")) and value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def render_table(rows: Sequence[Row], tolerance: float) -> list[str]:
    """| figure | old | new | new/old | verdict | as Markdown lines."""
    lines = ["| figure | old | new | new/old | verdict |", "|---|---|---|---|---|"]
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.3f}"
        lines.append(
            f"| {row.figure} | {_number(row.figure, row.old)} | {_number(row.figure, row.new)} "
            f"| {ratio} | {row.verdict(tolerance)} |"
        )
    return lines


@dataclass(frozen=True)
class RunInfo:
    """What a reader needs to weigh the table: the code on each side, how, and where."""

    old: str
    new: str
    rounds: int
    command: str
    machine: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    date: str


def render_section(info: RunInfo, rows: Sequence[Row], tolerance: float) -> str:
    """BENCHMARKS.md's "Old main vs new main" section, between its markers."""

    def load(values: tuple[float, float, float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    lines = [
        MD_BEGIN,
        f"## Old main vs new main ({info.date})",
        "",
        f"`{info.command}`: old is {info.old}, new is {info.new}; {info.rounds} round(s), "
        "the two sides taking turns (old first in odd rounds, new first in even ones); "
        "each figure is the median of its rounds. Lower is better except for the rates "
        f"(/s); a verdict is within {tolerance:.0%} of the old figure, better, or WORSE.",
        "",
        f"Machine: {info.machine}; load average (1 / 5 / 15 min) {load(info.load_before)} "
        f"before the run, {load(info.load_after)} after it.",
        "",
        *render_table(rows, tolerance),
        MD_END,
    ]
    return "\n".join(lines) + "\n"


def update_benchmarks_md(text: str, section: str) -> str:
    """Replace the previous comparison section or append one."""
    return replace_marked_section(text, section, MD_BEGIN, MD_END)


def side_order(round_number: int) -> tuple[str, ...]:
    """Old first in odd rounds, new first in even ones (rounds count from 1)."""
    return SIDES if round_number % 2 else SIDES[::-1]


def missing_kube_binaries(build_script: str, versions: str, cache: Path) -> list[str]:
    """Which of hack/build-kube's components are not in its cache yet.

    The component list and the version come from hack/build-kube and
    versions.env themselves, so this cannot drift from what they build.
    """
    components = re.search(r"^components=\(([^)]*)\)", build_script, re.MULTILINE)
    version = re.search(r"^KUBE_VERSION=(\S+)", versions, re.MULTILINE)
    if components is None or version is None:
        return ["(hack/build-kube's component list or the KUBE_VERSION pin not found)"]
    bin_dir = cache / "kube" / version.group(1).strip("\"'") / "bin"
    return [c for c in components.group(1).split() if not os.access(bin_dir / c, os.X_OK)]


# ---- running the benchmarks -------------------------------------------------------------


def kube_cache() -> Path:
    """hack/build-kube's cache directory (GANG_CACHE_DIR, else XDG's cache)."""
    if os.environ.get("GANG_CACHE_DIR"):
        return Path(os.environ["GANG_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gang-extender"


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextlib.contextmanager
def exported(base: str) -> Iterator[Path]:
    """BASE's files (no .git) in a temporary directory outside the repository."""
    with tempfile.TemporaryDirectory(prefix="gang-bench-base-") as tmp:
        archive = Path(tmp) / "base.tar"
        git("archive", "--format=tar", f"--output={archive}", base)
        checkout = Path(tmp) / "checkout"
        with tarfile.open(archive) as tar:
            tar.extractall(checkout, filter="data")
        archive.unlink()
        yield checkout


def run_logged(argv: Sequence[str], pythonpath: Path, cwd: Path, log: Path) -> None:
    """Run one bench process (output to `log`); a failure shows the log's end and stops."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    began = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    print(f"    {time.monotonic() - began:.0f} s, log {log}", flush=True)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{tail}")


def in_process(python: str, checkout: Path, run_args: Sequence[str], work: Path) -> Figures:
    """`checkout`'s own bench/run.py, its app/ first on the path."""
    out = work / "run.json"
    argv = [python, str(checkout / "bench" / "run.py"), "--json", str(out), *run_args]
    run_logged(argv, checkout, checkout, work / "run.log")
    return in_process_figures(json.loads(out.read_text()))


def end_to_end(python: str, checkout: Path, e2e_args: Sequence[str], work: Path) -> Figures:
    """This checkout's bench/e2e.py, one round, the extender run from `checkout`."""
    out = work / "e2e.json"
    argv = [python, str(REPO / "bench" / "e2e.py"), "--rounds", "1", "--json", str(out)]
    argv += ["--extender-checkout", str(checkout), *e2e_args]
    run_logged(argv, REPO, REPO, work / "e2e.log")
    return e2e_figures(json.loads(out.read_text()))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"old side (default {DEFAULT_BASE})")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="default 0.05 (5%%)")
    parser.add_argument("--python", default=sys.executable, help="interpreter of every run")
    for flag in ("--nodes", "--pods", "--waiters", "--runs"):
        parser.add_argument(flag, help=f"bench/run.py {flag} (default: its own)")
    parser.add_argument("--skip-in-process", action="store_true", help="no bench/run.py")
    parser.add_argument("--e2e", action="store_true", help="also bench/e2e.py (needs make kube)")
    parser.add_argument("--e2e-cases", default="bc", help="bench/e2e.py --cases (default bc)")
    parser.add_argument("--e2e-nodes", default="500", help="bench/e2e.py --nodes (default 500)")
    parser.add_argument("--e2e-pods", default="2000", help="bench/e2e.py --pods (default 2000)")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md's section")
    parser.add_argument("--benchmarks", type=Path, default=BENCHMARKS_MD, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def check_kube() -> None:
    missing = missing_kube_binaries(
        (REPO / "hack" / "build-kube").read_text(),
        (REPO / "hack" / "kube" / "versions.env").read_text(),
        kube_cache(),
    )
    if missing:
        raise SystemExit(f"--e2e needs the kube binaries (make kube), missing {', '.join(missing)}")


def measure(args: argparse.Namespace, checkouts: Mapping[str, Path], work: Path) -> Samples:
    """The interleaved rounds; each run's output in its own directory under `work`."""
    run_args = [
        item
        for flag in ("nodes", "pods", "waiters", "runs")
        if getattr(args, flag) is not None
        for item in (f"--{flag}", getattr(args, flag))
    ]
    e2e_args = ["--cases", args.e2e_cases, "--nodes", args.e2e_nodes, "--pods", args.e2e_pods]
    e2e_args += ["--scale-nodes", "0", "--cache-pods", "0"]
    samples = Samples()
    for round_number in range(1, args.rounds + 1):
        for side in side_order(round_number):
            here = work / f"r{round_number}-{side}"
            here.mkdir()
            if not args.skip_in_process:
                print(f"round {round_number}, {side}: bench/run.py", flush=True)
                samples.add(side, in_process(args.python, checkouts[side], run_args, here))
            if args.e2e:
                print(f"round {round_number}, {side}: bench/e2e.py", flush=True)
                samples.add(side, end_to_end(args.python, checkouts[side], e2e_args, here))
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.e2e:
        check_kube()
    base = git("rev-parse", "--short", f"{args.base}^{{commit}}")
    head = git("describe", "--always", "--dirty", "--abbrev=7")
    load_before = os.getloadavg()
    # Kept after the run: each run's log and figures, to look into a surprising ratio.
    work = Path(tempfile.mkdtemp(prefix="gang-bench-compare-"))
    with exported(base) as old:
        print(f"old: {base} exported to {old}; new: this checkout ({head}) at {REPO}", flush=True)
        samples = measure(args, {"old": old, "new": REPO}, work)
    command = "python bench/compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info = RunInfo(
        old=base,
        new=head,
        rounds=args.rounds,
        command=command.strip(),
        machine=f"{machine_description()}, Python {platform.python_version()}",
        load_before=load_before,
        load_after=os.getloadavg(),
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
    section = render_section(info, samples.rows(), args.tolerance)
    print()
    print(section)
    print(f"each run's log and figures: {work}")
    if args.write:
        args.benchmarks.write_text(update_benchmarks_md(args.benchmarks.read_text(), section))
        print(f"updated {args.benchmarks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
