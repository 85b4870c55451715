"""A slow API server for chosen clients: a loopback TCP relay that delays every byte it carries.

Put in front of kube-apiserver (a kubeconfig whose server is the relay's
address), it makes the API server look slow to that client only: bytes from
the server to the client (watch events, list and write answers) arrive
`down` seconds late, bytes from the client to the server (requests, so
writes) `up` seconds late. TLS passes through untouched: the API server's
certificate covers 127.0.0.1, and the relay only moves bytes. Order is kept
(a chunk is never sent before the one read before it), so the delay is
latency, not lost throughput. The relay listens on 127.0.0.1 only and stops
by itself after `max_seconds`, so a test that dies cannot leave it behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Delay:
    """A delay drawn per chunk, uniformly between `low` and `high` seconds."""

    low: float = 0.0
    high: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"a delay needs 0 <= low <= high, got {self.low}..{self.high}")

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else rng.uniform(self.low, self.high)


@dataclass(slots=True)
class RelayStats:
    connections: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    cut: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class SlowRelay:
    """127.0.0.1:<port> -> `target`, each direction delayed; runs on its own thread's loop."""

    def __init__(
        self,
        target_port: int,
        *,
        down: Delay = Delay(),
        up: Delay = Delay(),
        seed: int = 0,
        max_seconds: float = 3600.0,
    ) -> None:
        self.target_port = target_port
        self.down = down
        self.up = up
        self.stats = RelayStats()
        self._rng = random.Random(seed)
        self._max_seconds = max_seconds
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="slow-relay", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> SlowRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the slow relay did not start within 10s")
        return self

    def set_delays(self, down: Delay, up: Delay) -> None:
        """Change the delays of every open and future connection (e.g. quiet, then slow)."""
        self.down, self.up = down, up

    def cut(self) -> None:
        """Close every open connection at once (clients see their watches and calls break)."""
        self._loop.call_soon_threadsafe(self._cut)

    def stop(self) -> None:
        if self._stopped.is_set() or not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(10)

    # ---- on the relay's loop -----------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._stopped.set()
            self._loop.close()

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(self._max_seconds)
        self._cut()
        self._server.close()
        await self._server.wait_closed()

    def _shutdown(self) -> None:
        for task in asyncio.all_tasks(self._loop):
            task.cancel()

    def _cut(self) -> None:
        self.stats.cut += len(self._writers)
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.stats.connections += 1
        self._writers.update((writer, up_writer))

        def abort_both() -> None:
            # A reset on one side resets the other, as a direct connection would show it: a
            # client left open here would wait on a dead API server until its own health
            # check (client-go's HTTP/2 ping, 45 s) gave up.
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, abort_both, downstream=False),
                self._pipe(up_reader, writer, abort_both, downstream=True),
            )
        finally:
            abort_both()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        abort_both: Callable[[], None],
        *,
        downstream: bool,
    ) -> None:
        """Forward chunks in order, each at (time read + its delay), never before the previous.

        A clean end (EOF) is passed on as a half-close; a broken side breaks
        the whole connection, both sides at once: a failed write at once, a
        reset read after what was read before it is delivered (None marks it).
        """
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def send() -> None:
            try:
                while True:
                    due, data = await queue.get()
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if data is None:
                        abort_both()
                        return
                    if not data:
                        with contextlib.suppress(OSError):
                            writer.write_eof()
                        return
                    writer.write(data)
                    await writer.drain()
                    if downstream:
                        self.stats.bytes_down += len(data)
                    else:
                        self.stats.bytes_up += len(data)
            except (OSError, ConnectionError):
                abort_both()

        sender = asyncio.ensure_future(send())
        last_due = 0.0
        try:
            while True:
                data = await reader.read(65536)
                delay = (self.down if downstream else self.up).draw(self._rng)
                last_due = max(last_due, time.monotonic() + delay)
                queue.put_nowait((last_due, data))
                if not data:
                    break
        except (OSError, ConnectionError):
            queue.put_nowait((last_due, None))
        try:
            await sender
        finally:
            sender.cancel()


@contextlib.contextmanager
def slow_relay(
    target_port: int, *, down: Delay, up: Delay, seed: int = 0, max_seconds: float = 3600.0
) -> Iterator[SlowRelay]:
    relay = SlowRelay(target_port, down=down, up=up, seed=seed, max_seconds=max_seconds).start()
    try:
        yield relay
    finally:
        relay.stop()
