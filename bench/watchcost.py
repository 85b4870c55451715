#!/usr/bin/env python3
"""`make bench`, plain pods in the gang-only mode: what the extender's pod watch costs them.

In the gang-only mode (the default) kube-scheduler makes no call to the
extender for a plain pod that fits; what a plain pod still costs is the
extender's watch of every pod: the extender's CPU to apply the event, and
the API server's to send it. bench/e2e.py's (p)/(a) ratio is meant to show
that, but single rounds of it move by a fifth (the end of a case waits on
the API server's slowest bindings), so this measures the cost itself:
`--pods` plain pods per trial are bound through pods/binding by the harness
(no scheduler), in trials that take turns without and with the extender
running (without, with, with, without, ...), and for each trial it reads
the CPU seconds kube-apiserver and etcd spent (from /proc), and the
extender's, per 1,000 bindings. Every trial's pods are created before the
first trial, so that no trial pays for another's creation or deletion.

`--watchers extender,json,protobuf` puts bench/barewatch.py's pod watches,
which read every event in that encoding and keep nothing, in turn beside
the extender: what one more pod watcher costs the API server, apart from
what the extender does with the events, and by encoding.

It runs on bench/e2e.py's control plane (`.local-cluster-bench`, no
scheduler, `--nodes` fake nodes), which it brings down at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kubernetes.client import Configuration

from app.kube.http import AsyncApiClient
from app.kube.pods import PodApi
from bench import e2e
from hack.clusterkit import REPO, parse_metrics, sum_by_label, wait_for

# Bindings under way at once: enough to keep the API server busy, as kube-scheduler's
# binding goroutines do, without one trial's bindings outrunning the watches for long.
BINDINGS_IN_FLIGHT = 8
# After the last binding: the watches deliver what is still in flight.
DRAIN_SECONDS = 2.0


WATCHERS = ("extender", "json", "protobuf")
"""The extender itself, or bench/barewatch.py's watch in that encoding."""


@dataclass(frozen=True)
class Trial:
    """One trial's bindings and the CPU seconds they cost."""

    watcher: str  # one of WATCHERS, "" for none
    bindings: int
    control_plane_seconds: float
    watcher_seconds: float
    # Pod watch events the API server sent meanwhile, to every watcher, and their bytes.
    watch_events: float = 0.0
    watch_bytes: float = 0.0


@dataclass(frozen=True)
class Summary:
    """Medians over the trials without a watcher and with `watcher`, CPU s per 1,000 bindings."""

    watcher: str
    control_plane_without: float
    control_plane_with: float
    watcher_seconds: float
    # Pod watch events per binding, without and with the watcher, and bytes per event added.
    events_without: float = 0.0
    events_with: float = 0.0
    bytes_per_added_event: float = 0.0

    @property
    def added(self) -> float:
        """What the watcher adds per 1,000 plain pods: the API server's difference plus its own."""
        return self.control_plane_with - self.control_plane_without + self.watcher_seconds

    @property
    def share(self) -> float:
        """`added` as a share of what kube-apiserver and etcd spend binding them without it."""
        return self.added / self.control_plane_without if self.control_plane_without else 0.0


def per_thousand(seconds: float, bindings: int) -> float:
    return 1000 * seconds / bindings if bindings else 0.0


def summarize(trials: Sequence[Trial], watcher: str = "extender") -> Summary:
    """The medians per 1,000 bindings; trials without a watcher and with `watcher` are needed."""
    without = [t for t in trials if not t.watcher]
    with_ = [t for t in trials if t.watcher == watcher]
    if not without or not with_:
        raise ValueError(f"need trials both with and without the {watcher} watcher")

    def median(values: Sequence[Trial], seconds: str) -> float:
        return statistics.median(per_thousand(getattr(t, seconds), t.bindings) for t in values)

    def per_binding(values: Sequence[Trial], what: str) -> float:
        return statistics.median(float(getattr(t, what)) / t.bindings for t in values if t.bindings)

    events_without = per_binding(without, "watch_events")
    events_with = per_binding(with_, "watch_events")
    added_bytes = per_binding(with_, "watch_bytes") - per_binding(without, "watch_bytes")
    added_events = events_with - events_without
    return Summary(
        watcher=watcher,
        control_plane_without=median(without, "control_plane_seconds"),
        control_plane_with=median(with_, "control_plane_seconds"),
        watcher_seconds=median(with_, "watcher_seconds"),
        events_without=events_without,
        events_with=events_with,
        bytes_per_added_event=added_bytes / added_events if added_events > 0 else 0.0,
    )


def pod_watch_events(metrics: str) -> tuple[float, float]:
    """(events, bytes) of pod watch events the API server has sent, from its /metrics page."""
    samples = parse_metrics(metrics)

    def total(name: str) -> float:
        return sum_by_label(samples, name, "resource").get("pods", 0.0)

    return total("apiserver_watch_events_total"), total("apiserver_watch_events_sizes_sum")


def plan(trials: int, watchers: Sequence[str] = ("extender",)) -> list[str]:
    """Each trial's watcher ("" for none), in rounds that go there and back so drift cancels out.

    One watcher: none, it, it, none, ...; two: none, a, b, b, a, none, ...
    """
    there = ["", *watchers]
    round_trip = there + there[::-1]
    return [round_trip[i % len(round_trip)] for i in range(trials)]


def _named(watcher: str) -> str:
    return "the extender" if watcher == "extender" else f"a bare {watcher} pod watch"


def render(trials: Sequence[Trial], summaries: Sequence[Summary], command: str) -> str:
    lines = [f"`{command}`", ""]
    lines += ["| trial | watcher | control plane CPU s / 1,000 | watcher CPU s / 1,000 |"]
    lines += ["|---|---|---|---|"]
    for number, t in enumerate(trials, 1):
        own = f"{per_thousand(t.watcher_seconds, t.bindings):.3f}" if t.watcher else "-"
        lines.append(
            f"| {number} | {t.watcher or 'none'} "
            f"| {per_thousand(t.control_plane_seconds, t.bindings):.3f} | {own} |"
        )
    for summary in summaries:
        named = _named(summary.watcher)
        lines.append("")
        lines.append(
            f"Medians per 1,000 plain pods bound: kube-apiserver and etcd "
            f"{summary.control_plane_without:.3f} s without a watcher, "
            f"{summary.control_plane_with:.3f} s with {named}; the watcher itself "
            f"{summary.watcher_seconds:.3f} s. Added by {named}: {summary.added:.3f} s, "
            f"{100 * summary.share:.1f}% of what kube-apiserver and etcd spend binding them "
            "without it (a part of what a scheduled pod costs kube-scheduler, kube-apiserver "
            "and etcd: bench/e2e.py reports that per 1,000 pods). "
            f"Pod watch events the API server sent per binding: {summary.events_without:.2f} "
            f"without, {summary.events_with:.2f} with it, "
            f"{summary.bytes_per_added_event:,.0f} bytes per added event."
        )
    return "\n".join(lines)


def run_trial(
    bench: e2e.BenchCluster,
    namespace: str,
    pods: int,
    listed: int,
    watcher: str,
    extender_checkout: Path,
) -> Trial:
    """Bind the `pods` pods of `namespace` with `watcher` (one of WATCHERS, "" none) watching.

    listed: how many pods the cluster holds, all of which a started extender
    must have listed before the bindings begin. extender_checkout: whose
    app/ the extender runs.
    """
    runner = bench.runner
    with _watching(bench, watcher, listed, extender_checkout) as pid:
        runner.settle()
        # The /metrics scrapes are outside the CPU readings: they cost the API server too.
        events, sent = pod_watch_events(runner.apiserver_metrics())
        control_plane = runner.control_plane_cpu()
        own = e2e.cpu_seconds(pid) if pid else 0.0
        asyncio.run(bind_all(runner.client.configuration, namespace, pods, bench.nodes))
        time.sleep(DRAIN_SECONDS)
        control_plane = runner.control_plane_cpu() - control_plane
        own = e2e.cpu_seconds(pid) - own if pid else 0.0
        events_after, sent_after = pod_watch_events(runner.apiserver_metrics())
    return Trial(watcher, pods, control_plane, own, events_after - events, sent_after - sent)


@contextlib.contextmanager
def _watching(
    bench: e2e.BenchCluster, watcher: str, listed: int, extender_checkout: Path
) -> Iterator[int]:
    """The watcher's pid (0 for none) once it watches; stopped on the way out."""
    if not watcher:
        yield 0
    elif watcher == "extender":
        log = bench.layout.logs / "bench-watchcost-extender.log"
        extender = e2e.Extender(
            bench.cluster.kubeconfig, bench.extender_port, log, [], extender_checkout
        )
        bench.cluster.extender_pid = extender.process.pid
        try:
            wait_for(
                lambda: bench.runner.extender_cached_pods() >= listed,
                120,
                "the extender's pods",
                0.5,
            )
            yield extender.process.pid
        finally:
            extender.stop()
            bench.cluster.extender_pid = None
    else:
        command = [sys.executable, "-m", "bench.barewatch", bench.cluster.kubeconfig, watcher]
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            if not process.stdout.readline().startswith("watching"):
                raise RuntimeError(f"bench.barewatch {watcher} did not start: see its stderr")
            yield process.pid
        finally:
            process.kill()
            process.wait()


async def bind_all(configuration: Configuration, namespace: str, pods: int, nodes: int) -> None:
    """Pods p0..p<pods-1> bound round-robin over the nodes, by the extender's own PodApi.bind."""
    client = AsyncApiClient(configuration, max_in_flight=BINDINGS_IN_FLIGHT)
    api = PodApi(client)
    try:
        await asyncio.gather(
            *(api.bind(namespace, f"p{i}", "", f"node-{i % nodes + 1}") for i in range(pods))
        )
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500, help="fake nodes (default 500)")
    parser.add_argument("--pods", type=int, default=3000, help="pods per trial (default 3000)")
    parser.add_argument(
        "--trials", type=int, default=8, help="trials, half with a watcher (default 8)"
    )
    parser.add_argument("--json", type=Path, help="also write the trials and medians here")
    parser.add_argument(
        "--watchers",
        default="extender",
        help="comma-separated, taking turns with no watcher: extender (default), json, "
        "protobuf (bench/barewatch.py's pod watch in that encoding, reading and discarding)",
    )
    parser.add_argument(
        "--extender-checkout",
        type=Path,
        default=REPO,
        help="run the extender from this checkout's app/ (default this one): an older "
        "revision's watch measured the same way",
    )
    args = parser.parse_args(argv)
    watchers = [w for w in args.watchers.split(",") if w]
    unknown = sorted(set(watchers) - set(WATCHERS))
    if unknown or not watchers:
        parser.error(f"--watchers: {', '.join(unknown) or 'none given'}; pick from {WATCHERS}")
    if args.trials < len(watchers) + 1:
        parser.error(
            f"--trials must be at least {len(watchers) + 1}: one without a watcher, "
            "and one with each"
        )
    command = "python -m bench.watchcost " + " ".join(argv if argv is not None else sys.argv[1:])
    bench = e2e.start_bench_cluster(args.nodes, log=lambda m: print(m, flush=True))
    trials: list[Trial] = []
    try:
        for number in range(args.trials):
            bench.runner.create_namespace(f"bench-watchcost-{number}")
            bench.runner.create_pods(
                f"bench-watchcost-{number}",
                [e2e.pod_body(f"p{i}", scheduler_name="nobody") for i in range(args.pods)],
            )
        listed = args.trials * args.pods
        for number, watcher in enumerate(plan(args.trials, watchers)):
            namespace = f"bench-watchcost-{number}"
            trial = run_trial(bench, namespace, args.pods, listed, watcher, args.extender_checkout)
            trials.append(trial)
            print(
                f"trial {number + 1}, watcher {watcher or 'none'}: control plane "
                f"{per_thousand(trial.control_plane_seconds, trial.bindings):.3f}, watcher "
                f"{per_thousand(trial.watcher_seconds, trial.bindings):.3f} "
                "CPU s per 1,000 bindings",
                flush=True,
            )
    finally:
        bench.down()
    summaries = [summarize(trials, watcher) for watcher in watchers]
    print(render(trials, summaries, command.strip()))
    if args.json:
        report = {
            "trials": [asdict(t) for t in trials],
            "summaries": [asdict(s) for s in summaries],
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
