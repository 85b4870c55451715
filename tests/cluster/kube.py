"""Test-side helpers for the real control plane: create objects, read what the API shows."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from app.core.groups import NATIVE_API, POD_GROUP_LABEL, VOLCANO_API, XK8S_API, GroupApi
from app.core.queues import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from hack.clusterkit import create_group, pause_pod, wait_for

# The tests' PriorityClasses (the `priorities` fixture, tests/cluster/conftest.py).
LOW, HIGH, TOP = "gang-test-low", "gang-test-high", "gang-test-top"
# How long the reports' watch waits for an API server that went away before it gives up.
_API_AWAY_SECONDS = 120.0


class SchedulingReports:
    """Every message kube-scheduler put in a namespace's pods' PodScheduled condition.

    kube-scheduler also records each failure as a FailedScheduling Event, but
    its events/v1 broadcaster keys a series on the pod reference (with its
    resourceVersion), type, reason and action, not on the note. A second
    failure that comes before kube-scheduler's informer has seen the first
    one's status patch (34 ms apart, in one run) only counts into the first
    Event's series and keeps the first note. A test waiting for the later
    reason (the extender shut down, the gate timed out) then waits in vain.
    The condition is patched with every failure's message, and a watch
    started before the namespace has pods sees each patch.
    """

    def __init__(self, core: Any, namespace: str) -> None:
        self._core = core
        self._namespace = namespace
        self._messages: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._failure: Exception | None = None
        version = core.list_namespaced_pod(namespace).metadata.resource_version
        self._thread = threading.Thread(
            target=self._run, args=(version,), name=f"reports-{namespace}", daemon=True
        )
        self._thread.start()

    def of(self, pod: str) -> list[str]:
        if self._failure is not None:
            raise AssertionError(f"the pod watch behind the reports ended: {self._failure!r}")
        with self._lock:
            return list(self._messages.get(pod, ()))

    def stop(self) -> None:
        """The thread ends with its current watch (at most 2 s); nothing waits for it."""
        self._stopped.set()

    def _run(self, version: str) -> None:
        """Watch until stopped; an API server away (a fault the soak injects) or a version
        compacted away (410) is followed by a fresh list, as an informer does. Only what
        that cannot mend ends the reports, and of() then says so."""
        lost_since: float | None = None
        while not self._stopped.is_set():
            try:
                if version == "":
                    listing = self._core.list_namespaced_pod(self._namespace)
                    for pod in listing.items:
                        self._record(pod)
                    version = listing.metadata.resource_version
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self._core.list_namespaced_pod,
                    self._namespace,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=2,
                )
                for event in stream:
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    if event["type"] != "BOOKMARK":
                        self._record(pod)
                lost_since = None
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as err:
                # Compacted away (410), the server away or not ready yet (a restarted one
                # answers 403 until its RBAC is loaded): list again, for a while.
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > _API_AWAY_SECONDS:
                    self._failure = err  # reported by of(), loudly
                    return
                version = ""
                self._stopped.wait(0.5)

    def _record(self, pod: Any) -> None:
        for condition in pod.status.conditions or ():
            if condition.type == "PodScheduled" and condition.status == "False":
                with self._lock:
                    seen = self._messages.setdefault(pod.metadata.name, [])
                    if condition.message and condition.message not in seen:
                        seen.append(condition.message)


class Kube:
    def __init__(self, client: k8s.ApiClient) -> None:
        self.client = client
        # Typed as Any: tests read optional model fields freely; a None where
        # the API must answer fails the test anyway.
        self.core: Any = k8s.CoreV1Api(client)
        self.apps: Any = k8s.AppsV1Api(client)
        self.custom: Any = k8s.CustomObjectsApi(client)
        self.scheduling: Any = k8s.SchedulingV1Api(client)
        self._reports: dict[str, SchedulingReports] = {}

    @contextlib.contextmanager
    def reporting(self, namespace: str) -> Iterator[None]:
        """While inside, events() on the namespace's pods also holds SchedulingReports."""
        self._reports[namespace] = SchedulingReports(self.core, namespace)
        try:
            yield
        finally:
            self._reports.pop(namespace).stop()

    # ---- objects --------------------------------------------------------------------

    def create_podgroup(
        self,
        namespace: str,
        name: str,
        min_member: int,
        *,
        timeout: int | None = None,
        min_resources: dict[str, str] | None = None,
    ) -> None:
        spec: dict[str, Any] = {"minMember": min_member}
        if timeout:
            spec["scheduleTimeoutSeconds"] = timeout
        if min_resources:
            spec["minResources"] = min_resources
        create_group(self.custom, XK8S_API, namespace, name, spec)

    def create_volcano_podgroup(
        self,
        namespace: str,
        name: str,
        min_member: int,
        *,
        min_task_member: dict[str, int] | None = None,
        queue: str = "default",
    ) -> None:
        spec: dict[str, Any] = {"minMember": min_member, "queue": queue}
        if min_task_member:
            spec["minTaskMember"] = min_task_member
        create_group(self.custom, VOLCANO_API, namespace, name, spec)

    def create_native_podgroup(
        self,
        namespace: str,
        name: str,
        min_count: int,
        *,
        priority_class: str | None = None,
        topology_key: str | None = None,
    ) -> None:
        """A native (scheduling.k8s.io) PodGroup, whole in one domain of `topology_key` if
        given. kube-scheduler schedules none of its pods unless their priority is the
        group's ("all pods in a single pod group should have the same priority as the pod
        group's priority"): members with a priority class need the group to name the same
        class."""
        spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
        if priority_class:
            spec["priorityClassName"] = priority_class
        if topology_key:
            spec["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
        create_group(self.custom, NATIVE_API, namespace, name, spec)

    def create_queue(
        self,
        name: str,
        weight: int = 1,
        *,
        capability: dict[str, str] | None = None,
        guarantee: dict[str, str] | None = None,
        reclaimable: bool = True,
    ) -> None:
        """A Volcano Queue (cluster-scoped); delete_queue() when done, other tests share it."""
        spec: dict[str, Any] = {"weight": weight, "reclaimable": reclaimable}
        if capability:
            spec["capability"] = capability
        if guarantee:
            spec["guarantee"] = {"resource": guarantee}
        self.custom.create_cluster_custom_object(
            QUEUE_GROUP,
            QUEUE_VERSION,
            QUEUE_PLURAL,
            {
                "apiVersion": f"{QUEUE_GROUP}/{QUEUE_VERSION}",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    def queue_object(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_cluster_custom_object(
            QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL, name
        )
        return obj

    def delete_queue(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL, name)
        except ApiException as err:
            if err.status != 404:
                raise

    def group_object(self, api: GroupApi, namespace: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            api.group, api.version, namespace, api.plural, name
        )
        return obj

    def pod_body(
        self,
        name: str,
        *,
        group: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        scheduling_group: str | None = None,
        cpu: str = "100m",
        memory: str = "64Mi",
        scheduler: str = "default-scheduler",
        priority_class: str | None = None,
    ) -> dict[str, Any]:
        all_labels = dict(labels or {})
        if group:
            all_labels[POD_GROUP_LABEL] = group
        spec: dict[str, Any] = {"schedulerName": scheduler}
        if priority_class:
            spec["priorityClassName"] = priority_class
        if scheduling_group:
            spec["schedulingGroup"] = {"podGroupName": scheduling_group}
        return pause_pod(
            name, cpu=cpu, memory=memory, labels=all_labels, annotations=annotations, spec=spec
        )

    def create_pod(self, namespace: str, name: str, **kwargs: Any) -> None:
        self.core.create_namespaced_pod(namespace, self.pod_body(name, **kwargs))

    def create_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        *,
        group: str | None = None,
        cpu: str = "100m",
        labels: dict[str, str] | None = None,
        **pod: Any,
    ) -> None:
        template = self.pod_body(
            name, group=group, labels={"app": name, **(labels or {})}, cpu=cpu, **pod
        )
        del template["metadata"]["name"]
        self.apps.create_namespaced_deployment(
            namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": template,
                },
            },
        )

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(
            name, namespace, {"spec": {"replicas": replicas}}
        )

    def ensure_priority_class(self, name: str, value: int) -> None:
        try:
            self.scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        except ApiException as err:
            if err.status != 409:
                raise

    def label_node(self, name: str, labels: dict[str, str | None]) -> None:
        """Set (or, with None, remove) node labels."""
        self.core.patch_node(name, {"metadata": {"labels": labels}})

    # ---- what the API server shows ----------------------------------------------------

    def pods(self, namespace: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(namespace).items)

    def bound(self, namespace: str) -> dict[str, str]:
        """pod name -> node, for pods that have a node."""
        return {p.metadata.name: p.spec.node_name for p in self.pods(namespace) if p.spec.node_name}

    def wait_bound(self, namespace: str, prefix: str, count: int) -> dict[str, str]:
        """Until `count` pods whose names start with `prefix` are bound (60 s): name -> node."""

        def bound() -> dict[str, str] | None:
            placed = {p: n for p, n in self.bound(namespace).items() if p.startswith(prefix)}
            return placed if len(placed) == count else None

        result: dict[str, str] = wait_for(bound, 60, f"{count} members of {prefix} bound")
        return result

    def events(self, namespace: str, pod: str | None = None) -> list[str]:
        """'reason: message' of the Events on `pod` (or the namespace's objects).

        For a pod of a namespace inside reporting(), also 'FailedScheduling:
        message' for each failure kube-scheduler reported in the pod's
        condition that its Events folded away (see SchedulingReports).
        """
        selector = f"involvedObject.name={pod}" if pod else None
        items = self.core.list_namespaced_event(namespace, field_selector=selector).items
        events = [f"{e.reason}: {e.message}" for e in items]
        reports = self._reports.get(namespace)
        if pod and reports:
            notes = {e.message for e in items if e.reason == "FailedScheduling"}
            events += [f"FailedScheduling: {m}" for m in reports.of(pod) if m not in notes]
        return events

    def event_on(self, namespace: str, pod: str, *parts: str) -> bool:
        """Some event on the pod contains every one of `parts` (case-insensitive)."""
        return any(
            all(part.lower() in event.lower() for part in parts)
            for event in self.events(namespace, pod)
        )

    def wait_for_event(self, namespace: str, pod: str, *parts: str, what: str) -> None:
        """Until event_on(); TimeoutError naming `what` after 30 s."""
        wait_for(lambda: self.event_on(namespace, pod, *parts), 30, what)

    def node_names(self) -> list[str]:
        return [n.metadata.name for n in self.core.list_node().items]

    def create_node(
        self, name: str, cpu: str, memory: str = "64Gi", labels: dict[str, str] | None = None
    ) -> None:
        """A Ready fake node (the pod simulator plays its kubelet), as hack/local-cluster makes;
        `labels` added to its own (a topology level's, say)."""
        own = {"kubernetes.io/hostname": name, "type": "fake-node"}
        self.core.create_node({"metadata": {"name": name, "labels": own | (labels or {})}})
        resources = {"cpu": cpu, "memory": memory, "pods": "110"}
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake"}
        self.core.patch_node_status(
            name,
            {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        )

    def cordon(self, name: str, unschedulable: bool = True) -> None:
        self.core.patch_node(name, {"spec": {"unschedulable": unschedulable}})

    @contextlib.contextmanager
    def nodes_of_its_own(self) -> Iterator[list[str]]:
        """The session's nodes cordoned; nodes the caller adds to the list deleted afterwards."""
        own = self.node_names()
        created: list[str] = []
        try:
            for name in own:
                self.cordon(name)
            yield created
        finally:
            for name in created:
                self.delete_node(name)
            for name in own:
                self.cordon(name, False)

    def delete_node(self, name: str) -> None:
        try:
            self.core.delete_node(name)
        except ApiException as err:
            if err.status != 404:
                raise

    def delete_pods_now(self, namespace: str) -> None:
        """No kubelet runs: a graceful delete would never finish, so force it."""
        self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
