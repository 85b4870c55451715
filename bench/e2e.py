#!/usr/bin/env python3
"""`make bench`, end to end: how many pods per second the real kube-scheduler places.

What users feel is kube-scheduler's throughput once it must call the
extender for every pod, so this runs the pinned control plane (its own state
directory and ports, so test sessions are undisturbed), registers fake
nodes, and times five cases on the same cluster in the same run:

  (a) plain pods, kube-scheduler without the extender
  (b) plain pods, kube-scheduler calling the extender (filter, prioritize, bind)
  (c) gangs of 8 (x-k8s PodGroups) through the extender
  (d) the same gangs with Kubernetes' in-tree GangScheduling plugin
      (feature gate GenericWorkload, scheduling.k8s.io/v1beta1 PodGroups)
  (n) plain pods through a no-op extender written in Go (hack/kube/cmd/
      noop-extender: every node passes, no scores, bind at once), the
      yardstick: (n)/(a) is what the extender protocol itself costs
      kube-scheduler on this machine, (b)/(n) what gang-extender adds to it
  (p) plain pods and (q) gangs of 8 in the gang-only mode as shipped
      (docs/deployment-modes.md; the chart's default, hack/local-cluster's):
      two extender entries, members carrying gang-extender.dev/member as the
      webhook leaves them and preempting through their entry, the
      preempt-only entry naming gang-extender.dev/preemptor (which the
      bench's plain pods of priority 0 do not carry); (b) and (c) are the
      every-verb mode
  (g) plain pods and (h) gangs of 8 in the gang-only mode with the chart's
      markPreemptors: false: the preempt-only entry serves every pod
  (o) plain pods, no extender, kube-scheduler's OpportunisticBatching off:
      kube-scheduler turns that off for every pod as soon as any extender
      is configured, interested in the pod or not, so (p)/(o) is what the
      gang-only mode costs plain pods beyond that, and (o)/(a) what the
      batching is worth
  (w) plain pods with gang-extender running (its watches) but not in
      kube-scheduler's configuration: what the watches alone cost (not in
      the default --cases)

For each case the pods are created first and only then is a kube-scheduler
started, so pod creation is not what is measured. Throughput is pods /
(last bind - first bind), the bind times taken from a watch. Every scheduler
gets the same raised client QPS, so the API rate limit is not what is
measured either. The extender runs only in the cases that use it; its CPU
time (from /proc) is counted from the scheduler's start to the last bind.
The cases run --rounds times, every other round in reverse order (a b c d n,
n d c b a, a b c d n): on a shared machine one case can be slowed by
something else, and the median of the rounds' ratios is less at the mercy of
that than one ratio; reversing puts what drifts over a run (the control
plane's history grows) on both sides of each ratio. Before the first round,
--warmup-pods pods of each case go through once, unmeasured, so that round 1
does not also measure a fresh control plane's cold caches (the API server's,
etcd's, the Go heaps'); it does not make a shared machine's rounds agree.

Then, optionally (--scale-nodes), the cluster grows and (a), (b), (n) and (q)
run again to report filter/prioritize latency with kube-scheduler's default
percentageOfNodesToScore, and the extender's RSS is read with --cache-pods
pods in its watch cache.

Verb latency is reported twice: as kube-scheduler's connections saw it, from
a packet capture of the extender's port (bench/roundtrips.py, needs tcpdump
and the right to capture on lo), and from the extender's own histogram.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.core.groups import (
    GROUP_APIS,
    LIGHT_MIN_AVAILABLE_LABEL,
    LIGHT_NAME_LABEL,
    POD_GROUP_LABEL,
    SOURCE_XK8S,
)
from app.core.marking import MEMBER_QUANTITY
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE
from app.kube.client import read_and_release

# Run by path (`python bench/e2e.py`), sys.path[0] is bench/: the repository root makes hack/
# importable (app/ comes from the editable install).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results import commit, machine_description
from bench.roundtrips import Capture, RoundTrips
from hack.clusterkit import (
    REPO,
    api_client,
    create_group,
    http_text,
    kubeconfig_of,
    local_cluster,
    parse_metrics,
    pause_pod,
    sample,
    start_extender,
    start_ready,
    stop_process,
    sum_by_label,
    wait_for,
    wait_for_default_service_account,
)

BENCH_DIR = REPO / ".local-cluster-bench"
# Test slots use offsets 1000..8000 (tests/cluster/conftest.py); the bench takes 9700
# (BENCH_PORT_OFFSET moves it if another cluster holds those ports).
PORT_OFFSET = int(os.environ.get("BENCH_PORT_OFFSET", "9700"))
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
MD_BEGIN = "<!-- e2e:begin (written by bench/e2e.py) -->"
MD_END = "<!-- e2e:end -->"

SCHEDULER_NAME = "bench-scheduler"
GANG_SIZE = 8
POD_CPU = "100m"
POD_MEMORY = "64Mi"
NODE_SHAPE = {"cpu": "32", "memory": "128Gi", "pods": 110}


# ---- pure helpers (unit-tested in tests/unit/test_bench_e2e.py) -----------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


Buckets = dict[float, float]
"""Histogram upper bound -> cumulative count (Prometheus `_bucket` samples)."""


def histogram_quantile(q: float, buckets: Buckets) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket; 0 if empty."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return 0.0
    total = buckets[bounds[-1]]
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            inside = count - previous_count
            if inside <= 0:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / inside
        previous_bound, previous_count = bound, count
    return previous_bound


def bucket_delta(after: Buckets, before: Buckets) -> Buckets:
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def parse_histograms(text: str, name: str, label: str) -> dict[str, Buckets]:
    """`{label value: buckets}` of histogram `name` from a /metrics text (other labels summed)."""
    out: dict[str, Buckets] = {}
    for (sample_name, pairs), value in parse_metrics(text).items():
        if sample_name != f"{name}_bucket":
            continue
        labels = dict(pairs)
        key = labels.get(label, "")
        bound = float(labels["le"])
        buckets = out.setdefault(key, {})
        buckets[bound] = buckets.get(bound, 0.0) + value
    return out


def throughput(bind_times: Iterable[float]) -> tuple[float, float]:
    """(pods per second from the first to the last bind, that span in seconds)."""
    times = sorted(bind_times)
    if len(times) < 2:
        return 0.0, 0.0
    span = times[-1] - times[0]
    return ((len(times) - 1) / span if span > 0 else float("inf")), span


def gang_latencies(
    bound_at: Mapping[str, float], gang_of: Mapping[str, str], ready_at: Mapping[str, float]
) -> list[float]:
    """Per gang: all members bound minus when the gang could start (its last member existed)."""
    last_bound: dict[str, float] = {}
    for pod, gang in gang_of.items():
        if pod in bound_at:
            last_bound[gang] = max(last_bound.get(gang, 0.0), bound_at[pod])
    return [t - ready_at[g] for g, t in last_bound.items() if g in ready_at]


def nodes_per_gang(node_of: Mapping[str, str], gang_of: Mapping[str, str]) -> float | None:
    """How many distinct nodes a gang's bound members are on, mean over the gangs."""
    nodes: dict[str, set[str]] = {}
    for pod, gang in gang_of.items():
        if node_of.get(pod):
            nodes.setdefault(gang, set()).add(node_of[pod])
    return sum(len(n) for n in nodes.values()) / len(nodes) if nodes else None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its waited-for children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


CpuTicks = tuple[int, int]
"""(idle + iowait, all) ticks of every CPU since boot, from /proc/stat."""


def cpu_ticks() -> CpuTicks:
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def busy_between(before: CpuTicks, after: CpuTicks) -> float:
    """The fraction of all CPUs that were busy between two cpu_ticks() readings."""
    return 1 - (after[0] - before[0]) / max(1, after[1] - before[1])


def machine_busy(interval: float = 1.0) -> float:
    """The fraction of all CPUs busy over the next `interval` seconds."""
    before = cpu_ticks()
    time.sleep(interval)
    return busy_between(before, cpu_ticks())


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def render_scheduler_config(
    kubeconfig: str,
    qps: int,
    extender_url: str | None,
    scheduler_name: str = SCHEDULER_NAME,
    gang_only: bool = False,
    mark_preemptors: bool = False,
) -> str:
    """KubeSchedulerConfiguration of one bench case (JSON is valid YAML).

    gang_only: two extender entries (filter, prioritize and bind for pods
    requesting MEMBER_RESOURCE; preempt for all) and MostAllocated scoring
    in-tree, as the chart renders it with markPreemptors: false.
    mark_preemptors: as deploy/scheduler-config.yaml and the chart's default
    (the member entry preempts too; the preempt-only entry manages
    PREEMPTOR_RESOURCE).
    """
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig, "qps": qps, "burst": qps},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler_name}],
    }
    if extender_url and gang_only:
        common = {"urlPrefix": extender_url, "nodeCacheCapable": True, "httpTimeout": "90s"}
        config["profiles"][0]["pluginConfig"] = [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [
                            {"name": "cpu", "weight": 1},
                            {"name": "memory", "weight": 1},
                        ],
                    }
                },
            }
        ]
        members: dict[str, Any] = {
            **common,
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "bindVerb": "bind",
            "weight": 1,
            "ignorable": False,
            "managedResources": [{"name": MEMBER_RESOURCE, "ignoredByScheduler": True}],
        }
        preempt: dict[str, Any] = {**common, "preemptVerb": "preempt", "ignorable": False}
        if mark_preemptors:
            members["preemptVerb"] = "preempt"
            preempt["managedResources"] = [{"name": PREEMPTOR_RESOURCE, "ignoredByScheduler": True}]
        config["extenders"] = [members, preempt]
    elif extender_url:
        # As deploy/scheduler-config.yaml: names only, we bind.
        config["extenders"] = [
            {
                "urlPrefix": extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "preemptVerb": "preempt",
                "bindVerb": "bind",
                "weight": 1,
                "nodeCacheCapable": True,
                "httpTimeout": "90s",
                "ignorable": False,
            }
        ]
    return json.dumps(config, indent=2) + "\n"


def scheduler_feature_gates(gates: str, *, batching: bool) -> str:
    """kube-scheduler's --feature-gates value for a case ("" for none): `gates`, and
    OpportunisticBatching turned off unless `batching`."""
    wanted = [gates] if gates else []
    if not batching:
        wanted.append("OpportunisticBatching=false")
    return ",".join(wanted)


def pod_body(
    name: str,
    *,
    scheduler_name: str = SCHEDULER_NAME,
    x_group: str | None = None,
    native_group: str | None = None,
    label_group: tuple[str, int] | None = None,
    node_name: str | None = None,
    marked: bool = False,
    cpu: str = POD_CPU,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """marked: the gang member as the gang-only mode's webhook leaves it (the
    webhook runs at creation, which the cases do not time). cpu and
    node_selector: bench.deepline's big gangs, and its pods kept to a pool of
    nodes on a shared test cluster."""
    labels: dict[str, str] = {"app": "bench"}
    if x_group:
        labels[POD_GROUP_LABEL] = x_group
    if label_group:
        labels[LIGHT_NAME_LABEL] = label_group[0]
        labels[LIGHT_MIN_AVAILABLE_LABEL] = str(label_group[1])
    spec: dict[str, Any] = {"schedulerName": scheduler_name, "automountServiceAccountToken": False}
    if native_group:
        spec["schedulingGroup"] = {"podGroupName": native_group}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    body = pause_pod(name, cpu=cpu, memory=POD_MEMORY, labels=labels, spec=spec)
    if marked:
        resources = body["spec"]["containers"][0]["resources"]
        resources["requests"][MEMBER_RESOURCE] = MEMBER_QUANTITY
        resources["limits"] = {MEMBER_RESOURCE: MEMBER_QUANTITY}
    return body


@dataclass
class CaseResult:
    case: str
    description: str
    pods: int
    bound: int
    span_seconds: float
    pods_per_second: float
    pod_latency_p50: float
    pod_latency_p99: float
    gang_latency_p50: float | None = None
    gang_latency_p99: float | None = None
    # Distinct nodes a gang's members landed on, mean over the gangs (packing, not speed).
    nodes_per_gang: float | None = None
    extender_cpu_per_1000: float | None = None
    scheduler_cpu_per_1000: float | None = None
    # kube-apiserver and etcd together; None when their pids are not known.
    control_plane_cpu_per_1000: float | None = None
    # verb -> (p50, p99) seconds, from the extender's own histogram (server side).
    verbs: dict[str, tuple[float, float]] = field(default_factory=dict)
    # verb -> (p50, p99) seconds on kube-scheduler's connections (bench/roundtrips.py).
    wire: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Why `wire` is empty in a case that called an extender (no tcpdump, ...).
    wire_missing: str | None = None
    # The fraction of the machine's CPUs busy from the scheduler's start to the last bind.
    machine_busy: float = 0.0
    # kube-scheduler's scheduling_algorithm_duration (filter + score, extender calls included).
    algorithm_p50: float = 0.0
    algorithm_p99: float = 0.0
    nodes: int = 0
    # pods/binding as the API server timed it (whoever binds).
    api_binding_p50: float = 0.0
    api_binding_p99: float = 0.0
    # kube-scheduler's OpportunisticBatching: cycles that took the node it hinted, of
    # all its cycles that asked for a hint (scheduler_batch_attempts_total); None when
    # batching was off (every case with an extender: kube-scheduler turns it off).
    batch_hints_used: int | None = None
    batch_attempts: int | None = None
    # Why its remembered scores were dropped (scheduler_batch_cache_flushed_total): reason -> times.
    batch_flushes: dict[str, int] = field(default_factory=dict)


def wire_latencies(
    trips: RoundTrips | None, why_not: str | None
) -> tuple[dict[str, tuple[float, float]], str | None]:
    """(verb -> (p50, p99) on the wire, why there are none) of one capture."""
    if trips is None:
        return {}, why_not or "no capture"
    return {
        verb: (percentile(values, 0.5), percentile(values, 0.99))
        for verb, values in sorted(trips.by_verb.items())
    }, None


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def round_suffix(round_number: int) -> str:
    """The case label suffix of a round: none for the first, "-r2" and on for the others."""
    return "" if round_number == 1 else f"-r{round_number}"


def round_order(cases: str, round_number: int) -> str:
    """The cases of a round: as given in odd rounds, reversed in even ones."""
    return cases if round_number % 2 else cases[::-1]


def round_ratios(by: Mapping[str, CaseResult], num: str, den: str) -> list[float]:
    """num/den throughput of every round that ran both cases, in round order."""
    values = []
    for round_number in range(1, 100):
        n, d = num + round_suffix(round_number), den + round_suffix(round_number)
        if n not in by or d not in by:
            break
        values.append(ratio(by[n].pods_per_second, by[d].pods_per_second))
    return values


def describe_ratios(values: list[float]) -> str:
    """One round: its ratio; more: their median, then each round's."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    rounds = ", ".join(f"{v:.2f}" for v in values)
    return f"{statistics.median(values):.2f} (median; rounds {rounds})"


# The speed and memory targets of the issue this benchmark answers (see BENCHMARKS.md).
RATIO_TARGETS = (
    ("(b)/(a) plain pods, extender / no extender", "b", "a", 0.8),
    ("(c)/(d) gangs, extender / in-tree GangScheduling", "c", "d", 1.0),
    ("(p)/(a) plain pods, gang-only (default) / no extender", "p", "a", 0.95),
    (
        "(p)/(o) plain pods, gang-only (default) / no extender without OpportunisticBatching",
        "p",
        "o",
        None,
    ),
    ("(o)/(a) plain pods, no extender: OpportunisticBatching off / on", "o", "a", None),
    ("(w)/(a) plain pods, extender watching but not configured / no extender", "w", "a", None),
    ("(q)/(d) gangs, gang-only (default) / in-tree GangScheduling", "q", "d", 1.2),
    ("(g)/(a) plain pods, gang-only, preempt entry for all / no extender", "g", "a", None),
    ("(h)/(d) gangs, gang-only, preempt entry for all / in-tree GangScheduling", "h", "d", None),
    ("(n)/(a) plain pods, no-op Go extender / no extender", "n", "a", None),
    ("(b)/(n) plain pods, extender / no-op Go extender", "b", "n", None),
    ("(b)/(a) at scale", "b-scale", "a-scale", None),
    ("(n)/(a) at scale", "n-scale", "a-scale", None),
)
SCALE_LATENCY_TARGETS = (("filter", 0.002), ("prioritize", 0.005))
# The scale step's cases whose verb latencies meet those targets: every-verb
# plain pods (a filter, prioritize and bind per pod), and gang members in the
# gang-only mode, the only pods its kube-scheduler calls the verbs for.
SCALE_LATENCY_CASES = (("b-scale", "every-verb plain pods"), ("q-scale", "gang-only gang members"))
RSS_TARGET_MB = 400
CACHED_LABEL = "pods cached"
"""What the memory entry measured with the cache filled is called (it ends with this)."""


def _ms(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return "-"
    return f"{pair[0] * 1000:.2f} / {pair[1] * 1000:.2f} ms"


def _target_rows(report: Mapping[str, Any], by: Mapping[str, CaseResult]) -> list[str]:
    """| figure | value | target | rows: the ratios, the latencies at scale, the RSS."""
    rows = []
    for name, num, den, target in RATIO_TARGETS:
        values = round_ratios(by, num, den)
        if values:
            goal = f">= {target}" if target is not None else "-"
            rows.append(f"| {name} | {describe_ratios(values)} | {goal} |")
    for key, who in SCALE_LATENCY_CASES:
        scale = by.get(key)
        if scale is None:
            continue
        for verb, limit in SCALE_LATENCY_TARGETS:
            if verb in scale.wire:
                where, p99 = "on kube-scheduler's connections", scale.wire[verb][1]
            elif scale.verbs.get(verb, (0.0, 0.0))[1] > 0:  # a verb never called has no p99
                where, p99 = "extender's own histogram", scale.verbs[verb][1]
            else:
                continue
            rows.append(
                f"| {verb} p99 at {scale.nodes:,} nodes, {who} ({where}) | {p99 * 1000:.2f} ms "
                f"| <= {limit * 1000:g} ms |"
            )
    for label, (rss, _peak) in (report.get("memory") or {}).items():
        if label.endswith(CACHED_LABEL):
            rows.append(f"| extender RSS, {label} | {rss:.0f} MB | <= {RSS_TARGET_MB} MB |")
    return rows


def _batching(c: CaseResult) -> str:
    flushes = ", ".join(f"{reason} {n:,}" for reason, n in c.batch_flushes.items()) or "never"
    return f"{c.batch_hints_used or 0:,}/{c.batch_attempts or 0:,} (dropped: {flushes})"


def render_markdown(report: Mapping[str, Any]) -> str:
    """The BENCHMARKS.md section for one run."""
    cases: list[CaseResult] = report["cases"]
    by = {c.case: c for c in cases}
    lines = [
        MD_BEGIN,
        f"## End to end with kube-scheduler ({report['date']}, {report['label']})",
        "",
        f"`bench/e2e.py` ({report['command']}), {report['duration']:.0f} s. "
        f"{report['machine']}; Kubernetes {report['kube_version']} (pinned build), "
        f"Python {report['python']}. Every kube-scheduler ran with client QPS/burst "
        f"{report['qps']}; pods request cpu {POD_CPU}, memory {POD_MEMORY}; gangs of "
        f"{GANG_SIZE}. Pods are created first, then the scheduler is started; throughput "
        "is pods / (last bind - first bind) from a watch; latency is bind time minus "
        "scheduler start (queue position dominates it); CPU busy is the share of all "
        "the machine's CPUs in use from the first bind to the last.",
        "",
        "| case | nodes | pods | pods/s | CPU busy | pod latency p50 / p99 "
        "| gang latency p50 / p99 | nodes per gang | extender CPU s / 1,000 pods "
        "| kube-scheduler CPU s / 1,000 pods | API server and etcd CPU s / 1,000 pods "
        "| scheduling algorithm p50 / p99 | API server pods/binding p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        gang = (
            f"{c.gang_latency_p50:.2f} / {c.gang_latency_p99:.2f} s"
            if c.gang_latency_p50 is not None and c.gang_latency_p99 is not None
            else "-"
        )
        cpu = f"{c.extender_cpu_per_1000:.2f}" if c.extender_cpu_per_1000 is not None else "-"
        sched_cpu = (
            f"{c.scheduler_cpu_per_1000:.2f}" if c.scheduler_cpu_per_1000 is not None else "-"
        )
        plane_cpu = (
            f"{c.control_plane_cpu_per_1000:.2f}"
            if c.control_plane_cpu_per_1000 is not None
            else "-"
        )
        lines.append(
            f"| ({c.case}) {c.description} | {c.nodes:,} | {c.bound:,}/{c.pods:,} "
            f"| {c.pods_per_second:.1f} | {c.machine_busy:.0%} "
            f"| {c.pod_latency_p50:.2f} / {c.pod_latency_p99:.2f} s | {gang} "
            f"| {f'{c.nodes_per_gang:.2f}' if c.nodes_per_gang is not None else '-'} | {cpu} "
            f"| {sched_cpu} | {plane_cpu} | {_ms((c.algorithm_p50, c.algorithm_p99))} "
            f"| {c.api_binding_p50 * 1000:.0f} / {c.api_binding_p99 * 1000:.0f} ms |"
        )
    batched = [c for c in cases if c.batch_attempts is not None]
    if batched:
        lines += [
            "",
            "kube-scheduler's OpportunisticBatching (on only without an extender), cycles "
            "that took the node it hinted / cycles that asked for a hint, and why it dropped "
            "the scores it kept: " + "; ".join(f"({c.case}) {_batching(c)}" for c in batched) + ".",
        ]
    lines += ["", "| figure | value | target |", "|---|---|---|", *_target_rows(report, by)]
    wire_rows = [c for c in cases if c.wire or c.wire_missing]
    if wire_rows:
        lines += [
            "",
            "Verb round trips on kube-scheduler's connections to the extender, p50 / p99: "
            "from the first byte of the request to the last byte of the answer, timed by a "
            "packet capture (`bench/roundtrips.py`; kube-scheduler has no per-extender "
            "histogram). A gang member's bind includes its wait in the permit gate:",
            "",
            "| case | filter | prioritize | bind |",
            "|---|---|---|---|",
        ]
        for c in wire_rows:
            if c.wire_missing:
                lines.append(f"| ({c.case}) | not measured: {c.wire_missing} | | |")
                continue
            cells = [_ms(c.wire.get(verb)) for verb in ("filter", "prioritize", "bind")]
            lines.append(f"| ({c.case}) | {' | '.join(cells)} |")
    verb_rows = [c for c in cases if c.verbs]
    if verb_rows:
        lines += [
            "",
            "The same verbs, p50 / p99, from the extender's own "
            "`gang_extender_request_duration_seconds` (from the request read whole to the "
            "answer written; the difference to the table above is the wire, kube-scheduler's "
            "sending, and time the request waited for the extender's event loop):",
            "",
            "| case | filter | prioritize | bind |",
            "|---|---|---|---|",
        ]
        for c in verb_rows:
            cells = [_ms(c.verbs.get(verb)) for verb in ("filter", "prioritize", "bind")]
            lines.append(f"| ({c.case}) | {' | '.join(cells)} |")
    memory = report.get("memory") or {}
    if memory:
        lines += ["", "| extender memory | RSS | peak RSS |", "|---|---|---|"]
        for label, (rss, peak) in memory.items():
            lines.append(f"| {label} | {rss:.0f} MB | {peak:.0f} MB |")
    notes = report.get("notes") or []
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines.append(MD_END)
    return "\n".join(lines) + "\n"


def report_json(report: Mapping[str, Any]) -> str:
    """--json's text: the report with each case as a plain object (what bench/compare.py reads)."""
    cases = [c.__dict__ for c in report["cases"]]
    return json.dumps({**report, "cases": cases}, indent=2, default=str)


def replace_marked_section(text: str, section: str, begin: str, end: str) -> str:
    """Replace the section between the `begin` and `end` marker lines, or append `section`.

    Each benchmark owns one section of BENCHMARKS.md, so a new run replaces its
    own figures and leaves the hand-written history around them alone.
    """
    start, stop = text.find(begin), text.find(end)
    if start != -1 and stop != -1:
        return text[:start] + section + text[stop + len(end) + 1 :]
    return text.rstrip("\n") + "\n\n" + section


def update_benchmarks_md(text: str, section: str) -> str:
    """Replace the previous e2e section (between the markers) or append one."""
    return replace_marked_section(text, section, MD_BEGIN, MD_END)


# ---- talking to the cluster ---------------------------------------------------------


def _insecure() -> ssl.SSLContext:
    """kube-scheduler's serving certificate is self-signed at start-up (loopback only)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class BindWatch:
    """Watches a namespace for pods getting a node; remembers when each was first seen bound.

    The field selector spec.nodeName!= makes a pod appear (ADDED) the moment
    it is bound, so the stream carries one small event per bind. The
    machine's CPU ticks are read at the first bind and at the `expected`th:
    how busy the machine was while pods were being placed.
    """

    def __init__(self, core: Any, namespace: str, resource_version: str, expected: int) -> None:
        self.bound_at: dict[str, float] = {}
        self.node_of: dict[str, str] = {}
        self.expected = expected
        self.ticks_at_first: CpuTicks | None = None
        self.ticks_at_last: CpuTicks | None = None
        self._core = core
        self._namespace = namespace
        self._rv = resource_version
        self._stop = threading.Event()
        self._response: Any = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except Exception as err:
                if self._stop.is_set():
                    return
                self.error = f"{type(err).__name__}: {err}"
                time.sleep(0.5)

    def _watch(self) -> None:
        response = self._core.list_namespaced_pod(
            self._namespace,
            watch=True,
            field_selector="spec.nodeName!=",
            resource_version=self._rv,
            timeout_seconds=600,
            _preload_content=False,
            _request_timeout=(10, 700),
        )
        self._response = response
        buffer = b""
        try:
            for chunk in response.stream(65536, decode_content=True):
                now = time.monotonic()
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    if meta.get("resourceVersion"):
                        self._rv = meta["resourceVersion"]
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._bound(meta.get("name", ""), now)
                        self.node_of[meta.get("name", "")] = (obj.get("spec") or {}).get(
                            "nodeName", ""
                        )
                if self._stop.is_set():
                    return
        finally:
            response.release_conn()

    def _bound(self, name: str, now: float) -> None:
        if name in self.bound_at:
            return
        self.bound_at[name] = now
        if len(self.bound_at) == 1:
            self.ticks_at_first = cpu_ticks()
        if len(self.bound_at) == self.expected:
            self.ticks_at_last = cpu_ticks()

    @property
    def machine_busy(self) -> float:
        """How busy the CPUs were from the first bind to the last (0 before both)."""
        if self.ticks_at_first is None or self.ticks_at_last is None:
            return 0.0
        return busy_between(self.ticks_at_first, self.ticks_at_last)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            if self._response is not None:
                self._response.shutdown()


QUIET_BUSY = 0.25
"""The next case starts once the CPUs were at most this busy for a second (see Runner)."""


@dataclass
class Case:
    key: str
    description: str
    extender: bool  # kube-scheduler calls gang-extender
    gangs: str | None  # None (plain pods), "x-k8s" or "native"
    noop: bool = False  # kube-scheduler calls the no-op Go extender instead
    # gang-only mode (docs/deployment-modes.md): members marked, two extender entries.
    gang_only: bool = False
    # ... with the preempt-only entry scoped to pods marked as preemptors.
    mark_preemptors: bool = False
    # kube-scheduler's OpportunisticBatching (feature gate, on by default since 1.35): pods
    # alike reuse the last cycle's scored nodes. kube-scheduler turns it off itself in every
    # profile once any extender is configured (framework computeBatchablePlugins), whether
    # or not the extender is interested in the pod; (o) turns it off without an extender.
    batching: bool = True
    # gang-extender runs (and watches the cluster) but kube-scheduler is not told of it.
    watch_only: bool = False

    @property
    def runs_extender(self) -> bool:
        """gang-extender runs during the case, called by kube-scheduler or only watching."""
        return self.extender or self.watch_only


CASES = {
    "a": Case("a", "plain pods, no extender", False, None),
    "b": Case("b", "plain pods through the extender", True, None),
    "c": Case("c", f"gangs of {GANG_SIZE} through the extender", True, "x-k8s"),
    "d": Case("d", f"gangs of {GANG_SIZE}, in-tree GangScheduling", False, "native"),
    "n": Case("n", "plain pods through a no-op Go extender", False, None, noop=True),
    "w": Case(
        "w",
        "plain pods, extender running but not configured",
        False,
        None,
        watch_only=True,
    ),
    "o": Case(
        "o",
        "plain pods, no extender, OpportunisticBatching off (as with any extender)",
        False,
        None,
        batching=False,
    ),
    "g": Case("g", "plain pods, gang-only, preempt entry for all", True, None, gang_only=True),
    "h": Case(
        "h",
        f"gangs of {GANG_SIZE}, gang-only, preempt entry for all",
        True,
        "x-k8s",
        gang_only=True,
    ),
    "p": Case(
        "p",
        "plain pods, gang-only (default: marked preemptors)",
        True,
        None,
        gang_only=True,
        mark_preemptors=True,
    ),
    "q": Case(
        "q",
        f"gangs of {GANG_SIZE}, gang-only (default: marked preemptors)",
        True,
        "x-k8s",
        gang_only=True,
        mark_preemptors=True,
    ),
}


# How long a profile waits for kube-scheduler to serve its /debug/pprof.
PROFILE_START_SECONDS = 30.0


class SchedulerProfile:
    """A CPU profile of a case's kube-scheduler, from its own /debug/pprof, in the background.

    kube-scheduler keeps no per-extender cost of its own: what a
    configuration costs it (an extender entry interested in every pod, a
    resource its plugins check per node) shows only in its profile. Read
    the file with `go tool pprof -top FILE`.
    """

    def __init__(self, port: int, path: Path, *, after: float = 1.0, seconds: int = 4) -> None:
        """Starts `after` seconds from now (kube-scheduler's start-up), profiles `seconds`."""
        self.path = path
        self._url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}"
        self._after = after
        self._timeout = seconds + 30
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        time.sleep(self._after)
        context = ssl._create_unverified_context()  # kube-scheduler's self-signed certificate
        # kube-scheduler serves once it has started: seconds on a busy machine (a make test
        # beside soaks refused the request made at `after`).
        serving_by = time.monotonic() + PROFILE_START_SECONDS
        while True:
            try:
                with urllib.request.urlopen(self._url, timeout=self._timeout, context=context) as r:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self.path.write_bytes(r.read())
                return
            except OSError as err:
                refused = isinstance(getattr(err, "reason", err), ConnectionRefusedError)
                if refused and time.monotonic() < serving_by:
                    time.sleep(0.1)
                    continue
                self.error = f"no kube-scheduler profile: {err}"
                return

    def wait(self) -> None:
        self._thread.join(self._timeout)


@dataclass
class Cluster:
    """What a case needs of the control plane; the test suite fills it from its own cluster."""

    kubeconfig: str
    scheduler_kubeconfig: str
    bin_dir: Path
    scheduler_port: int
    work_dir: Path
    extender_url: str | None = None
    extender_pid: int | None = None
    # The no-op Go extender of case (n), while it runs.
    noop_url: str | None = None
    noop_pid: int | None = None
    feature_gates: str = "GenericWorkload=true"
    # kube-apiserver's and etcd's: whose CPU a case costs the control plane.
    control_plane_pids: tuple[int, ...] = ()


def control_plane_pids(pids_dir: Path) -> tuple[int, ...]:
    """kube-apiserver's and etcd's pids, from a local cluster's pid files."""
    return tuple(
        int((pids_dir / f"{name}.pid").read_text().strip()) for name in ("kube-apiserver", "etcd")
    )


class Runner:
    def __init__(
        self,
        cluster: Cluster,
        qps: int,
        log: Callable[[str], None] = print,
        *,
        settle_seconds: float = 30,
        profile_dir: Path | None = None,
    ) -> None:
        """settle_seconds: how long a finished case may wait for the machine to calm down.

        profile_dir: write a CPU profile of each case's kube-scheduler there
        (SchedulerProfile).
        """
        from kubernetes import client as k8s

        self.client = api_client(cluster.kubeconfig, pool_size=32)
        self.core: Any = k8s.CoreV1Api(self.client)
        self.custom: Any = k8s.CustomObjectsApi(self.client)
        self.cluster = cluster
        self.qps = qps
        self.log = log
        self.settle_seconds = settle_seconds
        self.profile_dir = profile_dir

    # ---- objects ----------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespace({"metadata": {"name": name}})
        except ApiException as err:
            if err.status != 409:
                raise
        wait_for_default_service_account(self.core, name)

    def create_many(self, bodies: Sequence[Callable[[], None]], threads: int = 12) -> None:
        with ThreadPoolExecutor(threads) as pool:
            for future in [pool.submit(fn) for fn in bodies]:
                future.result()

    def create_pods(self, namespace: str, pods: Sequence[dict[str, Any]]) -> None:
        def create(body: dict[str, Any]) -> Callable[[], None]:
            def run() -> None:
                # Raw response (no model decoding), read whole before reuse.
                read_and_release(
                    self.core.create_namespaced_pod(
                        namespace, body, _preload_content=False, _request_timeout=60
                    )
                )

            return run

        self.create_many([create(p) for p in pods])

    def create_podgroups(
        self, namespace: str, source: str, names: Sequence[str], min_member: int = GANG_SIZE
    ) -> None:
        api = GROUP_APIS[source]
        spec: dict[str, Any] = (
            {"minMember": min_member}
            if source == SOURCE_XK8S
            else {"schedulingPolicy": {"gang": {"minCount": min_member}}}
        )

        def create(name: str) -> Callable[[], None]:
            return lambda: create_group(self.custom, api, namespace, name, spec)

        self.create_many([create(n) for n in names])

    def delete_namespace(self, namespace: str) -> None:
        """Pods go at once (grace 0: no kubelet would finish them), then the namespace.

        Then wait for the namespace to be gone and the machine to calm down:
        the cleanup of 2,000 pods, their Events and PodGroups keeps the API
        server, etcd and kube-controller-manager busy for seconds, and a case
        started meanwhile would pay for the one before it (the case after (a)
        ran 40% slower in the same run than when another case came between).
        """
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(Exception):
            self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        with contextlib.suppress(Exception):
            self.core.delete_namespace(namespace)

        def gone() -> bool:
            try:
                self.core.read_namespace(namespace, _request_timeout=10)
            except ApiException as err:
                return bool(err.status == 404)
            return False

        try:
            wait_for(gone, 180, f"namespace {namespace} to be deleted", 0.5)
        except TimeoutError:
            self.log(f"  namespace {namespace} still there after 180 s; going on")
        self.settle()

    def settle(self) -> None:
        """Wait for the CPUs to be quiet; a shared machine may never be: at most settle_seconds."""
        deadline = time.monotonic() + self.settle_seconds
        while time.monotonic() < deadline and machine_busy() > QUIET_BUSY:
            pass

    # ---- processes ----------------------------------------------------------------------

    def start_scheduler(
        self,
        name: str,
        extender_url: str | None,
        gates: bool,
        gang_only: bool = False,
        mark_preemptors: bool = False,
        batching: bool = True,
    ) -> subprocess.Popen[bytes]:
        work = self.cluster.work_dir
        work.mkdir(parents=True, exist_ok=True)
        config = work / f"bench-scheduler-{name}.yaml"
        config.write_text(
            render_scheduler_config(
                self.cluster.scheduler_kubeconfig,
                self.qps,
                extender_url,
                gang_only=gang_only,
                mark_preemptors=mark_preemptors,
            )
        )
        argv = [
            str(self.cluster.bin_dir / "kube-scheduler"),
            f"--config={config}",
            f"--authentication-kubeconfig={self.cluster.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self.cluster.scheduler_kubeconfig}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
            + (",/debug/pprof/*" if self.profile_dir is not None else ""),
            "--bind-address=127.0.0.1",
            f"--secure-port={self.cluster.scheduler_port}",
            f"--cert-dir={work / 'bench-scheduler-certs'}",
            "--v=1",
        ]
        feature_gates = scheduler_feature_gates(
            self.cluster.feature_gates if gates else "", batching=batching
        )
        if feature_gates:
            argv.append(f"--feature-gates={feature_gates}")
        log = (work / f"bench-scheduler-{name}.log").open("wb")
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def scheduler_metrics(self) -> str:
        return http_text(
            f"https://127.0.0.1:{self.cluster.scheduler_port}/metrics", context=_insecure()
        )

    def apiserver_metrics(self) -> str:
        """The API server's own /metrics page."""
        client = self.client
        response = client.rest_client.pool_manager.request(
            "GET", client.configuration.host + "/metrics", preload_content=False, timeout=60
        )
        return read_and_release(response).decode()

    def apiserver_binding_buckets(self) -> Buckets:
        """Cumulative pods/binding latency buckets of the API server (its own /metrics)."""
        text = self.apiserver_metrics()
        lines = [
            line
            for line in text.splitlines()
            if line.startswith("apiserver_request_duration_seconds_bucket")
            and 'subresource="binding"' in line
        ]
        parsed = parse_histograms(
            "# TYPE apiserver_request_duration_seconds histogram\n" + "\n".join(lines) + "\n",
            "apiserver_request_duration_seconds",
            "subresource",
        )
        return parsed.get("binding", {})

    def extender_metrics(self) -> str:
        assert self.cluster.extender_url is not None
        base = self.cluster.extender_url.rsplit("/scheduler", 1)[0]
        return http_text(f"{base}/metrics")

    def extender_cached_pods(self) -> float:
        return sample(
            parse_metrics(self.extender_metrics()), "gang_extender_cache_objects", kind="pods"
        )

    # ---- one case ---------------------------------------------------------------------

    def control_plane_cpu(self) -> float:
        """CPU seconds kube-apiserver and etcd have used so far."""
        return sum(cpu_seconds(pid) for pid in self.cluster.control_plane_pids)

    def run_case(self, case: Case, pods: int, nodes: int, suffix: str = "") -> CaseResult:
        namespace = f"bench-{case.key}{suffix}"
        self.log(f"case ({case.key}{suffix}) {case.description}: {pods} pods on {nodes} nodes")
        self.create_namespace(namespace)
        gang_of: dict[str, str] = {}
        bodies = []
        if case.gangs:
            gangs = [f"g{i}" for i in range(max(1, pods // GANG_SIZE))]
            self.create_podgroups(namespace, case.gangs, gangs)
            for i in range(len(gangs) * GANG_SIZE):
                gang = gangs[i // GANG_SIZE]
                name = f"p{i}"
                gang_of[name] = gang
                bodies.append(
                    pod_body(
                        name,
                        x_group=gang if case.gangs == "x-k8s" else None,
                        native_group=gang if case.gangs == "native" else None,
                        marked=case.gang_only,
                    )
                )
        else:
            bodies = [pod_body(f"p{i}") for i in range(pods)]
        started = time.monotonic()
        self.create_pods(namespace, bodies)
        self.log(f"  created {len(bodies)} pods in {time.monotonic() - started:.1f}s")
        # Whose CPU the case counts: gang-extender's, or the no-op extender's in (n).
        extender_pid = (
            self.cluster.extender_pid
            if case.extender
            else self.cluster.noop_pid
            if case.noop
            else None
        )
        if case.runs_extender:
            # The extender has seen every pod before kube-scheduler starts.
            target = len(bodies)
            wait_for(
                lambda: self.extender_cached_pods() >= target,
                120,
                "the extender's watch to deliver the pods",
                0.5,
            )
        rv = self.core.list_namespaced_pod(namespace, limit=1).metadata.resource_version
        watch = BindWatch(self.core, namespace, rv, len(bodies))
        ext_before = self.extender_metrics() if case.extender else ""
        api_before = self.apiserver_binding_buckets()
        cpu_before = cpu_seconds(extender_pid) if extender_pid is not None else 0.0
        extender_url = (
            self.cluster.extender_url
            if case.extender
            else self.cluster.noop_url
            if case.noop
            else None
        )
        if case.noop and extender_url is None:
            raise RuntimeError("case (n) needs the no-op extender running (Cluster.noop_url)")
        # kube-scheduler's connections to the extender, timed on the wire.
        capture = (
            Capture(
                urlsplit(extender_url).port or 80,
                self.cluster.work_dir / f"capture-{case.key}{suffix}.pcap",
            )
            if extender_url is not None
            else None
        )
        scheduler = self.start_scheduler(
            case.key + suffix,
            extender_url,
            case.gangs == "native",
            case.gang_only,
            case.mark_preemptors,
            case.batching,
        )
        t0 = time.monotonic()
        profile = (
            SchedulerProfile(
                self.cluster.scheduler_port,
                self.profile_dir / f"kube-scheduler-{case.key}{suffix}.pprof",
            )
            if self.profile_dir is not None
            else None
        )
        try:
            sched_cpu_before = cpu_seconds(scheduler.pid)
            plane_cpu_before = self.control_plane_cpu()
            deadline_seconds = max(180.0, len(bodies) / 10)
            try:
                wait_for(
                    lambda: len(watch.bound_at) >= len(bodies) or scheduler.poll() is not None,
                    deadline_seconds,
                    f"{len(bodies)} pods to be bound",
                    0.1,
                )
            except TimeoutError:
                self.log(f"  only {len(watch.bound_at)} of {len(bodies)} bound: giving up")
            if scheduler.poll() is not None:
                raise RuntimeError(
                    f"kube-scheduler exited with {scheduler.returncode}; see "
                    f"{self.cluster.work_dir}/bench-scheduler-{case.key}{suffix}.log"
                )
            last = max(watch.bound_at.values(), default=t0)
            cpu_after = cpu_seconds(extender_pid) if extender_pid is not None else 0.0
            sched_cpu = cpu_seconds(scheduler.pid) - sched_cpu_before
            plane_cpu = self.control_plane_cpu() - plane_cpu_before
            sched_text = self.scheduler_metrics()
            ext_after = self.extender_metrics() if case.extender else ""
            api_binding = bucket_delta(self.apiserver_binding_buckets(), api_before)
        finally:
            watch.stop()
            trips = capture.stop() if capture is not None else None
            if profile is not None:
                profile.wait()
                self.log(f"  {profile.error or f'kube-scheduler profile: {profile.path}'}")
            stop_process(scheduler, grace=15)
        bound = len(watch.bound_at)
        rate, span = throughput(watch.bound_at.values())
        latencies = [t - t0 for t in watch.bound_at.values()]
        algorithm = parse_histograms(
            sched_text, "scheduler_scheduling_algorithm_duration_seconds", "profile"
        )
        algo: Buckets = {}
        for buckets in algorithm.values():
            for bound_, count in buckets.items():
                algo[bound_] = algo.get(bound_, 0.0) + count
        result = CaseResult(
            case=case.key + suffix,
            description=case.description,
            pods=len(bodies),
            bound=bound,
            span_seconds=span,
            pods_per_second=rate,
            pod_latency_p50=percentile(latencies, 0.5),
            pod_latency_p99=percentile(latencies, 0.99),
            scheduler_cpu_per_1000=sched_cpu / max(1, bound) * 1000,
            control_plane_cpu_per_1000=(
                plane_cpu / max(1, bound) * 1000 if self.cluster.control_plane_pids else None
            ),
            algorithm_p50=histogram_quantile(0.5, algo),
            algorithm_p99=histogram_quantile(0.99, algo),
            nodes=nodes,
            api_binding_p50=histogram_quantile(0.5, api_binding),
            api_binding_p99=histogram_quantile(0.99, api_binding),
            machine_busy=watch.machine_busy,
        )
        sched_samples = parse_metrics(sched_text)
        batching = sum_by_label(sched_samples, "scheduler_batch_attempts_total", "result")
        if batching:
            result.batch_hints_used = round(batching.get("hint_used", 0.0))
            result.batch_attempts = round(sum(batching.values()))
            flushes = sum_by_label(sched_samples, "scheduler_batch_cache_flushed_total", "reason")
            result.batch_flushes = {reason: round(n) for reason, n in sorted(flushes.items())}
        if capture is not None:
            result.wire, result.wire_missing = wire_latencies(trips, capture.why_not)
            capture.path.unlink(missing_ok=True)  # tens of MB, read now
        if gang_of:
            gangs_latency = gang_latencies(
                watch.bound_at, gang_of, dict.fromkeys(gang_of.values(), t0)
            )
            result.gang_latency_p50 = percentile(gangs_latency, 0.5)
            result.gang_latency_p99 = percentile(gangs_latency, 0.99)
            result.nodes_per_gang = nodes_per_gang(watch.node_of, gang_of)
        if extender_pid is not None:
            result.extender_cpu_per_1000 = (cpu_after - cpu_before) / max(1, bound) * 1000
            name = "gang_extender_request_duration_seconds"
            after, before = (
                parse_histograms(ext_after, name, "verb"),
                parse_histograms(ext_before, name, "verb"),
            )
            for verb, buckets in after.items():
                delta = bucket_delta(buckets, before.get(verb, {}))
                result.verbs[verb] = (
                    histogram_quantile(0.5, delta),
                    histogram_quantile(0.99, delta),
                )
        self.log(
            f"  {bound}/{len(bodies)} bound, {rate:.1f} pods/s over {span:.1f}s"
            + (
                f", extender {result.extender_cpu_per_1000:.2f} CPU s/1000 pods"
                if result.extender_cpu_per_1000 is not None
                else ""
            )
            + f", scheduler {result.scheduler_cpu_per_1000:.2f} CPU s/1000 pods"
            + (
                f", API server and etcd {result.control_plane_cpu_per_1000:.2f} CPU s/1000 pods"
                if result.control_plane_cpu_per_1000 is not None
                else ""
            )
            + f", last bind {last - t0:.1f}s after start"
            + f", API server pods/binding p50 {result.api_binding_p50 * 1000:.0f} ms"
            + f" p99 {result.api_binding_p99 * 1000:.0f} ms"
            + (
                f", batching hints used {_batching(result)}"
                if result.batch_attempts is not None
                else ""
            )
            + (
                f", {result.nodes_per_gang:.2f} nodes per gang"
                if result.nodes_per_gang is not None
                else ""
            )
        )
        self.delete_namespace(namespace)
        return result


# ---- the whole benchmark ----------------------------------------------------------------


def _local_cluster_module() -> Any:
    """The hack/local_cluster package with the modules the bench uses."""
    sys.path.insert(0, str(REPO / "hack"))
    import local_cluster.api
    import local_cluster.layout
    import local_cluster.nodes
    import local_cluster.toolchain

    return local_cluster


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(BENCH_DIR),
        "LOCAL_CLUSTER_PORT_OFFSET": str(PORT_OFFSET),
    }


def _local_cluster(*args: str) -> str:
    return local_cluster(*args, env=_env())


def add_nodes(lc: Any, first: int, last: int, node_shape: Mapping[str, Any] = NODE_SHAPE) -> None:
    """Fake nodes node-first..node-last, created concurrently (hack/local_cluster's shape;
    NODE_SHAPE's size unless `node_shape` says otherwise: bench.deepline's 8 CPUs)."""
    api = lc.api.Api(lc.layout.Config.from_env(_env()))
    shape = lc.nodes.NodeShape(
        cpu=node_shape["cpu"], memory=node_shape["memory"], pods=node_shape["pods"]
    )
    version = lc.toolchain.read_versions()["KUBE_VERSION"]
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(lc.nodes.create_fake_node, api, f"node-{i}", shape, version)
            for i in range(first, last + 1)
        ]
        for future in futures:
            future.result()


class NoopExtender:
    """Case (n)'s yardstick: hack/kube/cmd/noop-extender, serving on 127.0.0.1:`port`."""

    def __init__(self, bin_dir: Path, kubeconfig: str, port: int, qps: int, log_path: Path) -> None:
        self.process = start_ready(
            [
                str(bin_dir / "noop-extender"),
                f"--kubeconfig={kubeconfig}",
                f"--address=127.0.0.1:{port}",
                f"--qps={qps}",
            ],
            f"http://127.0.0.1:{port}/healthz",
            log_path,
            "noop-extender",
            30,
        )
        self.url = f"http://127.0.0.1:{port}/scheduler"

    def stop(self) -> None:
        stop_process(self.process, grace=15)


class Extender:
    """The extender under test: `python -m app serve` against the bench cluster."""

    def __init__(
        self, kubeconfig: str, port: int, log_path: Path, extra: Sequence[str], source: Path
    ) -> None:
        self.process = start_extender(kubeconfig, port, log_path, list(extra), cwd=source)

    def stop(self) -> None:
        stop_process(self.process, grace=15)


# kube-scheduler's requests past API Priority and Fairness's gate, as every extender's are.
# By default they share the workload-high level's queues, and at the bench's QPS 2000,
# with every pod pending at once, the bindings of kube-scheduler's own binder overflow
# them: 41 to 375 of 2,000 came back 429 in rounds of case (a), each retried after the
# API server's Retry-After second while the CPUs idled, and a round's pods/s fell to a
# fifth of the next one's. gang-extender and the no-op extender bind as the bench's
# admin (system:masters: the exempt level), so without this the cases where
# kube-scheduler binds, (a) and (p) among them, alone paid for the queues' overflow.
SCHEDULER_EXEMPT: dict[str, Any] = {
    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
    "kind": "FlowSchema",
    "metadata": {"name": "bench-kube-scheduler-exempt"},
    "spec": {
        "priorityLevelConfiguration": {"name": "exempt"},
        "matchingPrecedence": 100,  # before the default kube-scheduler schema's 800
        "rules": [
            {
                "subjects": [{"kind": "User", "user": {"name": "system:kube-scheduler"}}],
                "resourceRules": [
                    {
                        "verbs": ["*"],
                        "apiGroups": ["*"],
                        "resources": ["*"],
                        "namespaces": ["*"],
                        "clusterScope": True,
                    }
                ],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }
        ],
    },
}


@dataclass
class BenchCluster:
    """The bench's control plane with its fake nodes, for main(), watchcost and verbcost."""

    lc: Any  # hack/local_cluster, as imported from this checkout
    layout: Any  # hack/local_cluster's Layout: logs, pid files, kubeconfigs
    cluster: Cluster  # the kubeconfig, the Kubernetes binaries, the control plane's pids
    runner: Runner
    extender_port: int
    nodes: int

    def down(self) -> None:
        _local_cluster("down")


def start_bench_cluster(
    nodes: int,
    *,
    qps: int = 2000,
    log: Callable[[str], None] = print,
    profile_dir: Path | None = None,
) -> BenchCluster:
    """`hack/local-cluster up` in BENCH_DIR (brought down first) with `nodes` fake nodes.

    No kube-scheduler (each case starts its own) and no pod simulator (no
    pod runs; binding is the end of a pod's way here).
    """
    os.environ.update(_env())
    lc = _local_cluster_module()
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    log(f"bench cluster: {BENCH_DIR} (port offset {PORT_OFFSET})")
    _local_cluster("down")
    out = _local_cluster(
        "up",
        "--nodes",
        "0",
        "--no-scheduler",
        "--no-pod-simulator",
        "--feature-gates",
        "GenericWorkload=true",
    )
    config = lc.layout.Config.from_env(_env())
    layout = config.layout
    extender_port = 18888 + PORT_OFFSET
    cluster = Cluster(
        kubeconfig=kubeconfig_of(out),
        scheduler_kubeconfig=str(layout.kubeconfig_for("kube-scheduler")),
        bin_dir=lc.toolchain.build_kube(),
        scheduler_port=config.ports.scheduler,
        work_dir=layout.root,
        extender_url=f"http://127.0.0.1:{extender_port}/scheduler",
        control_plane_pids=control_plane_pids(layout.pids),
    )
    runner = Runner(cluster, qps, log, profile_dir=profile_dir)
    from kubernetes import client as k8s

    flowcontrol: Any = k8s.FlowcontrolApiserverV1Api(runner.client)
    flowcontrol.create_flow_schema(SCHEDULER_EXEMPT)
    started = time.monotonic()
    add_nodes(lc, 1, nodes)
    log(f"{nodes} nodes created in {time.monotonic() - started:.0f}s")
    return BenchCluster(lc, layout, cluster, runner, extender_port, nodes)


def create_cache_pods(runner: Runner, count: int, nodes: int) -> None:
    """`count` pods already bound (spec.nodeName set), in label-only gangs of 8."""
    namespace = "bench-cache"
    runner.create_namespace(namespace)
    bodies = [
        pod_body(
            f"c{i}",
            scheduler_name="nobody",
            label_group=(f"g{i // GANG_SIZE}", GANG_SIZE),
            node_name=f"node-{i % nodes + 1}",
        )
        for i in range(count)
    ]
    for start in range(0, count, 5000):
        runner.create_pods(
            namespace,
            bodies[start : start + 5000],
        )
        runner.log(f"  {min(count, start + 5000)} of {count} cache pods created")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500, help="fake nodes (default 500)")
    parser.add_argument("--pods", type=int, default=2000, help="pods per case (default 2000)")
    parser.add_argument(
        "--cases",
        default="abcdnghpqo",
        help="which of a, b, c, d, n, g, h, p, q, o, w to run (default abcdnghpqo)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run the cases this many times, every other round in reverse order; ratios "
        "are reported per round and as their median, so one disturbed case does not decide "
        "them (default 3)",
    )
    parser.add_argument(
        "--warmup-pods",
        type=int,
        default=200,
        help="before the first round, schedule this many pods of each case, unmeasured; "
        "0 skips the warm-up (default 200)",
    )
    parser.add_argument("--qps", type=int, default=2000, help="kube-scheduler client QPS and burst")
    parser.add_argument(
        "--scale-nodes",
        type=int,
        default=5000,
        help="then grow to this many nodes and run (a), (b) and (n) again; 0 skips (default 5000)",
    )
    parser.add_argument(
        "--cache-pods",
        type=int,
        default=50_000,
        help="then create this many bound pods and read the extender's RSS; 0 skips "
        "(default 50000)",
    )
    parser.add_argument("--label", default="development machine", help="what machine this is")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md's e2e section")
    parser.add_argument("--keep", action="store_true", help="leave the bench cluster running")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--extender-arg", action="append", default=[], help="extra flag for gang-extender serve"
    )
    parser.add_argument(
        "--extender-checkout",
        "--extender-source",
        dest="extender_checkout",
        default=str(REPO),
        help="run the extender from this checkout's app/ (PYTHONPATH=DIR), the harness staying "
        "this one: compare a baseline (bench/compare.py; default this checkout)",
    )
    parser.add_argument(
        "--profile-scheduler",
        metavar="DIR",
        help="write a 4 s CPU profile of each case's kube-scheduler to DIR "
        "(kube-scheduler-CASE.pprof; read with `go tool pprof -top`)",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="py-spy the extender while it runs (collapsed stacks to FILE; needs py-spy)",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    measured = commit()  # what was measured: the commit at the start, not at the end
    bench = start_bench_cluster(
        args.nodes,
        qps=args.qps,
        log=lambda m: print(m, flush=True),
        profile_dir=Path(args.profile_scheduler) if args.profile_scheduler else None,
    )
    lc, layout, cluster, runner = bench.lc, bench.layout, bench.cluster, bench.runner
    kubeconfig, bin_dir, extender_port = cluster.kubeconfig, cluster.bin_dir, bench.extender_port
    results: list[CaseResult] = []
    memory: dict[str, tuple[float, float]] = {}
    extender: Extender | None = None
    log_path = layout.logs / "bench-extender.log"

    profiler: subprocess.Popen[bytes] | None = None

    def with_extender(needed: bool) -> None:
        nonlocal extender, profiler
        if needed and extender is None:
            extender = Extender(
                kubeconfig, extender_port, log_path, args.extender_arg, Path(args.extender_checkout)
            )
            cluster.extender_pid = extender.process.pid
            if args.profile:
                # Sampling profile of the running extender (collapsed stacks).
                profiler = subprocess.Popen(
                    [
                        # The venv's, where `make install` puts it, else the PATH's.
                        shutil.which("py-spy", path=Path(sys.executable).parent) or "py-spy",
                        "record",
                        f"--pid={extender.process.pid}",
                        "--format=raw",
                        "--rate=200",
                        f"--output={args.profile}",
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
        elif not needed and extender is not None:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(30)
                profiler = None
            memory_now = rss_mb(extender.process.pid)
            memory[f"when stopped, {current_nodes:,} nodes"] = memory_now
            extender.stop()
            extender = None
            cluster.extender_pid = None

    current_nodes = args.nodes
    notes: list[str] = []
    noop_port = 18890 + PORT_OFFSET

    def run(case: Case, suffix: str, pods: int | None = None) -> None:
        """One case, with gang-extender or the no-op extender running only if it needs it.

        With `pods`, a warm-up: that many pods, and the figures thrown away.
        """
        with_extender(case.runs_extender)

        def measure() -> None:
            result = runner.run_case(case, pods or args.pods, current_nodes, suffix)
            if pods is None:
                results.append(result)

        if not case.noop:
            measure()
            return
        noop = NoopExtender(
            bin_dir, kubeconfig, noop_port, args.qps, layout.logs / "bench-noop-extender.log"
        )
        cluster.noop_url, cluster.noop_pid = noop.url, noop.process.pid
        try:
            measure()
        finally:
            noop.stop()
            cluster.noop_url = cluster.noop_pid = None

    def scale() -> None:
        nonlocal current_nodes
        with_extender(False)
        started = time.monotonic()
        add_nodes(lc, current_nodes + 1, args.scale_nodes)
        print(f"grew to {args.scale_nodes} nodes in {time.monotonic() - started:.0f}s", flush=True)
        current_nodes = args.scale_nodes
        for key in "abnq":  # q: the default mode's gangs at this size
            if key in args.cases:
                run(CASES[key], "-scale")

    def cache() -> None:
        with_extender(True)
        assert extender is not None
        started = time.monotonic()
        create_cache_pods(runner, args.cache_pods, current_nodes)
        wait_for(
            lambda: runner.extender_cached_pods() >= args.cache_pods,
            600,
            "the extender to cache the pods",
            1,
        )
        print(f"{args.cache_pods} pods cached in {time.monotonic() - started:.0f}s", flush=True)
        memory[f"{current_nodes:,} nodes, {args.cache_pods:,} {CACHED_LABEL}"] = rss_mb(
            extender.process.pid
        )

    try:
        if args.warmup_pods > 0:
            for key in args.cases:
                run(CASES[key], "-warmup", pods=args.warmup_pods)
        for round_number in range(1, args.rounds + 1):
            for key in round_order(args.cases, round_number):
                run(CASES[key], round_suffix(round_number))
        # The optional phases report a failure instead of losing the figures above.
        for wanted, phase, what in (
            (args.scale_nodes > current_nodes, scale, f"scale to {args.scale_nodes} nodes"),
            (args.cache_pods > 0, cache, f"{args.cache_pods} cached pods"),
        ):
            if not wanted:
                continue
            try:
                phase()
            except Exception as err:
                print(f"{what} failed: {err}", flush=True)
                notes.append(f"{what} failed: {type(err).__name__}: {err}")
        with_extender(False)
    finally:
        if extender is not None:
            extender.stop()
        if not args.keep:
            _local_cluster("down")
    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "label": args.label,
        "command": "python bench/e2e.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "duration": time.monotonic() - began,
        "commit": measured,
        "machine": machine_description(),
        "kube_version": lc.toolchain.read_versions()["KUBE_VERSION"],
        "python": platform.python_version(),
        "qps": args.qps,
        "cases": results,
        "memory": memory,
        "notes": notes,
    }
    section = render_markdown(report)
    print()
    print(section)
    if args.write:
        BENCHMARKS_MD.write_text(update_benchmarks_md(BENCHMARKS_MD.read_text(), section))
        print(f"updated {BENCHMARKS_MD}")
    if args.json:
        Path(args.json).write_text(report_json(report))
    print(f"bench/e2e.py took {time.monotonic() - began:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
