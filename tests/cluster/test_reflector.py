"""The reflector against the real API server: list, watch, reconnect, 410 Gone."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from typing import Any

from app.base.metrics import Metrics
from app.kube.http import AsyncApiClient
from app.kube.reflector import Collection, Reflector, ReflectorSettings, Sink
from tests.cluster.kube import Kube


class Recorder:
    """A sink that remembers every (uid, resourceVersion) it was given."""

    def __init__(self) -> None:
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.applied: Counter[tuple[str, str]] = Counter()
        self.lists = 0

    def _key(self, obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return meta.get("uid", ""), meta.get("resourceVersion", "")

    def replace(self, items: list[Mapping[str, Any]]) -> None:
        self.lists += 1
        self.objects = {self._key(o)[0]: o for o in items}

    def upsert(self, obj: Mapping[str, Any]) -> None:
        self.applied[self._key(obj)] += 1
        self.objects[self._key(obj)[0]] = obj

    def delete(self, obj: Mapping[str, Any]) -> None:
        self.applied[self._key(obj)] += 1
        self.objects.pop(self._key(obj)[0], None)

    def names(self) -> set[str]:
        return {(o.get("metadata") or {}).get("name", "") for o in self.objects.values()}


async def until(condition: Any, seconds: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def create(kube: Kube, namespace: str, name: str) -> None:
    kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": name}})


async def test_watch_resumes_after_drops_and_relists_after_410(kube: Kube, namespace: str) -> None:
    recorder = Recorder()
    metrics = Metrics()
    sink = Sink(recorder.replace, recorder.upsert, recorder.delete, lambda: len(recorder.objects))
    create(kube, namespace, "before")
    api = AsyncApiClient(kube.client.configuration)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    # Pages of 2: the list is paginated as with thousands of pods.
    reflector = Reflector(Collection("configmaps", path), sink, api, metrics)
    reflector.settings = ReflectorSettings(page_size=2)
    for i in range(3):
        create(kube, namespace, f"before-{i}")
    reflector.start()
    try:
        await until(lambda: reflector.synced, 10, "the first list")
        assert {"before", "before-0", "before-1", "before-2"} <= recorder.names()
        assert recorder.lists == 1

        # A dropped connection: changes made meanwhile arrive once each, no relist.
        reflector.reconnect()
        for i in range(5):
            await asyncio.to_thread(create, kube, namespace, f"during-{i}")
        await until(
            lambda: {f"during-{i}" for i in range(5)} <= recorder.names(),
            15,
            "the changes made while disconnected",
        )
        assert recorder.lists == 1
        assert max(recorder.applied.values()) == 1, "an event was applied twice"

        # A resourceVersion the server no longer has: 410 Gone, then a fresh list.
        # (The local API server compacts etcd every 10s and serves ConfigMap
        # watches from etcd, so revision 1 is gone after the first compaction.)
        await asyncio.sleep(11)
        reflector.resource_version = "1"
        reflector.reconnect()
        await until(lambda: recorder.lists == 2, 15, "a relist after 410 Gone")
        await asyncio.to_thread(create, kube, namespace, "after")
        await until(lambda: "after" in recorder.names(), 15, "watching again after the relist")
        assert reflector.healthy
        restarts = metrics.registry.get_sample_value(
            "gang_extender_watch_restarts_total", {"kind": "configmaps"}
        )
        assert restarts is not None and restarts >= 1
    finally:
        await reflector.stop()
        await api.close()


async def test_a_watch_the_server_ends_is_opened_again_without_a_list(
    kube: Kube, namespace: str
) -> None:
    """The API server ends every watch at its timeoutSeconds; nothing is missed or listed."""
    recorder = Recorder()
    sink = Sink(recorder.replace, recorder.upsert, recorder.delete, lambda: len(recorder.objects))
    api = AsyncApiClient(kube.client.configuration)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    reflector = Reflector(Collection("configmaps", path), sink, api, Metrics())
    reflector.settings = ReflectorSettings(watch_timeout_seconds=1)
    reflector.start()
    try:
        await until(lambda: reflector.synced, 10, "the first list")
        for i in range(4):
            await asyncio.sleep(0.7)  # across several watches of one second
            await asyncio.to_thread(create, kube, namespace, f"later-{i}")
        await until(
            lambda: {f"later-{i}" for i in range(4)} <= recorder.names(), 15, "every change"
        )
        assert recorder.lists == 1
        assert max(recorder.applied.values()) == 1, "an event was applied twice"
        assert reflector.healthy
    finally:
        await reflector.stop()
        await api.close()
