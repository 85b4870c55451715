#!/usr/bin/env python3
"""`make bench`: speed and memory of the extender's hot paths, measured in one run.

Everything runs in this process against the real ASGI app (routes, wire
parsing, verbs) over an in-memory transport, with a synthetic cluster of
the given size. Absolute times drift on shared machines: compare the ratios
printed at the end, which are measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import sys
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from app.base.metrics import Metrics
from app.core.admission import Admission, WaitPolicy
from app.core.groups import POD_GROUP_LABEL, SOURCE_VOLCANO, VOLCANO_GROUP_ANNOTATIONS, GroupRef
from app.core.queues import QUEUE_ANNOTATION
from app.core.state import ClusterState
from app.core.topology.domains import HOSTNAME, ZONE
from app.core.topology.sources import (
    KUEUE_POD_INDEX,
    KUEUE_PREFERRED,
    KUEUE_REQUIRED,
    KUEUE_SLICE_REQUIRED,
    KUEUE_SLICE_SIZE,
)
from app.ops.heap import freeze_heap, full_collections_deferred
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.gate import PermitGate
from app.runtime.line_gangs import Waiting
from app.runtime.queues.book import QueueBook
from app.runtime.watches import land_pods
from app.web.extender import GangExtender
from app.web.routes import create_app
from app.web.verb_context import VerbCore, VerbLinks

# Run by path (`python bench/run.py`), sys.path[0] is bench/: the repository root makes
# bench/ and hack/ importable (app/ comes from the editable install).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results import run_info, write_json


def node(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"node-{i}", "labels": {"zone": f"z{i % 8}"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
    }


def pod(
    name: str, *, group: str | None = None, node_name: str = "", version: str = "1"
) -> dict[str, Any]:
    labels = {POD_GROUP_LABEL: group} if group else {}
    meta = {
        "name": name,
        "namespace": "bench",
        "uid": f"uid-{name}",
        "labels": labels,
        "resourceVersion": version,
    }
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node_name or None,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        },
        "status": {"phase": "Running" if node_name else "Pending"},
    }


class NullApi:
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        await asyncio.sleep(0)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asynccontextmanager
async def heap_kept_as_the_server_keeps_it() -> AsyncIterator[None]:
    """What app/ops/heap.py does once the caches are listed: everything alive now frozen,
    and no full collection of Python's own (the server runs one every
    --full-gc-interval-seconds, a minute by default: rarer than any row here)."""
    freeze_heap()
    try:
        with full_collections_deferred():
            yield
    finally:
        gc.unfreeze()


@asynccontextmanager
async def verbs_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` over an in-memory transport, the heap kept as the server keeps it."""
    async with (
        heap_kept_as_the_server_keeps_it(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench"
        ) as client,
    ):
        yield client


async def timed(
    client: httpx.AsyncClient, path: str, bodies: list[bytes], runs: int
) -> list[float]:
    """`runs` calls, with the bodies in turn: kube-scheduler sends each pod once per verb
    (the extender remembers the last body read, so one body sent again and again would
    time a memo, not a call)."""
    samples = []
    for i in range(runs):
        body = bodies[i % len(bodies)]
        start = time.perf_counter()
        response = await client.post(path, content=body)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, response.text
    return samples


def report(name: str, samples: list[float]) -> dict[str, float]:
    p50, p99 = percentile(samples, 0.5) * 1000, percentile(samples, 0.99) * 1000
    print(f"  {name:<58} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms")
    return {"p50_ms": p50, "p99_ms": p99}


async def main(nodes: int, pods: int, waiters: int, runs: int, rounds: int) -> dict[str, Any]:
    state = ClusterState()
    state.replace_nodes([node(i) for i in range(nodes)])
    groups = max(1, pods // 8)
    state.replace_pods(
        [pod(f"p{i}", group=f"g{i % groups}", node_name=f"node-{i % nodes}") for i in range(pods)]
    )
    state.apply_podgroup(
        {
            "metadata": {"name": "big", "namespace": "bench", "uid": "pg"},
            "spec": {"minMember": 4, "minResources": {"cpu": "8"}},
        }
    )
    state.apply_podgroup(
        {
            "metadata": {"name": "wait", "namespace": "bench", "uid": "pgw"},
            "spec": {"minMember": waiters + 1},
        }
    )
    for i in range(4):
        state.apply_pod(pod(f"big-{i}", group="big"))
    metrics = Metrics()
    admission = Admission(3)
    gate = PermitGate(state, admission, NullApi(), metrics)
    state.add_pod_listener(gate.on_pod_change)
    extender = GangExtender(
        VerbCore(state, admission, metrics, WaitPolicy(60, 80)), gate, NullApi()
    )
    app = create_app(extender, metrics, url_prefix="/scheduler", ready=lambda: (True, "ok"))
    names = [f"node-{i}" for i in range(nodes)]
    results: dict[str, Any] = {}

    async with verbs_client(app) as client:
        plain = [
            json.dumps({"Pod": pod(f"web-{i}"), "NodeNames": names, "Nodes": None}).encode()
            for i in range(runs)
        ]
        # The gang's four members in turn.
        member = [
            json.dumps({"Pod": pod(f"big-{i}", group="big"), "NodeNames": names}).encode()
            for i in range(4)
        ]
        full_nodes = [
            json.dumps(
                {
                    "Pod": pod(f"web-{i}"),
                    "Nodes": {"items": [node(i) for i in range(min(nodes, 1000))]},
                }
            ).encode()
            for i in range(2)
        ]
        print(f"cluster: {nodes} nodes, {pods} pods in {groups} gangs; {runs} calls per row")
        await timed(client, "/scheduler/filter", plain, 20)  # warm up
        results["filter_plain"] = report(
            "filter, pod in no gang (NodeNames)",
            await timed(client, "/scheduler/filter", plain, runs),
        )

        def fresh_admission() -> None:
            admission.forget("bench/big")

        fresh: list[float] = []
        for _ in range(runs):
            fresh_admission()
            fresh += await timed(client, "/scheduler/filter", member[len(fresh) % 4 :], 1)
        results["filter_gang_fresh"] = report(
            "filter, gang member, minResources check over all nodes", fresh
        )
        results["filter_gang_cached"] = report(
            "filter, gang member, permitted cache hit",
            await timed(client, "/scheduler/filter", member, runs),
        )
        # One: the filter named the member's node, and kube-scheduler calls no prioritize.
        answer = (await client.post("/scheduler/filter", content=member[0])).json()
        results["filter_gang_cached_nodes"] = len(answer["NodeNames"] or [])
        results["filter_full_nodes"] = report(
            f"filter, {min(nodes, 1000)} full Node objects (nodeCacheCapable false)",
            await timed(client, "/scheduler/filter", full_nodes, max(10, runs // 5)),
        )
        results["prioritize"] = report(
            "prioritize, gang member (locality + binpack)",
            await timed(client, "/scheduler/prioritize", member, runs),
        )

        # Event-loop responsiveness: many gang members parked in the gate.
        # Alternating rounds (idle batch, park the waiters, loaded batch,
        # release them) so that a noisy neighbour on a shared machine hits
        # both sides alike; the p99s are over the pooled samples.
        idle_samples: list[float] = []
        loaded_samples: list[float] = []
        threads_idle = threading.active_count()
        threads_loaded = 0
        waiter_bytes = 0
        for round_ in range(rounds):
            idle_samples += await timed(client, "/scheduler/filter", plain, runs)
            if round_ == 0:
                tracemalloc.start()
            for i in range(waiters):
                state.apply_pod(pod(f"w{round_}-{i}", group="wait"))
            binds = [
                asyncio.create_task(
                    client.post(
                        "/scheduler/bind",
                        content=json.dumps(
                            {
                                "PodName": f"w{round_}-{i}",
                                "PodNamespace": "bench",
                                "PodUID": f"uid-w{round_}-{i}",
                                "Node": f"node-{i % nodes}",
                            }
                        ).encode(),
                    )
                )
                for i in range(waiters)
            ]
            while len(gate.waiting("bench/wait")) < waiters:  # noqa: ASYNC110 - polling a count
                await asyncio.sleep(0.01)
            if round_ == 0:
                # Everything the parked requests hold: tasks, futures, gate records.
                waiter_bytes = tracemalloc.get_traced_memory()[0]
                tracemalloc.stop()
            threads_loaded = max(threads_loaded, threading.active_count())
            loaded_samples += await timed(client, "/scheduler/filter", plain, runs)
            gate.release_all("next round")
            await asyncio.gather(*binds)
            for i in range(waiters):
                state.delete_pod("bench", f"w{round_}-{i}")
        results["filter_plain_idle_rounds"] = report(
            f"filter, pod in no gang, no waiters ({rounds} rounds)", idle_samples
        )
        results["filter_plain_with_waiters"] = report(
            f"filter, pod in no gang, {waiters} members in the gate ({rounds} rounds)",
            loaded_samples,
        )
        # Fault 5 (docs/reliability.md): waiters hold no thread and little memory.
        results["threads_idle"] = threads_idle
        results["threads_with_waiters"] = threads_loaded
        results["bytes_per_gate_waiter"] = waiter_bytes / waiters
        print(
            f"  {'threads idle / with ' + str(waiters) + ' waiters':<58} "
            f"{threads_idle:8d} / {threads_loaded}"
        )
        print(
            f"  {'memory per waiting member (request + gate, tracemalloc)':<58} "
            f"{waiter_bytes / waiters:8.0f} bytes"
        )

    results.update(await preempt_rows(nodes, pods, runs))
    results.update(await topology_rows(nodes, pods, runs))
    results.update(await slice_rows(nodes, pods, min(runs, 50)))
    results.update(await device_rows(nodes, pods, runs))
    # 10 calls a side: with 1,000 gangs in line one call takes seconds at 5,000 nodes.
    results.update(await queue_rows(nodes, pods, min(runs, 10)))
    results.update(await retry_rows(nodes, pods, min(runs, 20)))

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    big = ClusterState()
    big.replace_pods(
        [pod(f"m{i}", group=f"g{i % groups}", node_name=f"node-{i % nodes}") for i in range(pods)]
    )
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(s.size_diff for s in after.compare_to(before, "filename"))
    results["bytes_per_cached_pod"] = used / pods
    print(f"  {'watch cache memory per pod (slim records)':<58} {used / pods:8.0f} bytes")

    # The pods start terminating (a field the verbs read changed), then the kubelet
    # updates their status (nothing the verbs read changed).
    terminating = [
        pod(f"m{i}", group=f"g{i % groups}", node_name=f"node-{i % nodes}", version="2")
        for i in range(pods)
    ]
    for raw in terminating:
        raw["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    status_only = [
        {**raw, "metadata": {**raw["metadata"], "resourceVersion": "3"}} for raw in terminating
    ]
    for label, events in (("a field read", terminating), ("status only", status_only)):
        start = time.perf_counter()
        for raw in events:
            big.apply_pod(raw)
        rate = pods / (time.perf_counter() - start)
        results[f"watch_events_per_second_{label.replace(' ', '_')}"] = rate
        print(f"  {f'pod MODIFIED events applied per second ({label})':<58} {rate:8.0f} /s")

    ratio = (
        results["filter_plain_with_waiters"]["p99_ms"]
        / results["filter_plain_idle_rounds"]["p99_ms"]
    )
    results["ratio_filter_p99_waiting_vs_idle"] = ratio
    cached = results["filter_gang_cached"]["p50_ms"] / results["filter_gang_fresh"]["p50_ms"]
    results["ratio_filter_cached_vs_fresh"] = cached
    print("ratios (same run):")
    print(f"  filter p99 with {waiters} waiters / idle filter p99      {ratio:6.2f}")
    print(f"  gang filter p50 permitted-cache / fresh admission   {cached:6.2f}")
    return results


async def preempt_rows(nodes: int, pods: int, runs: int) -> dict[str, Any]:
    """The preempt verb on a full cluster: every node holds pods of 400m CPU, 4 CPUs each.

    kube-scheduler sends up to max(100, 10% of the nodes) candidates, each
    with the victims it picked; a gang member's call makes the gang's plan
    (fresh) or is answered from it (plan lives).
    """
    state = ClusterState()
    per_node = max(1, pods // nodes)
    full = [
        {
            **node(i),
            "status": {
                "allocatable": {"cpu": f"{per_node * 400}m", "memory": "256Gi", "pods": "110"}
            },
        }
        for i in range(nodes)
    ]
    state.replace_nodes(full)
    filler = []
    for i in range(per_node * nodes):
        raw = pod(f"f{i}", node_name=f"node-{i % nodes}")
        raw["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "400m", "memory": "1Gi"}
        filler.append(raw)
    state.replace_pods(filler)
    state.apply_podgroup(
        {
            "metadata": {"name": "urgent", "namespace": "bench", "uid": "pgu"},
            "spec": {"minMember": 8},
        }
    )
    members = []
    for i in range(8):
        raw = pod(f"u{i}", group="urgent")
        raw["spec"]["priority"] = 1000
        raw["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2", "memory": "1Gi"}
        state.apply_pod(raw)
        members.append(raw)
    metrics = Metrics()
    admission = Admission(3)
    gate = PermitGate(state, admission, NullApi(), metrics)
    extender = GangExtender(
        VerbCore(state, admission, metrics, WaitPolicy(60, 80)), gate, NullApi()
    )
    state.add_pod_listener(extender.plans.on_pod_change)
    app = create_app(extender, metrics, url_prefix="/scheduler", ready=lambda: (True, "ok"))
    offered = max(100, nodes // 10)
    victims = {
        f"node-{n}": {
            "Pods": [{"UID": f"uid-f{n + k * nodes}"} for k in range(5)],
            "NumPDBViolations": 0,
        }
        for n in range(min(offered, nodes))
    }
    gang_bodies = [
        json.dumps({"Pod": m, "NodeNameToMetaVictims": victims}).encode() for m in members
    ]
    plain = pod("vip")
    plain["spec"]["priority"] = 1000
    plain_body = json.dumps({"Pod": plain, "NodeNameToMetaVictims": victims}).encode()
    out: dict[str, Any] = {}
    async with verbs_client(app) as client:
        print(
            f"preempt: {nodes} full nodes, {len(filler)} pods, {len(victims)} candidates per call"
        )
        fresh: list[float] = []
        # Warm up: the first plan also builds the free room kept per node (app/core/free_room.py).
        await timed(client, "/scheduler/preempt", gang_bodies, 1)
        for i in range(max(20, runs // 5)):
            extender.plans.plans.clear()
            fresh += await timed(client, "/scheduler/preempt", gang_bodies[i % 8 :], 1)
        out["preempt_gang_plan_made"] = report("preempt, gang member, the gang's plan made", fresh)
        out["preempt_gang_from_plan"] = report(
            "preempt, gang member, answered from the live plan",
            await timed(client, "/scheduler/preempt", gang_bodies, runs),
        )
        # Eight members of 2 CPUs: four emptied nodes of ten 400m pods each.
        out["plan_evictions"] = sum(p["evictions"] for p in extender.plans.snapshot())
        print(f"  {'evictions in the plan':<58} {out['plan_evictions']:8d}")
        out["preempt_plain"] = report(
            "preempt, pod in no gang", await timed(client, "/scheduler/preempt", [plain_body], runs)
        )
    return out


def arbiter_app(
    state: ClusterState, admission: Admission, gate: PermitGate, metrics: Metrics, arbiter: Arbiter
) -> FastAPI:
    """The verbs' ASGI app with `arbiter` deciding a fresh gang's admission."""
    extender = GangExtender(
        VerbCore(state, admission, metrics, WaitPolicy(60, 80)),
        gate,
        NullApi(),
        VerbLinks(arbiter=arbiter),
    )
    return create_app(extender, metrics, url_prefix="/scheduler", ready=lambda: (True, "ok"))


async def admitted_afresh(
    client: httpx.AsyncClient, arbiter: Arbiter, bodies: list[bytes], runs: int, gang: str
) -> list[float]:
    """`runs` filter calls, each admitting the gang afresh (its claim dropped in between)."""
    samples: list[float] = []
    for i in range(runs):
        arbiter.claims.clear()
        arbiter.on_nodes_changed()  # no memo of the last verdict
        samples += await timed(client, "/scheduler/filter", bodies[i % 2 :], 1)
    assert arbiter.claims, f"gang {gang} was not admitted"
    return samples


RACK, BLOCK = "example.com/rack", "example.com/block"


def racked_state(nodes: int, pods: int) -> ClusterState:
    """Nodes in racks of 20, blocks of 200 and zones of 1,250, running pods/nodes 1-CPU pods."""
    state = ClusterState()
    labelled = []
    for i in range(nodes):
        raw = node(i)
        raw["metadata"]["labels"] = {
            HOSTNAME: f"node-{i}",
            RACK: f"r{i // 20}",
            BLOCK: f"b{i // 200}",
            ZONE: f"z{i // 1250}",
        }
        labelled.append(raw)
    state.replace_nodes(labelled)
    state.replace_pods([pod(f"p{i}", node_name=f"node-{i % nodes}") for i in range(pods)])
    return state


def topology_arbiter(state: ClusterState) -> tuple[Arbiter, FastAPI]:
    """An arbiter with the levels hostname, rack, block, zone, and the verbs' app over it."""
    metrics = Metrics()
    admission = Admission(3)
    gate = PermitGate(state, admission, NullApi(), metrics)
    arbiter = Arbiter(
        state,
        admission,
        gate,
        lambda spec: 60.0,
        settings=ArbiterSettings(levels=(HOSTNAME, RACK, BLOCK, ZONE)),
    )
    return arbiter, arbiter_app(state, admission, gate, metrics, arbiter)


async def topology_rows(nodes: int, pods: int, runs: int) -> dict[str, Any]:
    """The filter verb admitting a fresh gang of 8 (--gang-feasibility), with topology or not.

    Nodes in racks of 20, blocks of 200 and zones of 1,250, each running
    pods/nodes pods of 1 CPU; a member asks for 40 of a node's 64 CPUs. Each
    call admits the gang afresh (its claim is dropped in between): the
    whole-gang check over every node, then per candidate domain.
    """
    rack = RACK

    def member(group: str, i: int) -> dict[str, Any]:
        if group != "hypernode":
            return pod(f"{group}-{i}", group=group)
        raw = pod(f"{group}-{i}")
        raw["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: group}
        return raw

    state = racked_state(nodes, pods)
    constraints = {
        "flat": None,
        "required": KUEUE_REQUIRED,
        "preferred": KUEUE_PREFERRED,
        "hypernode": None,
    }
    for name, annotation in constraints.items():
        meta: dict[str, Any] = {"name": name, "namespace": "bench", "uid": f"pg-{name}"}
        if annotation:
            meta["annotations"] = {annotation: rack}
        if name == "hypernode":
            # Volcano hard, tier 1: the tier-1 HyperNodes below (one per rack).
            spec = {"minMember": 8, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
            state.apply_podgroup({"metadata": meta, "spec": spec}, SOURCE_VOLCANO)
        else:
            state.apply_podgroup({"metadata": meta, "spec": {"minMember": 8}})
        for i in range(8):
            raw = member(name, i)
            raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "40"
            state.apply_pod(raw)
    # The racks and blocks again as Volcano HyperNodes (tier 1: a rack's 20 nodes by
    # exact name; tier 2: a block's racks), read as the watch would deliver them.
    hypernodes = [
        {
            "metadata": {"name": f"hn-r{r}"},
            "spec": {
                "tier": 1,
                "members": [
                    {"type": "Node", "selector": {"exactMatch": {"name": f"node-{i}"}}}
                    for i in range(r * 20, min(nodes, (r + 1) * 20))
                ],
            },
        }
        for r in range((nodes + 19) // 20)
    ] + [
        {
            "metadata": {"name": f"hn-b{b}"},
            "spec": {
                "tier": 2,
                "members": [
                    {"type": "HyperNode", "selector": {"exactMatch": {"name": f"hn-r{r}"}}}
                    for r in range(b * 10, min((nodes + 19) // 20, (b + 1) * 10))
                ],
            },
        }
        for b in range((nodes + 199) // 200)
    ]
    began = time.perf_counter()
    state.replace_hypernodes(hypernodes)
    relabel_ms = (time.perf_counter() - began) * 1000
    print(f"  {'HyperNodes read, every node relabelled':<58} {relabel_ms:8.1f} ms")
    arbiter, app = topology_arbiter(state)
    names = [f"node-{i}" for i in range(nodes)]
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        for name in constraints:
            bodies = [
                json.dumps({"Pod": member(name, i), "NodeNames": names}).encode() for i in range(2)
            ]
            samples = await admitted_afresh(client, arbiter, bodies, runs, name)
            out[f"filter_gang_admit_topology_{name}"] = report(
                f"filter, fresh gang of 8, topology {name} (rack of 20)", samples
            )
    out["hypernodes_relabel_ms"] = relabel_ms
    out["ratio_filter_p99_topology_required_vs_flat"] = (
        out["filter_gang_admit_topology_required"]["p99_ms"]
        / out["filter_gang_admit_topology_flat"]["p99_ms"]
    )
    return out


async def slice_rows(nodes: int, pods: int, runs: int) -> dict[str, Any]:
    """A fresh gang of 64 in slices of 16 (Kueue), in one block, next to a flat one of 64.

    Issue 48's target: the sliced gang's admission p99 at most 2x the flat
    gang's, both with a required block, measured in the same run. Racks of 20
    nodes, blocks of 200, each node running pods/nodes pods of 1 CPU; a
    member asks for 40 of a node's 64 CPUs (one per node), so a slice of 16
    needs most of a rack.
    """
    rack, block = RACK, BLOCK
    state = racked_state(nodes, pods)
    slices = {KUEUE_SLICE_REQUIRED: rack, KUEUE_SLICE_SIZE: "16"}

    def member(group: str, i: int) -> dict[str, Any]:
        raw = pod(f"{group}-{i}", group=group)
        raw["metadata"]["labels"][KUEUE_POD_INDEX] = str(i)
        raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "40"
        return raw

    for name in ("flat", "sliced"):
        annotations = {KUEUE_REQUIRED: block} | (slices if name == "sliced" else {})
        meta = {"name": name, "namespace": "bench", "uid": f"pg-{name}", "annotations": annotations}
        state.apply_podgroup({"metadata": meta, "spec": {"minMember": 64}})
        for i in range(64):
            state.apply_pod(member(name, i))
    arbiter, app = topology_arbiter(state)
    names = [f"node-{i}" for i in range(nodes)]
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        for name in ("flat", "sliced"):
            bodies = [
                json.dumps({"Pod": member(name, i), "NodeNames": names}).encode() for i in range(2)
            ]
            samples = await admitted_afresh(client, arbiter, bodies, runs, name)
            # The row times a tree placed slice by slice, not a flat gang.
            assert (len(arbiter.claims[f"bench/{name}"].groups) == 4) == (name == "sliced")
            out[f"filter_gang_admit_block_64_{name}"] = report(
                f"filter, fresh gang of 64 in one block, {name}"
                + (" (slices of 16 in racks)" if name == "sliced" else ""),
                samples,
            )
    out["ratio_filter_p99_sliced_vs_flat"] = (
        out["filter_gang_admit_block_64_sliced"]["p99_ms"]
        / out["filter_gang_admit_block_64_flat"]["p99_ms"]
    )
    print(
        f"  {'p99 ratio, sliced / flat (target at most 2)':<58} "
        f"{out['ratio_filter_p99_sliced_vs_flat']:8.2f}"
    )
    return out


DEVICE_DRIVER = "gpu.example.com"


def device_slice(i: int, devices: int) -> dict[str, Any]:
    """Node i's devices as its driver publishes them: one pool, alternately 40Gi and 80Gi."""
    return {
        "metadata": {"name": f"node-{i}-{DEVICE_DRIVER}"},
        "spec": {
            "driver": DEVICE_DRIVER,
            "nodeName": f"node-{i}",
            "pool": {"name": f"node-{i}", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{d}",
                    "attributes": {"model": {"string": "a100"}},
                    "capacity": {"memory": {"value": "80Gi" if d % 2 else "40Gi"}},
                }
                for d in range(devices)
            ],
        },
    }


async def device_rows(nodes: int, pods: int, runs: int, devices: int = 8) -> dict[str, Any]:
    """A fresh gang of 8 asking DRA devices, next to the same gang asking CPU alone (issue 47).

    Every node publishes `devices` devices (a ResourceSlice per node, as a
    driver does); a quarter of the nodes run a pod holding 2 of them through an
    allocated claim. The device gang's members ask 40 CPUs and 2 devices of at
    least 64Gi (a CEL selector) through a ResourceClaimTemplate; the CPU gang's
    ask 40 CPUs. Each call admits the gang afresh, as topology_rows does.
    """
    from app.runtime.device_cel import CelEngine

    state = ClusterState(CelEngine())
    state.replace_nodes([node(i) for i in range(nodes)])
    state.devices.replace(
        "deviceclasses",
        [
            {
                "metadata": {"name": DEVICE_DRIVER},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{DEVICE_DRIVER}"'}}]
                },
            }
        ],
    )
    state.devices.replace("resourceslices", [device_slice(i, devices) for i in range(nodes)])
    big = 'device.capacity["gpu.example.com"].memory.compareTo(quantity("64Gi")) >= 0'
    wanted = {
        "deviceClassName": DEVICE_DRIVER,
        "count": 2,
        "selectors": [{"cel": {"expression": big}}],
    }
    claim_spec = {"devices": {"requests": [{"name": "gpu", "exactly": wanted}]}}
    state.devices.replace(
        "resourceclaimtemplates",
        [{"metadata": {"name": "two-big", "namespace": "bench"}, "spec": {"spec": claim_spec}}],
    )
    holders = range(0, nodes, 4)
    held = {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_DRIVER, "count": 2}}]
        }
    }
    state.devices.replace(
        "resourceclaims",
        [
            {
                "metadata": {"name": f"held-{i}", "namespace": "bench"},
                "spec": held,
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "gpu",
                                    "driver": DEVICE_DRIVER,
                                    "pool": f"node-{i}",
                                    "device": f"gpu-{d}",
                                }
                                for d in (1, 3)
                            ]
                        }
                    }
                },
            }
            for i in holders
        ],
    )
    running = [pod(f"p{i}", node_name=f"node-{i % nodes}") for i in range(pods)]
    for i in holders:
        running[i]["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"held-{i}"}]
    state.replace_pods(running)

    def member(group: str, i: int) -> dict[str, Any]:
        raw = pod(f"{group}-{i}", group=group)
        raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "40"
        if group == "devices":
            raw["spec"]["resourceClaims"] = [
                {"name": "gpu", "resourceClaimTemplateName": "two-big"}
            ]
        return raw

    for group in ("cpu", "devices"):
        meta = {"name": group, "namespace": "bench", "uid": f"pg-{group}"}
        state.apply_podgroup({"metadata": meta, "spec": {"minMember": 8}})
        for i in range(8):
            state.apply_pod(member(group, i))
    metrics = Metrics()
    admission = Admission(3)
    gate = PermitGate(state, admission, NullApi(), metrics)
    arbiter = Arbiter(state, admission, gate, lambda spec: 60.0)
    app = arbiter_app(state, admission, gate, metrics, arbiter)
    names = [f"node-{i}" for i in range(nodes)]
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        for group in ("cpu", "devices"):
            bodies = [
                json.dumps({"Pod": member(group, i), "NodeNames": names}).encode() for i in range(2)
            ]
            samples = await admitted_afresh(client, arbiter, bodies, runs, group)
            asks = "2 devices a member (DRA)" if group == "devices" else "CPU only"
            out[f"filter_gang_admit_{group}"] = report(f"filter, fresh gang of 8, {asks}", samples)
    out["ratio_filter_p99_devices_vs_cpu"] = (
        out["filter_gang_admit_devices"]["p99_ms"] / out["filter_gang_admit_cpu"]["p99_ms"]
    )
    ratio = out["ratio_filter_p99_devices_vs_cpu"]
    print(f"  {'device gang p99 / CPU-only gang p99 (same run)':<58} {ratio:8.2f}")
    return out


@dataclass
class QueueCluster:
    """The cluster of the queue rows and the line sweep, and the fresh gang's filter bodies."""

    state: ClusterState
    nodes: int
    pods: int
    pending: int
    queue_specs: list[dict[str, Any]]
    bodies: list[bytes]


# --line-blocked: the waiting gangs' members ask more than any node has free (54 CPUs of
# 64, ten one-CPU pods on each) and fit every node once its pods end: aged, each holds
# what it can use, and the fresh gang's members fit only in the half CPU per node no
# member of theirs can ever use (app/core/backfill.py). The issue 46 story, in process.
BLOCKED_WAITING_CPU = "54500m"
BLOCKED_FRESH_CPU = "400m"


def _min_member(group: int, running: int, pending: int, blocked: bool) -> int:
    """1, but with --line-blocked each gang in line needs its 4 and the fresh gang its 8 (it
    needs the remainders of 8 nodes, where a gang of minMember 1 packs one member)."""
    if not blocked or group < running:
        return 1
    return 4 if group < running + pending else 8


def cluster_pods(
    nodes: int, pods: int, pending: int, *, blocked: bool = False, version: str = "1"
) -> list[dict[str, Any]]:
    """queue_cluster's pods: the running ones (at resourceVersion `version`: a relist's
    where they all changed), the waiting gangs' and, last, the fresh gang's 8."""
    waiting = [pod(f"w{i}", group=f"g{pods // 10 + i // 4}") for i in range(pending * 4)]
    for raw in waiting if blocked else ():
        raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = BLOCKED_WAITING_CPU
    fresh = [pod(f"new-{i}", group=f"g{pods // 10 + pending}") for i in range(8)]
    for raw in fresh:
        cpu = BLOCKED_FRESH_CPU if blocked else "40"
        raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    running = [
        pod(f"r{i}", group=f"g{i // 10}", node_name=f"node-{i % nodes}", version=version)
        for i in range(pods)
    ]
    return running + waiting + fresh


def queue_cluster(
    nodes: int, pods: int, queues: int, pending: int, *, blocked: bool = False
) -> QueueCluster:
    """`pods` running one-CPU pods in gangs of 10, `pending` gangs of 4 waiting, a fresh gang of 8.

    Every gang is in one of `queues` Volcano Queues (annotation
    scheduling.volcano.sh/queue-name on its PodGroup); the Queue objects
    themselves are given to an arbiter or not (`queue_arbiter`). `blocked`: the
    waiting gangs fit no node now (see BLOCKED_WAITING_CPU), and they and the fresh
    gang need every member (minMember 4 and 8).
    """
    state = ClusterState()
    state.replace_nodes([node(i) for i in range(nodes)])
    groups = [
        {
            "metadata": {
                "name": f"g{i}",
                "namespace": "bench",
                "uid": f"pg-g{i}",
                "annotations": {QUEUE_ANNOTATION: f"team-{i % queues}"},
                # As the API server stamps it (the line orders by it): one a second.
                "creationTimestamp": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_795_000_000 + i)
                ),
            },
            "spec": {"minMember": _min_member(i, pods // 10, pending, blocked)},
        }
        for i in range(pods // 10 + pending + 1)
    ]
    for group in groups:
        state.apply_podgroup(group)
    every = cluster_pods(nodes, pods, pending, blocked=blocked)
    state.replace_pods(every[:-8])
    for raw in every[-8:]:
        state.apply_pod(raw)
    new = pods // 10 + pending
    specs = [
        {"metadata": {"name": f"team-{q}"}, "spec": {"weight": 1 + q % 3}} for q in range(queues)
    ]
    names = [f"node-{i}" for i in range(nodes)]
    bodies = [
        json.dumps({"Pod": pod(f"new-{i}", group=f"g{new}"), "NodeNames": names}).encode()
        for i in range(2)
    ]
    return QueueCluster(state, nodes, pods, pending, specs, bodies)


def queue_arbiter(
    cluster: QueueCluster, queue_objects: list[dict[str, Any]]
) -> tuple[Arbiter, FastAPI]:
    """An arbiter that knows `queue_objects` (none: no queues), the pending gangs in its line,
    and the ASGI app that calls it."""
    state = cluster.state
    metrics = Metrics()
    admission = Admission(3)
    gate = PermitGate(state, admission, NullApi(), metrics)
    book = QueueBook(state, metrics=metrics)
    book.replace(queue_objects)
    arbiter = Arbiter(state, admission, gate, lambda spec: 60.0, ArbiterPeers(queues=book))
    first = cluster.pods // 10
    # The waiting gangs were turned away once, as in a busy cluster.
    for i in range(cluster.pending):
        arbiter.waiting[f"bench/g{first + i}"] = Waiting(GroupRef("bench", f"g{first + i}"), 0.0)
    app = arbiter_app(state, admission, gate, metrics, arbiter)
    return arbiter, app


async def fresh_admissions(
    client: httpx.AsyncClient,
    cluster: QueueCluster,
    arbiter: Arbiter,
    runs: int,
    churn: int,
    budget_seconds: float = math.inf,
) -> tuple[float, list[float]]:
    """The first fresh admission of the gang of 8 (the queues' tally built), then up to `runs`
    more, each after `churn` running pods of as many gangs ended and came back, as in a busy
    cluster (the tally kept between calls redoes those gangs, app/runtime/queues/tally.py).

    Stops early, after at least 3 timed calls, once `budget_seconds` have gone: a long line
    can make one call take seconds. Returns the first call's ms and the timed calls' seconds.
    """
    state, pods, nodes = cluster.state, cluster.pods, cluster.nodes
    first_ms = 0.0
    samples: list[float] = []
    began = time.monotonic()
    for i in range(runs + 1):
        if i > 3 and time.monotonic() - began > budget_seconds:
            break
        arbiter.claims.clear()
        arbiter.on_nodes_changed()  # no memo of the last verdict
        for j in range(i * churn, (i + 1) * churn):
            k = (j * 10) % pods
            state.delete_pod("bench", f"r{k}")
            state.apply_pod(pod(f"r{k}", group=f"g{k // 10}", node_name=f"node-{k % nodes}"))
        taken = await timed(client, "/scheduler/filter", cluster.bodies[i % 2 :], 1)
        if i == 0:
            # The first call builds the queues' tally from every pod, as a new extender's
            # first admission does; the rows time the calls after it.
            first_ms = taken[0] * 1000
            continue
        samples += taken
    assert arbiter.claims, "the fresh gang was not admitted"
    return first_ms, samples


async def queue_rows(
    nodes: int, pods: int, runs: int, queues: int = 20, pending: int = 1000, churn: int = 50
) -> dict[str, Any]:
    """The filter verb admitting a fresh gang of 8 with `queues` Volcano Queues, or none.

    The cluster of `queue_cluster`, `pending` gangs of 4 in line. With queues,
    every fresh admission tallies what each queue holds and waits for and
    computes the shares. Between two admissions `churn` running pods of as
    many gangs end and come back (`fresh_admissions`).
    """
    cluster = queue_cluster(nodes, pods, queues, pending)
    state = cluster.state
    out: dict[str, Any] = {}
    first_ms = 0.0
    variants: list[tuple[str, list[dict[str, Any]]]] = [
        ("none", []),
        (str(queues), cluster.queue_specs),
    ]
    for label, objects in variants:
        arbiter, app = queue_arbiter(cluster, objects)
        async with verbs_client(app) as client:
            first_ms, samples = await fresh_admissions(client, cluster, arbiter, runs, churn)
            # Nodes come and go in an autoscaled cluster: before each of these
            # admissions a node was cordoned or uncordoned (the tally redoes the
            # gangs on it, the free room every node).
            after_node: list[float] = []
            for i in range(runs):
                arbiter.claims.clear()
                arbiter.on_nodes_changed()
                raw = node((i // 2) % nodes)
                raw["spec"]["unschedulable"] = i % 2 == 0
                state.apply_node(raw)
                after_node += await timed(client, "/scheduler/filter", cluster.bodies[i % 2 :], 1)
            assert arbiter.claims, f"the gang was not admitted ({label} queues, nodes changed)"
        out[f"filter_gang_admit_queues_{label}"] = report(
            f"filter, fresh gang of 8, {pending} waiting, queues: {label}", samples
        )
        out[f"filter_gang_admit_queues_{label}_node_changed"] = report(
            f"  the same, a node cordoned or uncordoned before, queues: {label}", after_node
        )
    out["ratio_filter_p99_queues_vs_none"] = (
        out[f"filter_gang_admit_queues_{queues}"]["p99_ms"]
        / out["filter_gang_admit_queues_none"]["p99_ms"]
    )
    ratio = out["ratio_filter_p99_queues_vs_none"]
    print(f"  filter p99 with {queues} queues / without queues         {ratio:6.2f}")
    out["filter_gang_admit_queues_first_ms"] = first_ms  # the last variant's: with queues
    print(f"  the first such filter, the queues' tally built: {first_ms:.2f} ms")
    return out


async def retry_rows(nodes: int, pods: int, runs: int, pending: int = 1000) -> dict[str, Any]:
    """A gang turned away, retried by kube-scheduler: decided afresh, and answered again.

    The cluster of `queue_cluster` with `pending` gangs of 4 in line; the gang of 8
    asks 60 CPU a member, more than any node has free, so it is turned away. A fresh
    decision packs the line (its kept verdict dropped before each call); a retry with
    nothing changed is answered from the verdict kept (app/runtime/answers.py).
    """
    cluster = queue_cluster(nodes, pods, 1, pending)
    new = pods // 10 + pending
    for i in range(8):
        raw = pod(f"new-{i}", group=f"g{new}")
        raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "60"
        cluster.state.apply_pod(raw)
    arbiter, app = queue_arbiter(cluster, [])
    fresh: list[float] = []
    async with verbs_client(app) as client:
        for i in range(runs):
            arbiter.answers.forget()
            fresh += await timed(client, "/scheduler/filter", cluster.bodies[i % 2 :], 1)
        reused = arbiter.answers.reused
        retried = await timed(client, "/scheduler/filter", cluster.bodies, runs)
        assert arbiter.answers.reused - reused == runs, "a retry was decided afresh"
    assert not arbiter.claims, "the gang of 8 x 60 CPU was admitted"
    out: dict[str, Any] = {
        "filter_gang_turned_away_fresh": report(
            f"filter, gang turned away, {pending} in line, afresh", fresh
        ),
        "filter_gang_turned_away_retry": report(
            f"filter, gang turned away, {pending} in line, a retry", retried
        ),
    }
    ratio = (
        out["filter_gang_turned_away_retry"]["p50_ms"]
        / out["filter_gang_turned_away_fresh"]["p50_ms"]
    )
    out["ratio_filter_p50_retry_vs_fresh"] = ratio
    print(f"  filter p50 of a retry / of a fresh decision ({pending} in line)   {ratio:6.3f}")
    return out


class LoopProbe:
    """The longest the event loop went without running a task that was ready (a step that
    holds it: every verb and watch event waits that long). A task wakes every millisecond
    and notes how late it woke, and the CPU time this thread spent since its last wake
    (`longest_cpu`: the hold without the time the OS ran other processes, which on a
    loaded machine is most of the lateness)."""

    def __init__(self) -> None:
        self.longest = self.longest_cpu = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopProbe:
        self._task = asyncio.create_task(self._watch())
        await asyncio.sleep(0.005)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.005)
        assert self._task is not None
        self._task.cancel()

    async def _watch(self) -> None:
        while True:
            start, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.001)
            self.longest = max(self.longest, time.perf_counter() - start - 0.001)
            self.longest_cpu = max(self.longest_cpu, time.thread_time() - cpu)

    async def held(self, step: Any) -> float:
        """Run `step` (a coroutine or a plain call's result is awaited if needed); ms held
        (longest_cpu: of CPU time)."""
        self.longest = self.longest_cpu = 0.0
        result = step()
        if asyncio.iscoroutine(result):
            await result
        await asyncio.sleep(0.005)
        return self.longest * 1000


async def loop_rows(
    nodes: int, pods: int, pending: int, queues: int = 20, *, blocked: bool = False
) -> dict[str, Any]:
    """The longest any one step holds the event loop, `pending` gangs in line, `queues` queues:
    the queues' tally caught up in slices (as the queue status writer does between its
    ticks), the line's gangs built and walked in slices (as the line's warm-up does, also
    after the node change), the first admission, one after a node is cordoned, a relist of
    every pod, the tally caught up again and an admission after it. `blocked`: the line of
    --line-blocked, no queues (no tally steps)."""
    cluster = queue_cluster(nodes, pods, queues, pending, blocked=blocked)
    state = cluster.state
    arbiter, app = queue_arbiter(cluster, [] if blocked else cluster.queue_specs)
    relist = cluster_pods(nodes, pods, pending, blocked=blocked, version="2")
    out: dict[str, float] = {}
    cpu: dict[str, float] = {}
    async with verbs_client(app) as client, LoopProbe() as probe:

        async def admit() -> None:
            arbiter.claims.clear()
            arbiter.answers.forget()
            await timed(client, "/scheduler/filter", cluster.bodies, 1)
            assert arbiter.claims, "the fresh gang was not admitted"

        def cordon() -> None:
            raw = node(0)
            raw["spec"]["unschedulable"] = True
            state.apply_node(raw)

        book = arbiter.line.queues
        assert (book is None) == blocked
        steps: list[tuple[str, Any]] = [
            ("tally_caught_up_in_slices", book.catch_up if book else None),
            ("line_warmed_in_slices", arbiter.warmup.warm),
            ("first_admission", admit),
            ("admission", admit),
            ("node_cordoned", cordon),
            ("line_warmed_after_node", arbiter.warmup.warm),
            ("admission_after_node", admit),
            ("relist_pods_in_slices", lambda: land_pods(state, relist)),
            ("tally_caught_up_after_relist", book.catch_up if book else None),
            ("admission_after_relist", admit),
        ]
        steps = [(name, step) for name, step in steps if step is not None]
        for name, step in steps:
            out[name] = await probe.held(step)
            cpu[name] = probe.longest_cpu * 1000
    what = "blocked, no queues" if blocked else f"{queues} queues"
    print(f"the event loop held longest, {pending} in line, {what} (wall / CPU):")
    for step, ms in out.items():
        print(f"  {step.replace('_', ' '):<50} {ms:8.2f} / {cpu[step]:6.2f} ms")
    out["longest"], cpu["longest"] = max(out.values()), max(cpu.values())
    return {f"loop_held_ms_{k}": v for k, v in out.items()} | {
        f"loop_held_cpu_ms_{k}": v for k, v in cpu.items()
    }


async def line_sweep(
    nodes: int,
    pods: int,
    lengths: Sequence[int],
    *,
    queues: int = 20,
    runs: int = 20,
    churn: int = 50,
    budget_seconds: float = 60.0,
    blocked: bool = False,
) -> list[dict[str, Any]]:
    """A fresh gang of 8's admission (its first member's filter) with each of `lengths` gangs
    in line, with no queues and with `queues` Volcano Queues: the queue rows' admission
    (`fresh_admissions`) at every line length, for the plot of admission time against line
    length (bench/plots.py). `blocked`: the line's gangs fit no node now and the fresh gang
    only in what they can never use (queue_cluster; no queues then).

    Each point takes up to `runs` calls, fewer once `budget_seconds` have gone (at least 3):
    a long line can make one call take seconds. One point per length and queue setting:
    its calls, p50, p99, the longest call and the first call (the queues' tally built).
    """
    points: list[dict[str, Any]] = []
    print(
        f"line sweep: {nodes} nodes, {pods} pods, a fresh gang of 8 with N gangs of 4 in line"
        + (", which fit no node now (blocked)" if blocked else "")
    )
    for length in lengths:
        cluster = queue_cluster(nodes, pods, queues, length, blocked=blocked)
        settings: tuple[tuple[str, list[dict[str, Any]]], ...] = (
            ("none", []),
            (str(queues), cluster.queue_specs),
        )
        for label, objects in settings[:1] if blocked else settings:
            arbiter, app = queue_arbiter(cluster, objects)
            async with verbs_client(app) as client:
                first_ms, samples = await fresh_admissions(
                    client, cluster, arbiter, runs, churn, budget_seconds
                )
            row = report(f"{length:,} in line, queues: {label}, {len(samples)} calls", samples)
            longest = max(samples) * 1000
            print(f"  {'':<58} longest {longest:8.2f} ms   first {first_ms:8.2f} ms")
            points.append(
                {
                    "line": length,
                    "queues": label,
                    "calls": len(samples),
                    **row,
                    "max_ms": longest,
                    "first_ms": first_ms,
                }
            )
    return points


def line_lengths(text: str) -> list[int]:
    """--line-sweep's value: comma-separated counts of gangs in line, e.g. 0,100,1000,10000."""
    try:
        lengths = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of whole numbers (e.g. 0,100,1000,10000)"
        ) from None
    if not lengths or min(lengths) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more counts, none negative")
    return lengths


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--waiters", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--rounds", type=int, default=5, help="idle/loaded rounds of the gate-waiters ratio"
    )
    parser.add_argument(
        "--line-sweep",
        type=line_lengths,
        metavar="N,N,...",
        help="instead of the rows, time a fresh gang of 8's admission with each of these many "
        "gangs of 4 in line, without queues and with --line-queues (make bench: "
        "0,100,1000,10000; bench/plots.py draws it)",
    )
    parser.add_argument("--line-queues", type=int, default=20, help="queues of the sweep (20)")
    parser.add_argument(
        "--line-blocked",
        action="store_true",
        help="the sweep's (or --loop-rows') gangs in line fit no node now (aged, each holds what "
        "it can use) and the fresh gang fits only in what they never can: issue 46's deep "
        "line, no queues",
    )
    parser.add_argument(
        "--line-runs", type=int, default=50, help="calls per point of the sweep, at most (50)"
    )
    parser.add_argument(
        "--line-seconds",
        type=float,
        default=60.0,
        help="a point of the sweep stops taking calls after this long, at 3 calls or more (60)",
    )
    parser.add_argument(
        "--device-rows",
        action="store_true",
        help="instead of every row, only a fresh DRA device gang's admission next to a "
        "CPU-only gang's, same run (the rows make bench runs anyway)",
    )
    parser.add_argument(
        "--slice-rows",
        action="store_true",
        help="instead of every row, only a fresh gang of 64 in slices of 16 in one block next "
        "to a flat one of 64, same run (the rows make bench runs anyway)",
    )
    parser.add_argument(
        "--loop-rows",
        type=int,
        metavar="N",
        help="instead of every row, only the longest any one step holds the event loop, "
        "N gangs in line and --line-queues queues",
    )
    parser.add_argument(
        "--retry-rows",
        type=int,
        metavar="N",
        help="instead of every row, only a turned-away gang's filter decided afresh and retried "
        "with nothing changed, N gangs in line (the rows make bench runs it with 1,000)",
    )
    parser.add_argument(
        "--json", help="also write the figures to this file (make bench: bench/results/)"
    )
    args = parser.parse_args(argv)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    )
    command = "python bench/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    figures: dict[str, Any]
    if args.line_sweep:
        info = run_info(command.strip())  # the commit at the start: what was measured
        began = time.monotonic()
        points = asyncio.run(
            line_sweep(
                args.nodes,
                args.pods,
                args.line_sweep,
                queues=args.line_queues,
                runs=args.line_runs,
                budget_seconds=args.line_seconds,
                blocked=args.line_blocked,
            )
        )
        took = time.monotonic() - began
        print(f"line sweep took {took:.0f} s")
        figures = {
            **info,
            "nodes": args.nodes,
            "pods": args.pods,
            "queues": args.line_queues,
            "blocked": args.line_blocked,
            "seconds": took,
            "points": points,
        }
    elif args.slice_rows:
        figures = {
            **run_info(command.strip()),
            **asyncio.run(slice_rows(args.nodes, args.pods, args.runs)),
        }
    elif args.loop_rows is not None:
        figures = {
            **run_info(command.strip()),
            **asyncio.run(
                loop_rows(
                    args.nodes,
                    args.pods,
                    args.loop_rows,
                    args.line_queues,
                    blocked=args.line_blocked,
                )
            ),
        }
    elif args.retry_rows is not None:
        figures = {
            **run_info(command.strip()),
            **asyncio.run(retry_rows(args.nodes, args.pods, min(args.runs, 20), args.retry_rows)),
        }
    elif args.device_rows:
        figures = {
            **run_info(command.strip()),
            **asyncio.run(device_rows(args.nodes, args.pods, args.runs)),
        }
    else:
        figures = asyncio.run(main(args.nodes, args.pods, args.waiters, args.runs, args.rounds))
    if args.json:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
