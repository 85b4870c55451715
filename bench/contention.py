#!/usr/bin/env python3
"""`make bench`, contention part: 40 gangs competing for a cluster that holds a fifth of them.

Runs against a real local control plane (hack/local-cluster, its own
directory and ports) and the real extender process, once with
--gang-feasibility=true and once with false, and prints, side by side:
makespan (first pod created to last pod finished), the lower bound
sum(work) / capacity, their ratio, the time to the first complete gang,
the longest time any gang had some but not all members bound, and how many
gate timeouts the extender counted.

Each gang is a PodGroup of N one-CPU pods (N seeded random in 2..12) that
the pod simulator finishes `--work-seconds` after they start running
(annotation local-cluster.dev/exit-after-seconds).

The workload driver (`run_gangs`) is shared with
tests/cluster/test_contention.py, which runs it inside `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.groups import POD_GROUP_LABEL, XK8S_API
from bench.results import run_info, write_json
from hack.clusterkit import (
    REPO,
    api_client,
    create_group,
    kubeconfig_of,
    local_cluster,
    pause_pod,
    sample,
    scrape,
    start_extender,
    stop_process,
    wait_for_default_service_account,
    wait_webhook_marks,
    webhook_args,
)

EXIT_AFTER = "local-cluster.dev/exit-after-seconds"


@dataclass
class GangLog:
    size: int
    first_bound: float | None = None
    all_bound: float | None = None
    done: float | None = None
    # Longest time seen with some but not all members bound.
    partial_seconds: float = 0.0


@dataclass
class Result:
    gangs: int
    pods: int
    capacity_cpus: int
    work_seconds: float
    makespan: float
    lower_bound: float
    first_complete: float
    longest_partial: float
    incomplete: list[str] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)
    """TIMELINE_FIELDS per sample of the watcher, about every half second."""

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound

    def line(self) -> str:
        return (
            f"{self.gangs} gangs, {self.pods} pods, capacity {self.capacity_cpus} CPUs, work "
            f"{self.work_seconds:g}s: makespan {self.makespan:.1f}s, lower bound "
            f"{self.lower_bound:.1f}s, ratio {self.ratio:.2f}, first complete gang "
            f"{self.first_complete:.1f}s, longest partial binding {self.longest_partial:.1f}s"
            + (f", INCOMPLETE {len(self.incomplete)}" if self.incomplete else "")
        )


TIMELINE_FIELDS = ("seconds", "waiting", "partial", "running", "done", "pods_bound")
"""A timeline sample: seconds since the first pod was created, then how many gangs had no
member bound, some but not all, all bound (and not finished), all finished, and how many
pods were bound (finished or not): what bench/plots.py draws per mode."""


def gang_sizes(count: int = 40, seed: int = 9) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(2, 12) for _ in range(count)]


class _Watcher:
    """Polls the namespace's pods (raw JSON: fast) and records each gang's progress."""

    def __init__(self, core: Any, namespace: str, gangs: dict[str, GangLog]) -> None:
        self.core = core
        self.namespace = namespace
        self.gangs = gangs
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.timeline: list[tuple[float, int, int, int, int, int]] = []
        """(monotonic time, then TIMELINE_FIELDS[1:]) per sample."""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                response = self.core.list_namespaced_pod(self.namespace, _preload_content=False)
                self.sample(time.monotonic(), json.loads(response.data)["items"])
            except Exception as err:  # keep sampling; reported by the caller
                self.errors.append(repr(err))
            self.stop.wait(0.5)

    def sample(self, now: float, pods: list[dict[str, Any]]) -> None:
        bound: dict[str, int] = {}
        finished: dict[str, int] = {}
        for pod in pods:
            group = (pod["metadata"].get("labels") or {}).get(POD_GROUP_LABEL)
            if group is None:
                continue
            if pod["spec"].get("nodeName"):
                bound[group] = bound.get(group, 0) + 1
            if (pod.get("status") or {}).get("phase") == "Succeeded":
                finished[group] = finished.get(group, 0) + 1
        for name, gang in self.gangs.items():
            count = bound.get(name, 0)
            if count and gang.first_bound is None:
                gang.first_bound = now
            if count >= gang.size and gang.all_bound is None:
                gang.all_bound = now
            if 0 < count < gang.size and gang.first_bound is not None:
                gang.partial_seconds = max(gang.partial_seconds, now - gang.first_bound)
            if finished.get(name, 0) >= gang.size and gang.done is None:
                gang.done = now
        counts = {"waiting": 0, "partial": 0, "running": 0, "done": 0}
        for name, gang in self.gangs.items():
            count = bound.get(name, 0)
            if gang.done is not None:
                counts["done"] += 1
            elif gang.all_bound is not None:
                counts["running"] += 1
            elif count:
                counts["partial"] += 1
            else:
                counts["waiting"] += 1
        self.timeline.append(
            (
                now,
                counts["waiting"],
                counts["partial"],
                counts["running"],
                counts["done"],
                sum(bound.values()),
            )
        )


def pod_bodies(
    gangs: dict[str, GangLog],
    work_seconds: float,
    node_selector: dict[str, str] | None = None,
    shuffle: int | None = None,
) -> list[dict[str, Any]]:
    """Every gang's one-CPU pods, each finishing `work_seconds` after it starts, gang after
    gang, or in an order shuffled with seed `shuffle` (see run_gangs)."""
    bodies = [
        pause_pod(
            f"{name}-{i}",
            cpu="1",
            memory="64Mi",
            labels={POD_GROUP_LABEL: name},
            annotations={EXIT_AFTER: f"{work_seconds:g}"},
            spec={"nodeSelector": node_selector or {}},
        )
        for name, gang in gangs.items()
        for i in range(gang.size)
    ]
    if shuffle is not None:
        random.Random(shuffle).shuffle(bodies)
    return bodies


def run_gangs(
    client: Any,
    namespace: str,
    sizes: list[int],
    *,
    work_seconds: float,
    capacity_cpus: int,
    node_selector: dict[str, str] | None = None,
    timeout: float = 600,
    shuffle: int | None = None,
) -> Result:
    """Create every gang (PodGroup, then its pods) and wait until all pods finished.

    `shuffle`: the pods created in an order shuffled with this seed, gangs interleaved
    (kube-scheduler then sees members of many gangs at once, none of them whole yet),
    not gang after gang."""
    from kubernetes import client as k8s

    core: Any = k8s.CoreV1Api(client)
    custom: Any = k8s.CustomObjectsApi(client)
    gangs = {f"g{i:02d}": GangLog(size) for i, size in enumerate(sizes)}
    for name, gang in gangs.items():
        create_group(custom, XK8S_API, namespace, name, {"minMember": gang.size})
    bodies = pod_bodies(gangs, work_seconds, node_selector, shuffle)
    watcher = _Watcher(core, namespace, gangs)
    start = time.monotonic()
    watcher.thread.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda b: core.create_namespaced_pod(namespace, b), bodies))
        deadline = start + timeout
        while time.monotonic() < deadline and any(g.done is None for g in gangs.values()):
            time.sleep(1)
    finally:
        watcher.stop.set()
        watcher.thread.join(5)
    done = [g.done for g in gangs.values() if g.done is not None]
    complete = [g.all_bound for g in gangs.values() if g.all_bound is not None]
    return Result(
        gangs=len(gangs),
        pods=len(bodies),
        capacity_cpus=capacity_cpus,
        work_seconds=work_seconds,
        makespan=(max(done) - start) if done else float("inf"),
        lower_bound=len(bodies) * work_seconds / capacity_cpus,
        first_complete=(min(complete) - start) if complete else float("inf"),
        longest_partial=max(g.partial_seconds for g in gangs.values()),
        incomplete=sorted(n for n, g in gangs.items() if g.done is None),
        timeline=[[round(t - start, 3), *counts] for t, *counts in watcher.timeline],
    )


# ---- `make bench`: its own control plane, extender on and off -----------------------------

BENCH_OFFSET = 9000  # test slots use 1000..8000
NODES = 4
NODE_CPU = 14


@dataclass(frozen=True)
class Workload:
    """What one run measures: the gangs' sizes, each pod's work, the cluster, the order."""

    sizes: list[int]
    work_seconds: float
    nodes: int = NODES
    node_cpu: int = NODE_CPU
    # The pods created in a seeded shuffled order (None: gang after gang).
    shuffle: int | None = None


def _measure(
    kubeconfig: str, port: int, feasibility: bool, load: Workload, wait: float, log: Path
) -> tuple[Result, float]:
    from kubernetes import client as k8s

    process = start_extender(
        kubeconfig,
        port,
        log,
        (
            "--permit-waiting-time-seconds",
            f"{wait:g}",
            "--gang-feasibility",
            str(feasibility).lower(),
            # The local cluster's gang-only mode: the webhook marks the members.
            *webhook_args(port),
        ),
    )
    try:
        api = api_client(kubeconfig)
        core: Any = k8s.CoreV1Api(api)
        wait_webhook_marks(core)
        namespace = f"contention-{'on' if feasibility else 'off'}-{int(time.time())}"
        core.create_namespace({"metadata": {"name": namespace}})
        wait_for_default_service_account(core, namespace)
        result = run_gangs(
            api,
            namespace,
            load.sizes,
            work_seconds=load.work_seconds,
            capacity_cpus=load.nodes * load.node_cpu,
            timeout=900,
            shuffle=load.shuffle,
        )
        timeouts = sample(
            scrape(f"http://127.0.0.1:{port}"),
            "gang_extender_gang_admissions_total",
            result="timeout",
        )
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)
        return result, timeouts
    finally:
        stop_process(process)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work-seconds", type=float, default=20.0)
    parser.add_argument(
        "--permit-wait-seconds",
        type=float,
        default=30.0,
        help="the extender's gate wait in both runs (its default is 60)",
    )
    parser.add_argument("--gangs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--only", choices=("on", "off"), help="run one mode only")
    parser.add_argument("--nodes", type=int, default=NODES, help=f"nodes ({NODES})")
    parser.add_argument("--node-cpu", type=int, default=NODE_CPU, help=f"CPUs a node ({NODE_CPU})")
    parser.add_argument(
        "--shuffle",
        type=int,
        metavar="SEED",
        help="create the pods in an order shuffled with SEED, the gangs interleaved "
        "(default: gang after gang)",
    )
    parser.add_argument(
        "--json", help="also write the figures to this file (make bench: bench/results/)"
    )
    args = parser.parse_args(argv)
    command = "python -m bench.contention " + " ".join(argv if argv is not None else sys.argv[1:])
    info = run_info(command.strip())  # the commit at the start: what was measured
    state_dir = REPO / ".local-cluster-bench"
    env = {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(state_dir),
        "LOCAL_CLUSTER_PORT_OFFSET": str(BENCH_OFFSET),
    }
    port = 18888 + BENCH_OFFSET
    local_cluster("down", env=env)
    out = local_cluster(
        "up",
        "--nodes",
        str(args.nodes),
        "--node-cpu",
        str(args.node_cpu),
        "--node-memory",
        "64Gi",
        "--extender-url",
        f"http://127.0.0.1:{port}/scheduler",
        env=env,
    )
    kubeconfig = kubeconfig_of(out)
    load = Workload(
        gang_sizes(args.gangs, args.seed),
        args.work_seconds,
        args.nodes,
        args.node_cpu,
        args.shuffle,
    )
    figures: dict[str, Any] = {}
    try:
        for mode in ("on", "off"):
            if args.only and args.only != mode:
                continue
            result, timeouts = _measure(
                kubeconfig,
                port,
                mode == "on",
                load,
                args.permit_wait_seconds,
                state_dir / "logs" / f"extender-bench-{mode}.log",
            )
            print(f"--gang-feasibility={'true' if mode == 'on' else 'false'}: {result.line()}")
            print(f"  gate timeouts: {timeouts:g}")
            figures[mode] = {**result.__dict__, "ratio": result.ratio, "gate_timeouts": timeouts}
    finally:
        local_cluster("down", env=env)
    if "on" in figures and "off" in figures:
        print("side by side (feasibility on | off):")
        for key in ("makespan", "lower_bound", "ratio", "first_complete", "longest_partial"):
            print(f"  {key:<16} {figures['on'][key]:8.2f} | {figures['off'][key]:8.2f}")
        print(
            f"  {'gate_timeouts':<16} {figures['on']['gate_timeouts']:8g} | "
            f"{figures['off']['gate_timeouts']:8g}"
        )
    if args.json:
        write_json(
            args.json,
            {
                **info,
                "nodes": args.nodes,
                "node_cpu": args.node_cpu,
                "shuffle": args.shuffle,
                "modes": figures,
            },
        )


if __name__ == "__main__":
    main()
