#!/usr/bin/env python3
"""`make bench`: what one filter or prioritize call costs kube-scheduler and the extender.

bench/e2e.py's pods/s move by a tenth or more between rounds of one run
(the machine's speed drifts, and every process's CPU per pod with it), so
a change of a few per cent in what a verb call costs cannot be read there.
This measures the call itself: hack/kube/cmd/verb-client calls one verb
through kube-scheduler's own HTTPExtender (the pinned
k8s.io/kubernetes/pkg/scheduler), for a plain pod and the node names
kube-scheduler sends at `--nodes` nodes (or `--names`), one call after the
other on one kept-alive connection, `--calls` calls per trial. The
extenders under test run side by side on the bench control plane:
gang-extender from this checkout, the no-op Go extender (the yardstick
bench/e2e.py's case (n) uses), and with `--base-checkout` gang-extender
from another checkout (old main, say). Trials take turns between them (in
one order, then the reverse), so drift falls on each alike, and each
figure is the median of the trials per call: the client's CPU (what
kube-scheduler spends), the extender's CPU, the wall time, and the latency
p50 and p99.

Two floors take their turns too (bench/verbfloor.py): a pass-through verb
served by uvicorn as gang-extender's verbs port is, and the same verb
answered by a bare asyncio protocol. gang-extender less the uvicorn floor
is what its own verb code costs per call; the uvicorn floor less the bare
one is the HTTP server's per-request machinery.

`make bench` runs it twice: at 500 nodes (230 names a call), and at 5,000
(500 names), the size the verb latency targets are set for (filter p99 <=
2 ms, prioritize p99 <= 5 ms on the wire as kube-scheduler sees it). Here
the p99 is that of kube-scheduler's own client on a machine that is
otherwise idle; bench/e2e.py's scale step gives the same verbs' p99 while
kube-scheduler, the API server and etcd keep both CPUs busy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import e2e
from hack.clusterkit import REPO, start_ready, stop_process

OURS, NOOP = "gang-extender", "no-op Go extender"
FLOORS = {"uvicorn": "floor: pass-through on uvicorn", "bare": "floor: pass-through, bare protocol"}


def names_sent(nodes: int) -> int:
    """How many node names kube-scheduler sends an extender in a cluster of `nodes`.

    It stops looking for feasible nodes once it has found this many and
    passes only those on (numFeasibleNodesToFind in pkg/scheduler/
    schedule_one.go, with the default adaptive percentageOfNodesToScore:
    50% less one point per 125 nodes, at least 5%, at least 100 nodes).
    """
    if nodes < 100:
        return nodes
    percentage = max(50 - nodes // 125, 5)
    return max(nodes * percentage // 100, 100)


@dataclass(frozen=True)
class Trial:
    """One trial: `calls` calls of `verb` to the extender `label`, and what they cost."""

    label: str
    verb: str
    calls: int
    client_seconds: float
    extender_seconds: float
    wall_seconds: float
    p50_seconds: float
    p99_seconds: float


@dataclass(frozen=True)
class Figures:
    """Medians over one extender's trials of one verb, in microseconds per call."""

    label: str
    verb: str
    client_us: float
    extender_us: float
    wall_us: float
    p50_us: float
    p99_us: float
    # client, extender and wall per call / gang-extender's: the median over the trials that
    # ran next to each other (the k-th of each), so a drift between pairs cancels out.
    to_ours: tuple[float, float, float] | None = None


def plan(labels: Sequence[str], trials: int) -> list[str]:
    """`trials` turns for each label: in the given order, then reversed, and so on."""
    order: list[str] = []
    for i in range(trials):
        order += labels if i % 2 == 0 else list(reversed(labels))
    return order


_COSTS = ("client_seconds", "extender_seconds", "wall_seconds")


def _per_call(trial: Trial, seconds: str) -> float:
    return 1e6 * float(getattr(trial, seconds)) / trial.calls


def summarize(trials: Sequence[Trial]) -> list[Figures]:
    """The medians per call, one row per (extender, verb), in the order they first ran."""
    keys = list(dict.fromkeys((t.label, t.verb) for t in trials))

    def of(label: str, verb: str) -> list[Trial]:
        return [t for t in trials if (t.label, t.verb) == (label, verb)]

    def paired(mine: list[Trial], ours: list[Trial]) -> tuple[float, float, float] | None:
        if not ours or mine is ours:
            return None
        pairs = list(zip(mine, ours, strict=False))
        client, extender, wall = (
            statistics.median(e2e.ratio(_per_call(a, cost), _per_call(b, cost)) for a, b in pairs)
            for cost in _COSTS
        )
        return client, extender, wall

    rows = []
    for label, verb in keys:
        mine = of(label, verb)
        client, extender, wall = (statistics.median(_per_call(t, c) for t in mine) for c in _COSTS)
        rows.append(
            Figures(
                label,
                verb,
                client_us=client,
                extender_us=extender,
                wall_us=wall,
                p50_us=statistics.median(1e6 * t.p50_seconds for t in mine),
                p99_us=statistics.median(1e6 * t.p99_seconds for t in mine),
                to_ours=paired(mine, of(OURS, verb)) if label != OURS else None,
            )
        )
    return rows


def render(rows: Sequence[Figures], command: str) -> str:
    """A Markdown table, each row also as its paired ratios to gang-extender's (same verb)."""
    lines = [
        f"`{command}`",
        "",
        "| verb | extender | client (kube-scheduler) CPU µs / call | extender CPU µs / call "
        "| wall µs / call | p50 / p99 µs | client, extender, wall / gang-extender's "
        "(median of paired trials) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratios = "-" if r.to_ours is None else ", ".join(f"{v:.2f}" for v in r.to_ours)
        lines.append(
            f"| {r.verb} | {r.label} | {r.client_us:.1f} | {r.extender_us:.1f} | {r.wall_us:.1f} "
            f"| {r.p50_us:.0f} / {r.p99_us:.0f} | {ratios} |"
        )
    return "\n".join(lines)


def run_trial(
    client: Path,
    url: str,
    pid: int,
    label: str,
    verb: str,
    names: int,
    calls: int,
    client_gogc: str | None = None,
) -> Trial:
    """One run of verb-client against the extender at `url` (process `pid`).

    client_gogc: the client's GOGC (None: Go's default, as kube-scheduler runs).
    """
    env = None if client_gogc is None else {**os.environ, "GOGC": client_gogc}
    before = e2e.cpu_seconds(pid)
    out = subprocess.run(
        [
            str(client),
            f"--url={url}",
            f"--verb={verb}",
            f"--nodes={names}",
            f"--calls={calls}",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    extender = e2e.cpu_seconds(pid) - before
    if out.returncode != 0:
        raise RuntimeError(f"verb-client against {label} failed: {out.stderr.strip()}")
    got = json.loads(out.stdout)
    return Trial(
        label,
        verb,
        int(got["calls"]),
        float(got["cpu_seconds"]),
        extender,
        float(got["wall_seconds"]),
        float(got["p50_seconds"]),
        float(got["p99_seconds"]),
    )


class Floor:
    """A bench/verbfloor.py server on 127.0.0.1:`port`."""

    def __init__(self, server: str, port: int, log_path: Path) -> None:
        self.process = start_ready(
            [sys.executable, "-m", "bench.verbfloor", f"--server={server}", f"--port={port}"],
            f"http://127.0.0.1:{port}/healthz",
            log_path,
            f"the {server} floor",
            30,
        )
        self.url = f"http://127.0.0.1:{port}/scheduler"

    def stop(self) -> None:
        stop_process(self.process, grace=15)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500, help="fake nodes (default 500)")
    parser.add_argument(
        "--names",
        type=int,
        help="node names per call (default: what kube-scheduler sends at --nodes nodes)",
    )
    parser.add_argument("--calls", type=int, default=3000, help="calls per trial (default 3000)")
    parser.add_argument(
        "--trials", type=int, default=6, help="trials per extender and verb (default 6)"
    )
    parser.add_argument(
        "--verbs", default="filter,prioritize", help="comma-separated (default filter,prioritize)"
    )
    parser.add_argument(
        "--base-checkout",
        type=Path,
        help="also run gang-extender from this checkout's app/ (e.g. `git archive` of old main)",
    )
    parser.add_argument(
        "--client-gogc",
        help="the client's GOGC, e.g. `off` to read the servers' tail without the client's "
        "garbage collector (default: Go's, as kube-scheduler runs)",
    )
    parser.add_argument("--json", type=Path, help="also write the trials and medians here")
    args = parser.parse_args(argv)
    if args.names is None:
        args.names = names_sent(args.nodes)
    if args.names > args.nodes:
        parser.error("--names cannot exceed --nodes: the extender knows only those nodes")
    verbs = [v.strip() for v in args.verbs.split(",") if v.strip()]
    if not verbs or not set(verbs) <= {"filter", "prioritize"}:
        parser.error(f"--verbs {args.verbs!r}: name filter, prioritize or both")
    bench = e2e.start_bench_cluster(args.nodes, log=lambda m: print(m, flush=True))
    cluster, logs = bench.cluster, bench.layout.logs
    client = cluster.bin_dir / "verb-client"
    port = bench.extender_port
    servers: dict[str, tuple[str, int, e2e.Extender | e2e.NoopExtender | Floor]] = {}
    try:
        ours = e2e.Extender(cluster.kubeconfig, port, logs / "verbcost-extender.log", [], REPO)
        servers[OURS] = (f"http://127.0.0.1:{port}/scheduler", ours.process.pid, ours)
        noop = e2e.NoopExtender(
            cluster.bin_dir, cluster.kubeconfig, port + 2, 2000, logs / "verbcost-noop.log"
        )
        servers[NOOP] = (noop.url, noop.process.pid, noop)
        if args.base_checkout is not None:
            label = f"base: {args.base_checkout}"
            base = e2e.Extender(
                cluster.kubeconfig, port + 1, logs / "verbcost-base.log", [], args.base_checkout
            )
            servers[label] = (f"http://127.0.0.1:{port + 1}/scheduler", base.process.pid, base)
        for offset, (kind, label) in enumerate(FLOORS.items(), start=3):
            floor = Floor(kind, port + offset, logs / f"verbcost-floor-{kind}.log")
            servers[label] = (floor.url, floor.process.pid, floor)
        bench.runner.settle()
        trials = []
        for verb in verbs:
            for label in plan(list(servers), args.trials):
                url, pid, _ = servers[label]
                trial = run_trial(
                    client, url, pid, label, verb, args.names, args.calls, args.client_gogc
                )
                trials.append(trial)
                print(
                    f"{verb} {label}: client {1e6 * trial.client_seconds / trial.calls:.1f} µs, "
                    f"extender {1e6 * trial.extender_seconds / trial.calls:.1f} µs per call",
                    flush=True,
                )
    finally:
        for _, _, server in servers.values():
            server.stop()
        bench.down()
    rows = summarize(trials)
    command = "python -m bench.verbcost " + " ".join(argv if argv is not None else sys.argv[1:])
    print()
    print(render(rows, command.strip()))
    if args.json:
        payload = {"trials": [asdict(t) for t in trials], "medians": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"bench.verbcost took {time.monotonic() - started:.0f}s", flush=True)
    sys.exit(code)
