"""List-then-watch reflectors that keep ClusterState in step with the API server.

The protocol is client-go's Reflector: list (paginated) and remember the
list's resourceVersion; watch from it with bookmarks; on 410 Gone list again
and reconcile; on a dropped connection reconnect from the last
resourceVersion seen, with backoff. Watching from the last applied
resourceVersion is what makes every event count exactly once.

It all runs on the event loop, as one task per kind: the watch's bytes are
read by the loop (app/kube/http.py) and each event is decoded and applied as
its chunk arrives, so the cache is only ever touched from the loop's thread
and no reflector thread competes with the verbs for the GIL. (A watch read
on a thread cost chunked reading in urllib3, a wake-up of the loop and a GIL
hand-over per read; profiles of kube-scheduler calling us put that above the
decoding itself.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

import orjson

from app.base.metrics import Metrics
from app.core.clock import monotonic
from app.kube.errors import ApiError, Gone
from app.kube.http import Requests

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReflectorSettings:
    """How a reflector pages, times out and backs off: one place to tune a watch."""

    # Objects per list page: large lists arrive in pieces the API server can serve.
    page_size: int = 500
    # The API server ends a watch after this long; the reflector then watches again.
    watch_timeout_seconds: int = 300
    # A watch that carries nothing this long (no event, and none of the bookmarks the API
    # server sends a minute apart) is a dead connection: watch again from the last version.
    watch_idle_seconds: float = 150
    list_timeout_seconds: float = 60
    # The longest wait before retrying a failed list or watch (doubling from 0.5 s).
    max_backoff_seconds: float = 30.0


class ResourceExpired(Exception):
    """410 Gone: the resourceVersion we watch from is compacted away; list again."""


@dataclass(frozen=True)
class Sink:
    """What a reflector does with what it reads; all of it runs on the event loop.

    `replace` may return an awaitable: a large list landed in slices, the loop free
    between them; the watch starts once it is done.
    """

    replace: Callable[[list[Mapping[str, Any]]], Awaitable[None] | None]
    upsert: Callable[[Mapping[str, Any]], None]
    delete: Callable[[Mapping[str, Any]], None]
    count: Callable[[], int]


class ListWatch(Requests, Protocol):
    """The requests a reflector makes: app/kube/http.AsyncApiClient, or a test's script."""

    async def watch(
        self,
        path: str,
        on_line: Callable[[bytes], None],
        *,
        on_open: Callable[[], None] = ...,
        timeout_seconds: float,
        connect_timeout_seconds: float = 10,
        idle_seconds: float | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Collection:
    """What a reflector lists and watches: `path` (e.g. /api/v1/pods) with query `params`
    (a fieldSelector, say) on every list and watch; `kind` names it in logs and metrics."""

    kind: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)


class Reflector:
    """Lists and watches one collection into a Sink.

    `settings` is read at each list and watch; set another on an instance
    before start() (tests use small pages and short watches).
    """

    settings: ReflectorSettings = ReflectorSettings()

    def __init__(
        self, collection: Collection, sink: Sink, api: ListWatch, metrics: Metrics
    ) -> None:
        self.kind = kind = collection.kind
        self._collection = collection
        self._sink = sink
        self._api = api
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self._synced = False
        self._last_error: str | None = None
        self._last_event = monotonic()
        self.resource_version = ""
        metrics.watch_lag.labels(kind).set_function(lambda: monotonic() - self._last_event)
        metrics.cache_objects.labels(kind).set_function(lambda: float(self._sink.count()))

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Begin listing and watching; call on the event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"reflector-{self.kind}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def reconnect(self) -> None:
        """Drop the current watch connection; watching resumes from the last resourceVersion.

        What a network failure does; used by tests and safe at any time (on the loop).
        """
        if self._watching is not None:
            self._watching.cancel()

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

    # ---- the task ------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                if not self.resource_version:
                    await self._list()
                await self._watch()
                backoff = 0.5
            except ResourceExpired:
                log.info("%s watch expired (410 Gone); listing again", self.kind)
                self.resource_version = ""
                self._metrics.watch_restarts.labels(self.kind).inc()
            except Exception as err:
                self._last_error = f"{type(err).__name__}: {err}"
                self._metrics.watch_restarts.labels(self.kind).inc()
                log.warning(
                    "%s watch failed, retrying in %.1fs: %s", self.kind, backoff, self._last_error
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.max_backoff_seconds)

    def _url(self, **params: str) -> str:
        collection = self._collection
        return f"{collection.path}?{urlencode({**collection.params, **params})}"

    async def _list(self) -> None:
        items: list[Mapping[str, Any]] = []
        token = ""
        while True:
            params = {"limit": str(self.settings.page_size)}
            if token:
                params["continue"] = token
            try:
                body = await self._api.request(
                    "GET", self._url(**params), timeout_seconds=self.settings.list_timeout_seconds
                )
            except Gone:
                # The continue token expired: start the list over.
                items, token = [], ""
                continue
            page = orjson.loads(body)
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                self.resource_version = meta.get("resourceVersion") or ""
                break
        landing = self._sink.replace(items)
        if landing is not None:
            await landing
        self._synced = True
        self._last_error = None
        self._last_event = monotonic()
        log.info(
            "%s listed: %d objects at resourceVersion %s",
            self.kind,
            len(items),
            self.resource_version,
        )

    async def _watch(self) -> None:
        timeout = self.settings.watch_timeout_seconds
        path = self._url(
            watch="true",
            resourceVersion=self.resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(timeout),
        )
        self._watching = asyncio.get_running_loop().create_task(
            self._api.watch(
                path,
                self._on_line,
                on_open=self._opened,
                # The server's own timeout ends the watch; ours only catch a silent peer.
                timeout_seconds=timeout + 30,
                idle_seconds=self.settings.watch_idle_seconds,
            )
        )
        try:
            await asyncio.shield(self._watching)
        except Gone:
            raise ResourceExpired("the watch's resourceVersion is gone") from None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not self._watching.cancelled() or (current is not None and current.cancelling()):
                raise  # the reflector is stopping: the watch ends with it
            # reconnect(): only the watch was cancelled; resume from the last resourceVersion.
        finally:
            watching, self._watching = self._watching, None
            if watching is not None and not watching.done():
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)

    def _opened(self) -> None:
        """The API server accepted the watch: the cache is being kept current again."""
        self._last_error = None
        self._last_event = monotonic()

    def _on_line(self, line: bytes) -> None:
        """One watch event, applied at once (on the loop, inside the read of the stream)."""
        event = orjson.loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise ResourceExpired(obj.get("message", ""))
            raise WatchError(obj.get("code"), obj.get("message"))
        self._last_event = monotonic()
        if kind in ("ADDED", "MODIFIED"):
            self._apply(self._sink.upsert, obj)
        elif kind == "DELETED":
            self._apply(self._sink.delete, obj)
        elif kind != "BOOKMARK":
            log.warning("%s watch sent an unknown event type %r", self.kind, kind)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = rv

    def _apply(self, apply: Callable[[Mapping[str, Any]], None], obj: Mapping[str, Any]) -> None:
        try:
            apply(obj)
        except Exception:
            # One bad object must not stop the watch nor keep later events from the cache.
            log.exception("applying a %s watch event failed", self.kind)


class WatchError(ApiError):
    """The watch stream carried an ERROR event other than 410 Gone."""

    def __init__(self, code: Any, message: Any) -> None:
        super().__init__(f"watch error {code}: {message}")
