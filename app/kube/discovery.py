"""Which PodGroup sources the API server serves: asked once, at start-up.

A source is used when its flag is on (auto) and the API server answers a
list of its objects; the coordinates come from app/core/groups.py.
"""

from __future__ import annotations

import logging

from app.config import Settings
from app.core.composite import COMPOSITE_GROUP, COMPOSITE_PLURAL, COMPOSITE_VERSION
from app.core.devices.records import API_GROUP as DRA_GROUP
from app.core.devices.records import API_VERSION as DRA_VERSION
from app.core.groups import (
    GROUP_APIS,
    SOURCE_KAI,
    SOURCE_KUEUE,
    SOURCE_LABELS,
    SOURCE_LWS,
    SOURCE_NATIVE,
    SOURCE_VOLCANO,
    SOURCE_XK8S,
    SOURCE_YUNIKORN,
)
from app.core.queues import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from app.core.topology import hypernode
from app.kube.errors import Forbidden, NotFound
from app.kube.http import Requests

log = logging.getLogger(__name__)


async def discover_sources(requests: Requests, settings: Settings) -> frozenset[str]:
    """The group sources to use: switched on by their flag and served by the API server.

    Asked once, at start-up. A source whose API is absent is
    off, with one info line; a CRD installed later needs a restart.
    """
    sources = {SOURCE_LABELS} if settings.label_groups == "on" else set()
    if settings.kueue_pod_groups == "on":
        sources.add(SOURCE_KUEUE)
    if settings.yunikorn_task_groups == "on":
        sources.add(SOURCE_YUNIKORN)
    if settings.lws_gangs == "on":
        sources.add(SOURCE_LWS)
    modes = {
        SOURCE_XK8S: ("--x-k8s-podgroups", settings.x_k8s_podgroups),
        SOURCE_VOLCANO: ("--volcano-podgroups", settings.volcano_podgroups),
        SOURCE_NATIVE: ("--native-podgroups", settings.native_podgroups),
        SOURCE_KAI: ("--kai-podgroups", settings.kai_podgroups),
    }
    for source, (flag, mode) in modes.items():
        api = GROUP_APIS[source]
        if mode == "off":
            log.info("%s PodGroups (%s) are off: %s off", source, api.api_version, flag)
            continue
        if await _served(requests, api.group, api.version, api.plural, f"{source} PodGroups", flag):
            sources.add(source)
    if SOURCE_NATIVE in sources:
        log.info(
            "native PodGroups are gated by gang-extender: the kube-scheduler profile that "
            "calls it must disable the in-tree GangScheduling plugin (or set "
            "--native-podgroups=off to leave them to that plugin)"
        )
    log.info("group sources in use: %s", ", ".join(sorted(sources)) or "none")
    return frozenset(sources)


async def hypernodes_served(requests: Requests, sources: frozenset[str]) -> bool:
    """Read Volcano HyperNodes: Volcano PodGroups are in use and the API server serves them.

    Asked at start-up. Without them Volcano's networkTopology tiers are the
    levels of --topology-levels above the node.
    """
    if SOURCE_VOLCANO not in sources:
        return False
    served = await _served(
        requests,
        hypernode.API_GROUP,
        hypernode.API_VERSION,
        hypernode.PLURAL,
        "Volcano HyperNodes",
        "--volcano-podgroups",
    )
    if served:
        log.info("Volcano HyperNodes are read: their tiers are the levels of networkTopology")
    return served


async def composites_served(requests: Requests, sources: frozenset[str]) -> bool:
    """Read Kubernetes' CompositePodGroups (KEP-6012, scheduling.k8s.io/v1alpha3, gate
    CompositePodGroup): native PodGroups are in use and the API server serves them.

    Asked at start-up. Without them a PodGroup naming a parent
    (spec.parentCompositePodGroupName) is read as a flat native PodGroup.
    """
    if SOURCE_NATIVE not in sources:
        return False
    served = await _served(
        requests,
        COMPOSITE_GROUP,
        COMPOSITE_VERSION,
        COMPOSITE_PLURAL,
        "CompositePodGroups",
        "--native-podgroups",
    )
    if served:
        log.info(
            "CompositePodGroups watched: the pods of every leaf PodGroup of a tree form one "
            "gang, keyed by its root"
        )
    return served


async def _served(
    requests: Requests, group: str, version: str, plural: str, what: str, flag: str
) -> bool:
    """Does the API server answer a list of these objects (404: not installed; 403: no RBAC)?"""
    try:
        await requests.request("GET", f"/apis/{group}/{version}/{plural}?limit=1")
    except NotFound:
        log.info("%s are off: the API server does not serve %s/%s %s", what, group, version, plural)
        return False
    except Forbidden:
        log.warning(
            "%s are off: listing %s/%s %s is forbidden; grant get, list and watch on it to "
            "this ServiceAccount%s",
            what,
            group,
            version,
            plural,
            f", or set {flag} off" if flag else "",
        )
        return False
    return True


async def discover_queues(requests: Requests, settings: Settings) -> bool:
    """Whether to watch Volcano Queues: --queues auto and the API server serves them.

    Asked once, at start-up, like discover_sources.
    """
    if settings.queues == "off":
        log.info("Volcano Queues are off: --queues off")
        return False
    served = await _served(
        requests, QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL, "Volcano Queues", "--queues"
    )
    if served:
        log.info("Volcano Queues watched: the cluster is shared by weight once a Queue exists")
    return served


async def discover_dra(requests: Requests) -> bool:
    """Whether to watch DRA objects: the API server serves resource.k8s.io/v1 (1.34 and later).

    Asked once, at start-up. Without them devices are not counted (a gang of
    GPU pods is then checked on CPU and memory alone).
    """
    served = await _served(requests, DRA_GROUP, DRA_VERSION, "resourceslices", "DRA devices", "")
    if served:
        log.info("DRA devices counted: ResourceSlices, DeviceClasses and ResourceClaims watched")
    return served
