#!/usr/bin/env python3
"""`make bench`, topology part: gangs that need a rack, gang-extender beside kube-scheduler's own.

A seeded stream of gangs (sizes 2..8 one-CPU members, half asking for a
**required** rack, half a **preferred** one) competes for 16 fake nodes of 4
CPUs in 2 zones x 2 blocks x 2 racks x 2 nodes (a rack holds 8 CPUs), on a
real local control plane (hack/local-cluster, its own directory and ports)
with the feature gates GenericWorkload and TopologyAwareWorkloadScheduling on
in kube-apiserver (which then serves scheduling.k8s.io/v1beta1) and
kube-controller-manager. The same pinned kube-scheduler runs twice:

- **ours**: kube-scheduler (gates off: no in-tree gang plugin) calling
  gang-extender for every verb; the gangs are x-k8s PodGroups with Kueue's
  `podset-required-topology` / `podset-preferred-topology: example.com/rack`
  annotations, the extender's levels hostname, rack, block, zone;
- **native**: kube-scheduler with both gates on, no extender; the gangs are
  scheduling.k8s.io/v1beta1 PodGroups (`schedulingPolicy.gang.minCount`),
  the required ones with `schedulingConstraints.topology: [{key: rack}]`
  (native has no preferred level: those gangs have no constraint).

Each member finishes `--work-seconds` after it starts running (the pod
simulator). Reported per scheduler: required gangs placed inside one rack
(must be 100%), preferred gangs inside one rack, makespan (first pod created
to last finished) against the lower bound sum(work) / capacity, and the
ratio ours / native.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.groups import NATIVE_API, POD_GROUP_LABEL, XK8S_API
from app.core.topology.domains import HOSTNAME, ZONE
from app.core.topology.sources import KUEUE_PREFERRED, KUEUE_REQUIRED
from bench.e2e import Cluster, Runner, _local_cluster_module
from hack.clusterkit import (
    REPO,
    create_group,
    kubeconfig_of,
    local_cluster,
    pause_pod,
    start_extender,
    stop_process,
)

RACK = "example.com/rack"
BLOCK = "example.com/block"
GANG_LABEL = "bench.gang-extender.dev/gang"
EXIT_AFTER = "local-cluster.dev/exit-after-seconds"
SCHEDULER_NAME = "bench-scheduler"
BENCH_DIR = REPO / ".local-cluster-bench-topology"
PORT_OFFSET = 9300  # test slots use 1000..8000, the other benches 9000 and 9700
NODE_CPU = 4
GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"


def node_names() -> list[str]:
    return [
        f"topo-z{z}-b{b}-r{r}-n{n}" for z in (0, 1) for b in (0, 1) for r in (0, 1) for n in (0, 1)
    ]


def labels_of(node: str) -> dict[str, str]:
    """topo-z0-b1-r0-n1 -> rack z0b1r0, block z0b1, zone z0."""
    _, z, b, r, _ = node.split("-")
    return {RACK: f"{z}{b}{r}", BLOCK: f"{z}{b}", ZONE: z}


@dataclass(frozen=True)
class GangSpec:
    name: str
    size: int
    required: bool


def workload(count: int, seed: int) -> list[GangSpec]:
    """The seeded stream: sizes 2..8 (a rack holds 8), required or preferred rack."""
    rng = random.Random(seed)
    return [GangSpec(f"g{i:02d}", rng.randint(2, 8), rng.random() < 0.5) for i in range(count)]


@dataclass
class Outcome:
    scheduler: str
    gangs: int
    pods: int
    makespan: float
    lower_bound: float
    required: int
    required_in_one_rack: int
    preferred: int
    preferred_in_one_rack: int
    incomplete: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound

    def line(self) -> str:
        return (
            f"{self.scheduler}: {self.gangs} gangs, {self.pods} pods; required gangs in one rack "
            f"{self.required_in_one_rack}/{self.required}, preferred in one rack "
            f"{self.preferred_in_one_rack}/{self.preferred}; makespan {self.makespan:.1f}s, "
            f"lower bound {self.lower_bound:.1f}s, ratio {self.ratio:.2f}"
            + (f", INCOMPLETE {len(self.incomplete)}" if self.incomplete else "")
        )


def racks_per_gang(pods: list[dict[str, Any]]) -> dict[str, set[str]]:
    """gang -> the racks its bound (or finished) members were placed in."""
    racks: dict[str, set[str]] = {}
    for pod in pods:
        gang = (pod["metadata"].get("labels") or {}).get(GANG_LABEL)
        node = pod["spec"].get("nodeName")
        if gang and node:
            racks.setdefault(gang, set()).add(labels_of(node)[RACK])
    return racks


def run(
    runner: Runner,
    scheduler: str,
    gangs: list[GangSpec],
    work: float,
    timeout: float,
) -> Outcome:
    """Create every gang in a fresh namespace; wait until every member finished (or timeout)."""
    namespace = f"topology-{scheduler}-{int(time.time())}"
    runner.create_namespace(namespace)
    for gang in gangs:
        if scheduler == "ours":
            annotation = KUEUE_REQUIRED if gang.required else KUEUE_PREFERRED
            create_group(
                runner.custom,
                XK8S_API,
                namespace,
                gang.name,
                {"minMember": gang.size},
                {annotation: RACK},
            )
        else:
            spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": gang.size}}}
            if gang.required:
                spec["schedulingConstraints"] = {"topology": [{"key": RACK}]}
            create_group(runner.custom, NATIVE_API, namespace, gang.name, spec)
    bodies = []
    for gang in gangs:
        for i in range(gang.size):
            labels = {GANG_LABEL: gang.name}
            spec = {"schedulerName": SCHEDULER_NAME, "automountServiceAccountToken": False}
            if scheduler == "ours":
                labels[POD_GROUP_LABEL] = gang.name
            else:
                spec["schedulingGroup"] = {"podGroupName": gang.name}
            bodies.append(
                pause_pod(
                    f"{gang.name}-{i}",
                    cpu="1",
                    memory="64Mi",
                    labels=labels,
                    annotations={EXIT_AFTER: f"{work:g}"},
                    spec=spec,
                )
            )
    sizes = {g.name: g.size for g in gangs}
    done: dict[str, float] = {}
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: runner.core.create_namespaced_pod(namespace, b), bodies))
    pods: list[dict[str, Any]] = []
    deadline = start + timeout
    while time.monotonic() < deadline and len(done) < len(gangs):
        response = runner.core.list_namespaced_pod(namespace, _preload_content=False)
        pods = json.loads(response.data)["items"]
        now = time.monotonic()
        finished: dict[str, int] = {}
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == "Succeeded":
                gang = pod["metadata"]["labels"][GANG_LABEL]
                finished[gang] = finished.get(gang, 0) + 1
        for name, count in finished.items():
            if count >= sizes[name] and name not in done:
                done[name] = now
        time.sleep(0.5)
    racks = racks_per_gang(pods)
    required = [g for g in gangs if g.required]
    preferred = [g for g in gangs if not g.required]
    outcome = Outcome(
        scheduler=scheduler,
        gangs=len(gangs),
        pods=len(bodies),
        makespan=(max(done.values()) - start) if done else float("inf"),
        lower_bound=len(bodies) * work / (NODE_CPU * len(node_names())),
        required=len(required),
        required_in_one_rack=sum(1 for g in required if len(racks.get(g.name, ())) == 1),
        preferred=len(preferred),
        preferred_in_one_rack=sum(1 for g in preferred if len(racks.get(g.name, ())) == 1),
        incomplete=sorted(g.name for g in gangs if g.name not in done),
    )
    runner.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    runner.core.delete_namespace(namespace)
    return outcome


def with_scheduler(
    runner: Runner, name: str, extender_url: str | None, gates: bool, body: Callable[[], Outcome]
) -> Outcome:
    """Run `body` while this kube-scheduler (and only it) schedules the bench's pods."""
    process = runner.start_scheduler(name, extender_url, gates)
    try:
        time.sleep(3)  # its informers synced; no pod exists yet, so nothing is missed
        return body()
    finally:
        stop_process(process)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gangs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--work-seconds", type=float, default=15.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--only", choices=("ours", "native"), help="run one scheduler only")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(BENCH_DIR),
        "LOCAL_CLUSTER_PORT_OFFSET": str(PORT_OFFSET),
    }
    os.environ.update(env)
    lc = _local_cluster_module()
    local_cluster("down", env=env)
    out = local_cluster("up", "--nodes", "0", "--no-scheduler", "--feature-gates", GATES, env=env)
    kubeconfig = kubeconfig_of(out)
    config = lc.layout.Config.from_env(env)
    api = lc.api.Api(config)
    version = lc.toolchain.read_versions()["KUBE_VERSION"]
    for name in node_names():
        shape = lc.nodes.NodeShape(
            cpu=str(NODE_CPU), memory="16Gi", pods=110, labels=labels_of(name)
        )
        lc.nodes.create_fake_node(api, name, shape, version)
    extender_port = 18888 + PORT_OFFSET
    cluster = Cluster(
        kubeconfig=kubeconfig,
        scheduler_kubeconfig=str(config.layout.kubeconfig_for("kube-scheduler")),
        bin_dir=lc.toolchain.build_kube(),
        scheduler_port=config.ports.scheduler,
        work_dir=config.layout.root,
        extender_url=f"http://127.0.0.1:{extender_port}/scheduler",
        feature_gates=GATES,
    )
    runner = Runner(cluster, 100, lambda m: print(m, flush=True))
    gangs = workload(args.gangs, args.seed)
    print(
        f"{len(gangs)} gangs, {sum(g.size for g in gangs)} pods "
        f"({sum(g.required for g in gangs)} required rack), 16 nodes of {NODE_CPU} CPUs, "
        f"work {args.work_seconds:g}s, seed {args.seed}",
        flush=True,
    )
    figures: dict[str, Any] = {}
    try:
        if args.only in (None, "ours"):
            extender = start_extender(
                kubeconfig,
                extender_port,
                config.layout.logs / "bench-topology-extender.log",
                (
                    "--topology-levels",
                    f"{HOSTNAME},{RACK},{BLOCK},{ZONE}",
                    "--native-podgroups",
                    "off",
                ),
            )
            try:
                ours = with_scheduler(
                    runner,
                    "ours",
                    cluster.extender_url,
                    False,
                    lambda: run(runner, "ours", gangs, args.work_seconds, args.timeout),
                )
            finally:
                stop_process(extender)
            print(ours.line(), flush=True)
            figures["ours"] = {**ours.__dict__, "ratio": ours.ratio}
        if args.only in (None, "native"):
            native = with_scheduler(
                runner,
                "native",
                None,
                True,
                lambda: run(runner, "native", gangs, args.work_seconds, args.timeout),
            )
            print(native.line(), flush=True)
            figures["native"] = {**native.__dict__, "ratio": native.ratio}
    finally:
        local_cluster("down", env=env)
    if "ours" in figures and "native" in figures:
        figures["makespan_ours_over_native"] = (
            figures["ours"]["makespan"] / figures["native"]["makespan"]
        )
        print(f"makespan ours / native: {figures['makespan_ours_over_native']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
