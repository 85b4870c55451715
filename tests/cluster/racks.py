"""Racks and blocks of labelled fake nodes, and what a placement test reads back from them.

The cluster tests of topology, sub-groups, KAI, LWS and their preemption
each bring their own nodes (the session's are cordoned meanwhile), labelled
with a rack and a block, and then ask which rack a gang's pods landed in
and what the extender told about it. One copy of that lives here.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterable, Iterator, Mapping

from app.core.topology.domains import HOSTNAME
from hack.clusterkit import local_cluster, wait_for
from tests.cluster.kube import LOW, Kube
from tests.cluster.session import Extender

RACK = "example.com/rack"
BLOCK = "example.com/block"


def create_labelled_nodes(
    kube: Kube, created: list[str], labels: Mapping[str, Mapping[str, str]], cpu: str
) -> None:
    """Each node of `labels` (node -> its labels) made with `cpu`, labelled, and added to
    `created` (Kube.nodes_of_its_own deletes those afterwards) as soon as it exists."""
    for name, its_labels in labels.items():
        kube.create_node(name, cpu)
        created.append(name)
        kube.label_node(name, dict(its_labels))


@contextlib.contextmanager
def node_pool(
    kube: Kube, extender: Extender, pool: str, shape: tuple[int, str, str], *extender_args: str
) -> Iterator[list[str]]:
    """`shape`: (count, cpu, memory) of fake nodes named `pool`-0.. and labelled
    pool=`pool`, with the extender restarted with `extender_args` added to its flags; both
    undone afterwards. Yields the nodes' names."""
    count, cpu, memory = shape
    names = [f"{pool}-{i}" for i in range(count)]
    for name in names:
        local_cluster("add-node", name, "--cpu", cpu, "--memory", memory, "--label", f"pool={pool}")
    previous = extender.extra_args
    extender.restart(*previous, *extender_args)
    try:
        yield names
    finally:
        extender.restart(*previous)
        for name in names:
            kube.delete_node(name)


@contextlib.contextmanager
def racks(kube: Kube, layout: dict[str, tuple[str, int]]) -> Iterator[dict[str, str]]:
    """Per rack (its block, its number of 1-CPU nodes): the nodes; yields node -> rack."""
    rack_of = {
        f"sub-{rack}-n{n}": rack for rack, (_, count) in layout.items() for n in range(count)
    }
    labels = {name: {RACK: rack, BLOCK: layout[rack][0]} for name, rack in rack_of.items()}
    with kube.nodes_of_its_own() as created:
        create_labelled_nodes(kube, created, labels, "1")
        yield rack_of


def fill_racks(kube: Kube, namespace: str, layout: Mapping[str, list[list[int]]]) -> dict[str, str]:
    """Low-priority pods pinned to the nodes of racks() (layout: per rack, per node, the
    millicpu of each pod on it), named low-0..; returns pod -> node once all are bound."""
    count = 0
    for rack, nodes in layout.items():
        for n, pods in enumerate(nodes):
            for millicpu in pods:
                body = kube.pod_body(f"low-{count}", cpu=f"{millicpu}m", priority_class=LOW)
                body["spec"]["nodeSelector"] = {HOSTNAME: f"sub-{rack}-n{n}"}
                kube.core.create_namespaced_pod(namespace, body)
                count += 1
    bound: dict[str, str] = wait_for(
        lambda: len(kube.bound(namespace)) == count and kube.bound(namespace),
        30,
        "the low-priority pods bound",
    )
    return bound


@contextlib.contextmanager
def filled_racks(
    kube: Kube,
    namespace: str,
    layout: Mapping[str, list[list[int]]],
    block_of: Mapping[str, str] | None = None,
) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """racks() of `layout` (each rack in its block of `block_of`, else b0) filled by
    fill_racks(): yields (node -> rack, low-priority pod -> node)."""
    blocks = {
        rack: ((block_of or {}).get(rack, "b0"), len(nodes)) for rack, nodes in layout.items()
    }
    with racks(kube, blocks) as rack_of:
        yield rack_of, fill_racks(kube, namespace, layout)


def one_rack(bound: Mapping[str, str], rack_of: Mapping[str, str], pods: Iterable[str]) -> str:
    """The one rack `pods` (bound: pod -> node) landed in; fails if they straddle racks."""
    pods = list(pods)
    landed = {rack_of[bound[pod]] for pod in pods}
    assert len(landed) == 1, f"{pods} straddle racks {sorted(landed)}: {dict(bound)}"
    return landed.pop()


def slice_racks(
    bound: dict[str, str], rack_of: dict[str, str], prefix: str, size: int
) -> list[str]:
    """The one rack each slice of `size` consecutive ranks landed in (fails if it straddles)."""
    return [
        one_rack(bound, rack_of, (f"{prefix}{i}" for i in range(first, first + size)))
        for first in range(0, len(bound), size)
    ]


def told(kube: Kube, namespace: str, text: str, pod: str | None = None) -> str | None:
    """The first event of the namespace (or of `pod`) whose text holds `text`."""
    return next((e for e in kube.events(namespace, pod) if text in e), None)


def topology_placed(kube: Kube, namespace: str) -> str:
    """The TopologyPlaced event that names the domain each sub-group (slice) took (30 s)."""
    event: str = wait_for(
        functools.partial(told, kube, namespace, "places its sub-groups"),
        30,
        "the TopologyPlaced event naming each sub-group's domain",
    )
    return event


def stays_unbound(kube: Kube, namespace: str, seconds: float = 3.0) -> None:
    """No pod of the namespace is bound for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not kube.bound(namespace)
        time.sleep(0.3)
