"""List-then-watch reflectors that keep ClusterState in step with the API server.

One thread per kind does the blocking HTTP work and JSON decoding; every
change is then applied on the asyncio loop (call_soon_threadsafe), so state is
only ever touched from one thread. The protocol is client-go's Reflector:
list (paginated) and remember the list's resourceVersion; watch from it with
bookmarks; on 410 Gone list again and reconcile; on a dropped connection
reconnect from the last resourceVersion seen, with backoff. Watching from the
last applied resourceVersion is what makes every event count exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from app.kube.client import read_and_release
from app.metrics import Metrics

log = logging.getLogger(__name__)

ListCall = Callable[..., Any]
"""A generated list method (e.g. CoreV1Api.list_node) or a partial of one."""

_PAGE_SIZE = 500
_WATCH_TIMEOUT_SECONDS = 300
_MAX_BACKOFF_SECONDS = 30.0


class ResourceExpired(Exception):
    """410 Gone: the resourceVersion we watch from is compacted away; list again."""


@dataclass(frozen=True)
class Sink:
    """What a reflector does with what it reads; all three run on the event loop."""

    replace: Callable[[list[Mapping[str, Any]]], None]
    upsert: Callable[[Mapping[str, Any]], None]
    delete: Callable[[Mapping[str, Any]], None]
    count: Callable[[], int]


class Reflector:
    def __init__(
        self,
        kind: str,
        list_call: ListCall,
        sink: Sink,
        loop: asyncio.AbstractEventLoop,
        metrics: Metrics,
        *,
        watch_timeout_seconds: int = _WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self.kind = kind
        self._list_call = list_call
        self._sink = sink
        self._loop = loop
        self._metrics = metrics
        self._watch_timeout = watch_timeout_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{kind}", daemon=True)
        self._response: Any = None
        self._synced = False
        self._last_error: str | None = None
        self._last_event = time.time()
        self.resource_version = ""
        metrics.watch_lag.labels(kind).set_function(lambda: time.time() - self._last_event)
        metrics.cache_objects.labels(kind).set_function(lambda: float(self._sink.count()))

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # Unblocks the thread's read of the watch stream.
            try:
                response.shutdown()
            except Exception:
                log.debug("closing %s watch failed", self.kind, exc_info=True)

    def reconnect(self) -> None:
        """Drop the current watch connection; the thread resumes from the last resourceVersion.

        What a network failure does; used by tests and safe at any time.
        """
        response = self._response
        if response is not None:
            response.shutdown()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def synced(self) -> bool:
        """The initial list has been applied to the state."""
        return self._synced

    @property
    def healthy(self) -> bool:
        return self._synced and self._last_error is None

    @property
    def last_error(self) -> str | None:
        return self._last_error

    # ---- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self._list()
                self._watch()
                backoff = 0.5
            except ResourceExpired:
                log.info("%s watch expired (410 Gone); listing again", self.kind)
                self.resource_version = ""
                self._metrics.watch_restarts.labels(self.kind).inc()
            except Exception as err:
                if self._stop.is_set():
                    break
                self._last_error = f"{type(err).__name__}: {err}"
                self._metrics.watch_restarts.labels(self.kind).inc()
                log.warning(
                    "%s watch failed, retrying in %.1fs: %s", self.kind, backoff, self._last_error
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)

    def _list(self) -> None:
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": _PAGE_SIZE}
            if token:
                kwargs["_continue"] = token
            try:
                page = self._read_json(self._list_call(_preload_content=False, **kwargs))
            except ApiException as err:
                if err.status == 410:
                    # The continue token expired: start the list over.
                    items, token = [], None
                    continue
                raise
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.resource_version = meta.get("resourceVersion") or ""
                break
        self._call_on_loop(self._apply_list, items)
        self._last_error = None
        self._last_event = time.time()
        log.info(
            "%s listed: %d objects at resourceVersion %s",
            self.kind,
            len(items),
            self.resource_version,
        )

    def _apply_list(self, items: list[Mapping[str, Any]]) -> None:
        self._sink.replace(items)
        self._synced = True

    def _watch(self) -> None:
        try:
            response = self._list_call(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _preload_content=False,
                _request_timeout=(10, self._watch_timeout + 30),
            )
        except ApiException as err:
            if err.status == 410:
                raise ResourceExpired(str(err.reason)) from None
            raise
        self._response = response
        self._last_error = None
        try:
            for batch in _event_batches(response):
                if self._stop.is_set():
                    return
                self._handle(batch)
        finally:
            self._response = None
            # A watch cut short still has unread bytes: close it, never reuse it.
            response.close()
            response.release_conn()

    def _handle(self, events: list[dict[str, Any]]) -> None:
        """Apply the events read in one go, with a single hand-over to the loop.

        One call_soon_threadsafe per event would wake the loop (a pipe write)
        for each of the several events a pod causes while it is scheduled.
        Events before an ERROR are still applied, in order.
        """
        changes: list[tuple[Callable[[Mapping[str, Any]], None], Mapping[str, Any]]] = []
        try:
            for event in events:
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise ResourceExpired(obj.get("message", ""))
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if kind in ("ADDED", "MODIFIED"):
                    changes.append((self._sink.upsert, obj))
                elif kind == "DELETED":
                    changes.append((self._sink.delete, obj))
                elif kind != "BOOKMARK":
                    log.warning("%s watch sent an unknown event type %r", self.kind, kind)
                if rv:
                    self.resource_version = rv
                self._last_event = time.time()
        finally:
            if changes:
                self._loop.call_soon_threadsafe(_apply_all, changes)

    # ---- helpers -----------------------------------------------------------------------

    def _call_on_loop(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run fn(arg) on the loop and wait for it, so the list is applied before watching."""
        done = threading.Event()

        def run() -> None:
            try:
                fn(arg)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        while not done.wait(0.5):
            if self._stop.is_set() or self._loop.is_closed():
                return

    @staticmethod
    def _read_json(response: Any) -> dict[str, Any]:
        data: dict[str, Any] = orjson.loads(read_and_release(response))
        return data


def _apply_all(
    changes: list[tuple[Callable[[Mapping[str, Any]], None], Mapping[str, Any]]],
) -> None:
    for apply, obj in changes:
        try:
            apply(obj)
        except Exception:
            # As when each event was its own loop callback: one bad object
            # must not keep the rest of the batch from the cache.
            log.exception("applying a watch event failed")


def _event_batches(response: Any) -> Iterator[list[dict[str, Any]]]:
    """Split a watch stream (one JSON object per line) into the events of each read."""
    buffer = b""
    for chunk in response.stream(65536, decode_content=True):
        buffer += chunk
        if b"\n" not in chunk:
            continue
        *lines, buffer = buffer.split(b"\n")
        batch = [orjson.loads(line) for line in lines if line.strip()]
        if batch:
            yield batch
    if buffer.strip():
        yield [orjson.loads(buffer)]
