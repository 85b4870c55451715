"""A watch's answer as lines, handed on as they arrive, the event loop given back in between.

The API server answers a watch with one JSON event per line, flushed as
events happen, and a blank line now and then to keep the connection alive;
app/kube/http.py opens the watch and hands its body here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from app.base.tasks import let_others_run
from app.core.clock import monotonic

LineHandler = Callable[[bytes], None]
"""Called on the loop with each line of a watch, in order; what it raises ends the watch."""


class LineBuffer:
    """A watch's answer, read in chunks, cut into its lines (one JSON event each).

    Blank lines (the API server's keep-alives) are dropped.
    """

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The lines `data` completes; a partial last line waits for the next chunk."""
        if b"\n" not in data:
            self._pending += data
            return []
        *lines, self._pending = (self._pending + data).split(b"\n")
        return [line for line in lines if line.strip()]

    def rest(self) -> list[bytes]:
        """The last line when the answer ended without a newline after it."""
        rest, self._pending = self._pending, b""
        return [rest] if rest.strip() else []


# The longest a watch's events hold the event loop before waiting verbs get a turn.
WATCH_SLICE_SECONDS = 0.0005


class WatchSilent(Exception):
    """No byte of a watch for its idle limit."""


async def stream_lines(
    content: aiohttp.StreamReader, on_line: LineHandler, idle_seconds: float | None
) -> None:
    """Each line of the answer to `on_line` as its chunk arrives; the last one at the end.

    One chunk can carry dozens of pod events (a burst of bindings): applied
    in one go they would hold a filter call that arrived meanwhile for
    milliseconds, and kube-scheduler waits for it. So the loop is given back
    every WATCH_SLICE_SECONDS; the events are still applied in order. No
    chunk for `idle_seconds` raises WatchSilent.
    """
    lines = LineBuffer()
    chunks = content.iter_any().__aiter__()
    while True:
        try:
            async with asyncio.timeout(idle_seconds):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise WatchSilent from None
        batch = lines.feed(chunk)
        until = monotonic() + WATCH_SLICE_SECONDS
        for line in batch:
            on_line(line)
            if monotonic() > until:
                await let_others_run()
                until = monotonic() + WATCH_SLICE_SECONDS
    for line in lines.rest():
        on_line(line)
