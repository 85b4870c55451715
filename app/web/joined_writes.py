"""Each answer leaves in one write: uvicorn's HTTP protocol over a transport that joins writes.

uvicorn writes an answer's head when the app sends `http.response.start`
and its body at `http.response.body`: two writes, and on uvloop two send
system calls, two TCP segments and, on kube-scheduler's side, two wake-ups
of its connection's reader for one answer (Go's net/http parses the head,
then waits again for the body). kube-scheduler makes three calls per pod in
the every-verb mode and a gang member's filter and bind in the gang-only
one, on the CPUs we share with it. Measured through kube-scheduler's own
extender client (`python -m bench.verbcost`, BENCHMARKS.md "Each answer in
one write"), joining them saves 4-7% of the client's CPU per filter or
prioritize call and 5-6% of ours.

ASGI has no message for head and body together, so the joining happens
below the protocol: JoinedWritesProtocol wraps the protocol uvicorn would
have used (composition; it neither subclasses uvicorn's nor reads its
attributes) and hands it a transport whose write() holds a write until the
next one, sending both in one call, or until the event loop's next turn. A
verb sends head and body in the same step, so no answer waits; a lone write
(a `100 Continue`, the last chunk of a streamed answer) waits one turn of
the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

__all__ = ["JoinedWrites", "JoinedWritesProtocol"]


class JoinedWrites(asyncio.Transport):
    """Sends the two writes of one event-loop step as one; all else is the real transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
            return
        self._held = None
        self._transport.write(held + data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        # What is held goes first: close() sends what was written, then closes.
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


class JoinedWritesProtocol(asyncio.Protocol):
    """uvicorn's httptools protocol (its `--http httptools`), on a JoinedWrites transport.

    Give the class to uvicorn.Config(http=...): uvicorn builds one per
    connection with its own arguments, which are handed on unread.
    """

    inner_protocol: type[asyncio.Protocol] = import_from_string(HTTP_PROTOCOLS["httptools"])

    def __init__(self, **uvicorn_arguments: Any) -> None:
        self._inner = self.inner_protocol(**uvicorn_arguments)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's transport (uvloop's are not asyncio.Transport subclasses).
        stream = cast(asyncio.Transport, transport)
        self._inner.connection_made(JoinedWrites(stream, asyncio.get_running_loop()))

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
