"""The reflector's protocol (list, watch, resume, relist) over a scripted API.

tests/cluster/test_reflector.py runs it against the real API server; here
the answers the real server gives rarely (an ERROR event, a 410 on a page,
an object the cache cannot take) come from a script, with every request
the reflector makes recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from app.base.metrics import Metrics
from app.kube.errors import Gone, Transient
from app.kube.reflector import Collection, Reflector, ReflectorSettings, Sink

HANG = object()  # a watch step: stay open until cancelled


def listing(names: list[str], rv: str, cont: str = "") -> bytes:
    items = [{"metadata": {"name": n, "resourceVersion": rv}} for n in names]
    return orjson.dumps({"items": items, "metadata": {"resourceVersion": rv, "continue": cont}})


def line(kind: str, name: str, rv: str, **extra: Any) -> bytes:
    return orjson.dumps(
        {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}, **extra}}
    )


def error_line(code: int) -> bytes:
    return orjson.dumps(
        {"type": "ERROR", "object": {"kind": "Status", "code": code, "message": "m"}}
    )


@dataclass
class ScriptedApi:
    """Answers list pages and watches from scripts, and records every call's query."""

    pages: list[bytes | Exception]
    watches: list[list[bytes | Exception | object]]
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    opened: int = 0

    def _record(self, kind: str, path: str) -> dict[str, str]:
        query = {k: v[0] for k, v in parse_qs(urlsplit(path).query).items()}
        self.calls.append((kind, query))
        return query

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout_seconds: float = 10,
    ) -> bytes:
        self._record("list", path)
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return page

    async def watch(
        self,
        path: str,
        on_line: Callable[[bytes], None],
        *,
        on_open: Callable[[], None] = lambda: None,
        timeout_seconds: float,
        connect_timeout_seconds: float = 10,
        idle_seconds: float | None = None,
    ) -> None:
        self._record("watch", path)
        if not self.watches:
            await asyncio.Event().wait()  # nothing scripted: an idle watch
        steps = self.watches.pop(0)
        if steps and isinstance(steps[0], Exception):
            raise steps[0]
        self.opened += 1
        on_open()
        for step in steps:
            if step is HANG:
                await asyncio.Event().wait()
            elif isinstance(step, Exception):
                raise step
            else:
                assert isinstance(step, bytes)
                on_line(step)  # what it raises ends the watch, as in app/kube/http.py
            await asyncio.sleep(0)


@dataclass
class Cache:
    objects: dict[str, str] = field(default_factory=dict)
    lists: int = 0
    refuse: str = ""  # an object name upsert fails on

    def replace(self, items: list[Mapping[str, Any]]) -> None:
        self.lists += 1
        self.objects = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}

    def upsert(self, obj: Mapping[str, Any]) -> None:
        if obj["metadata"]["name"] == self.refuse:
            raise ValueError("cannot take it")
        self.objects[obj["metadata"]["name"]] = obj["metadata"]["resourceVersion"]

    def delete(self, obj: Mapping[str, Any]) -> None:
        self.objects.pop(obj["metadata"]["name"], None)

    def sink(self) -> Sink:
        return Sink(self.replace, self.upsert, self.delete, lambda: len(self.objects))


async def run_until(reflector: Reflector, done: Callable[[], bool], what: str) -> None:
    reflector.start()
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_list_pages_then_watch_from_the_list_and_apply_each_event() -> None:
    api = ScriptedApi(
        pages=[listing(["a", "b"], "10", cont="t1"), listing(["c"], "11")],
        watches=[
            [
                line("MODIFIED", "a", "12"),
                line("DELETED", "b", "13"),
                line("BOOKMARK", "", "14"),
                HANG,
            ]
        ],
    )
    cache = Cache()
    reflector = Reflector(Collection("things", "/api/v1/things"), cache.sink(), api, Metrics())
    reflector.settings = ReflectorSettings(page_size=2)
    try:
        await run_until(reflector, lambda: reflector.resource_version == "14", "the bookmark")
        assert cache.objects == {"a": "12", "c": "11"}
        assert cache.lists == 1 and reflector.synced and reflector.healthy
        assert api.calls == [
            ("list", {"limit": "2"}),
            ("list", {"limit": "2", "continue": "t1"}),
            (
                "watch",
                {
                    "watch": "true",
                    "resourceVersion": "11",
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "300",
                },
            ),
        ]
    finally:
        await reflector.stop()


async def test_an_expired_continue_token_starts_the_list_over() -> None:
    api = ScriptedApi(
        pages=[listing(["a"], "5", cont="t1"), Gone("410 continue"), listing(["a", "b"], "9")],
        watches=[[HANG]],
    )
    cache = Cache()
    reflector = Reflector(Collection("things", "/t"), cache.sink(), api, Metrics())
    reflector.settings = ReflectorSettings(page_size=1)
    try:
        await run_until(reflector, lambda: reflector.synced, "the list")
        assert cache.objects == {"a": "9", "b": "9"}
        assert [q.get("continue") for kind, q in api.calls if kind == "list"] == [None, "t1", None]
        assert reflector.resource_version == "9"
    finally:
        await reflector.stop()


@pytest.mark.parametrize("gone", [error_line(410), Gone("410 on the watch request")])
async def test_410_gone_lists_again_and_watches_from_the_new_list(gone: bytes | Exception) -> None:
    api = ScriptedApi(
        pages=[listing(["a", "b"], "5"), listing(["b", "c"], "20")],
        watches=[[line("ADDED", "x", "6"), gone], [HANG]],
    )
    if isinstance(gone, Exception):
        api.watches[0] = [gone]
    cache = Cache()
    metrics = Metrics()
    reflector = Reflector(Collection("things", "/t"), cache.sink(), api, metrics)
    try:
        await run_until(reflector, lambda: cache.lists == 2 and api.opened >= 1, "the relist")
        await asyncio.sleep(0.05)
        assert cache.objects == {"b": "20", "c": "20"}  # x and a went with the relist
        assert [q.get("resourceVersion") for kind, q in api.calls if kind == "watch"] == ["5", "20"]
        assert (
            metrics.registry.get_sample_value(
                "gang_extender_watch_restarts_total", {"kind": "things"}
            )
            == 1
        )
        assert reflector.healthy
    finally:
        await reflector.stop()


async def test_a_failed_watch_is_unhealthy_until_the_next_one_opens_from_the_same_point() -> None:
    api = ScriptedApi(
        pages=[listing(["a"], "5")],
        watches=[
            [line("ADDED", "b", "6"), error_line(500)],
            [Transient("connection refused")],
            [line("ADDED", "c", "7"), HANG],
        ],
    )
    cache = Cache()
    reflector = Reflector(Collection("things", "/t"), cache.sink(), api, Metrics())
    try:
        await run_until(reflector, lambda: reflector.last_error is not None, "the error")
        assert not reflector.healthy
        assert "watch error 500" in (reflector.last_error or "")
        await run_until(reflector, lambda: "c" in cache.objects, "the third watch")
        assert reflector.healthy
        assert [q.get("resourceVersion") for kind, q in api.calls if kind == "watch"] == [
            "5",
            "6",
            "6",
        ]
        assert cache.lists == 1
    finally:
        await reflector.stop()


async def test_an_object_the_cache_refuses_neither_stops_the_watch_nor_later_events() -> None:
    api = ScriptedApi(
        pages=[listing([], "1")],
        watches=[[line("ADDED", "bad", "2"), line("ADDED", "good", "3"), HANG]],
    )
    cache = Cache(refuse="bad")
    reflector = Reflector(Collection("things", "/t"), cache.sink(), api, Metrics())
    try:
        await run_until(reflector, lambda: "good" in cache.objects, "the next event")
        assert reflector.resource_version == "3"
        assert reflector.healthy
    finally:
        await reflector.stop()


async def test_reconnect_resumes_from_the_last_event_without_a_list() -> None:
    api = ScriptedApi(
        pages=[listing(["a"], "5")],
        watches=[[line("ADDED", "b", "6"), HANG], [line("ADDED", "c", "7"), HANG]],
    )
    cache = Cache()
    reflector = Reflector(Collection("things", "/t"), cache.sink(), api, Metrics())
    try:
        await run_until(reflector, lambda: "b" in cache.objects, "the first watch")
        reflector.reconnect()
        await run_until(reflector, lambda: "c" in cache.objects, "the second watch")
        assert [q.get("resourceVersion") for kind, q in api.calls if kind == "watch"] == ["5", "6"]
        assert cache.lists == 1
    finally:
        await reflector.stop()
    # Stopped: no task left, and stopping again is harmless.
    await reflector.stop()


async def test_a_list_landed_in_slices_is_all_in_before_the_watch_starts() -> None:
    """A sink may land a list in slices (the pods' does): the reflector waits for the last
    slice, the loop free meanwhile, and is synced and watching only after it."""
    api = ScriptedApi(pages=[listing(["a", "b", "c"], "5")], watches=[[HANG]])
    cache = Cache()
    during: list[tuple[bool, int]] = []

    async def in_slices(items: list[Mapping[str, Any]]) -> None:
        cache.lists += 1
        for item in items:
            during.append((reflector.synced, len(api.calls)))
            cache.objects[item["metadata"]["name"]] = item["metadata"]["resourceVersion"]
            await asyncio.sleep(0)

    sink = Sink(in_slices, cache.upsert, cache.delete, lambda: len(cache.objects))
    reflector = Reflector(Collection("things", "/t"), sink, api, Metrics())
    try:
        await run_until(reflector, lambda: api.opened == 1, "the watch")
        assert during == [(False, 1)] * 3  # not synced, no watch asked, while landing
        assert cache.objects == {"a": "5", "b": "5", "c": "5"} and reflector.synced
        assert [kind for kind, _ in api.calls] == ["list", "watch"]
    finally:
        await reflector.stop()
