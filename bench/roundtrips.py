"""Verb round trips as kube-scheduler's connections saw them, from a packet capture.

kube-scheduler (v1.37) keeps no latency metric per extender, and the
extender's own histogram starts once a request has been read: it leaves out
the time a request waits in the socket while the event loop is busy with
something else (a watch event, a collection, another connection), which is
exactly what a p99 is made of. So bench/e2e.py captures the loopback traffic
to the extender's port with tcpdump (headers and the request line only) and
times every request on the wire: from the first byte kube-scheduler sent to
the last byte of the answer. What is left out is kube-scheduler's own JSON
encoding before the first byte and decoding after the last, which is its CPU,
not the extender's.

kube-scheduler's HTTP client (Go's net/http, HTTP/1.1 to a plain-HTTP
extender) never pipelines: on one connection a request is sent whole, then
its answer comes back whole, then the next request. So a request starts with
the first client data after the server has answered (or with the
connection's first data), and its answer ends with the last server data
before the next request, the connection's end or the capture's end; no
header needs to be parsed, whatever the framing (Content-Length or chunked).
"""

from __future__ import annotations

import getpass
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

_BLOCK_TIMEOUT_SECONDS = 1.2

# Enough of each packet for the link, IP and TCP headers and the request line.
SNAPLEN = 192

_LINK_ETHERNET = 1
_LINK_LINUX_SLL = 113
_LINK_LINUX_SLL2 = 276
_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_TCP = 6
_FIN, _RST = 0x01, 0x04


@dataclass(frozen=True, slots=True)
class Segment:
    """One TCP segment of a capture: when, which way, and its payload."""

    time: float
    src: tuple[bytes, int]
    dst: tuple[bytes, int]
    payload_length: int  # on the wire (the capture keeps only its start)
    payload_start: bytes
    ends: bool  # FIN or RST


class PcapError(ValueError):
    """The file is not a pcap capture this module reads."""


def segments(data: bytes) -> Iterator[Segment]:
    """The TCP segments of a classic pcap file (Ethernet or Linux cooked links, IPv4/IPv6)."""
    if len(data) < 24:
        raise PcapError("shorter than a pcap header")
    magic = data[:4]
    formats = {
        b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
        b"\xa1\xb2\xc3\xd4": (">", 1e-6),
        b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
        b"\xa1\xb2\x3c\x4d": (">", 1e-9),
    }
    if magic not in formats:
        raise PcapError(f"not a pcap file (magic {magic.hex()}); pcapng is not read")
    order, fraction = formats[magic]
    (link,) = struct.unpack_from(order + "I", data, 20)
    record = struct.Struct(order + "IIII")
    offset = 24
    while offset + record.size <= len(data):
        seconds, part, captured, _original = record.unpack_from(data, offset)
        offset += record.size
        packet = data[offset : offset + captured]
        offset += captured
        found = _tcp(link, packet, seconds + part * fraction)
        if found is not None:
            yield found


def _tcp(link: int, packet: bytes, when: float) -> Segment | None:
    if link == _LINK_ETHERNET:
        if len(packet) < 14:
            return None
        (ethertype,), ip = struct.unpack_from("!H", packet, 12), 14
    elif link == _LINK_LINUX_SLL:
        if len(packet) < 16:
            return None
        (ethertype,), ip = struct.unpack_from("!H", packet, 14), 16
    elif link == _LINK_LINUX_SLL2:
        if len(packet) < 20:
            return None
        (ethertype,), ip = struct.unpack_from("!H", packet, 0), 20
    else:
        raise PcapError(f"link type {link} is not read (Ethernet or Linux cooked only)")
    if ethertype == _ETHERTYPE_IPV4:
        if len(packet) < ip + 20 or packet[ip + 9] != _TCP:
            return None
        header = (packet[ip] & 0x0F) * 4
        (total,) = struct.unpack_from("!H", packet, ip + 2)
        src_addr, dst_addr = packet[ip + 12 : ip + 16], packet[ip + 16 : ip + 20]
        ip_payload = total - header
    elif ethertype == _ETHERTYPE_IPV6:
        if len(packet) < ip + 40 or packet[ip + 6] != _TCP:
            return None  # extension headers are not followed: loopback sends none
        header = 40
        (ip_payload,) = struct.unpack_from("!H", packet, ip + 4)
        src_addr, dst_addr = packet[ip + 8 : ip + 24], packet[ip + 24 : ip + 40]
    else:
        return None
    tcp = ip + header
    if len(packet) < tcp + 14:
        return None
    src_port, dst_port = struct.unpack_from("!HH", packet, tcp)
    tcp_header = (packet[tcp + 12] >> 4) * 4
    flags = packet[tcp + 13]
    return Segment(
        time=when,
        src=(src_addr, src_port),
        dst=(dst_addr, dst_port),
        payload_length=max(0, ip_payload - tcp_header),
        payload_start=packet[tcp + tcp_header :],
        ends=bool(flags & (_FIN | _RST)),
    )


@dataclass
class _Connection:
    verb: str = ""
    started: float | None = None  # the request being answered
    answered: float | None = None  # the last answer byte so far


@dataclass
class RoundTrips:
    """verb -> seconds, one per request answered on the wire."""

    by_verb: dict[str, list[float]] = field(default_factory=dict)
    # Requests whose answer never came (the connection or the capture ended first).
    unanswered: int = 0


def round_trips(capture: Iterable[Segment], port: int) -> RoundTrips:
    """Time every HTTP request to `port` from its first byte to its answer's last byte."""
    result = RoundTrips()
    connections: dict[tuple[tuple[bytes, int], tuple[bytes, int]], _Connection] = {}

    def finish(connection: _Connection) -> None:
        if connection.started is None:
            return
        if connection.answered is None:
            result.unanswered += 1
        else:
            result.by_verb.setdefault(connection.verb, []).append(
                connection.answered - connection.started
            )
        connection.started = connection.answered = None

    for segment in capture:
        if segment.dst[1] == port:
            key, to_server = (segment.src, segment.dst), True
        elif segment.src[1] == port:
            key, to_server = (segment.dst, segment.src), False
        else:
            continue
        connection = connections.setdefault(key, _Connection())
        if segment.payload_length:
            if to_server:
                if connection.started is None or connection.answered is not None:
                    # A new request: the previous one (if any) was answered.
                    finish(connection)
                    connection.started = segment.time
                    connection.verb = _verb(segment.payload_start)
            elif connection.started is not None:
                connection.answered = segment.time
        if segment.ends:
            finish(connection)
            connections.pop(key, None)
    for connection in connections.values():
        finish(connection)
    return result


def _verb(start: bytes) -> str:
    """The last path segment of the request line ("POST /scheduler/filter HTTP/1.1")."""
    line = start.split(b"\r\n", 1)[0].split(b" ")
    if len(line) < 2:
        return "?"
    return line[1].split(b"?", 1)[0].rstrip(b"/").rsplit(b"/", 1)[-1].decode("latin-1") or "?"


class Capture:
    """tcpdump of loopback TCP traffic to and from `port`, into `path`, while it lives.

    Not available without tcpdump or the right to capture (root, or
    CAP_NET_RAW): `why_not` then says so and the bench reports the
    extender's own histogram only.
    """

    def __init__(self, port: int, path: Path) -> None:
        self.path = path
        self.port = port
        self.why_not: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        tcpdump = shutil.which("tcpdump")
        if tcpdump is None:
            self.why_not = "tcpdump is not installed (apt-get install tcpdump)"
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        log = path.with_suffix(".log")
        with log.open("wb") as out:
            self._process = subprocess.Popen(
                [
                    tcpdump,
                    "-i",
                    "lo",
                    "-n",
                    "-s",
                    str(SNAPLEN),
                    "-B",
                    "16384",
                    # Write as ourselves: tcpdump would otherwise drop to its own
                    # user, who may not write where the bench keeps its files.
                    "-Z",
                    getpass.getuser(),
                    "-w",
                    str(path),
                    f"tcp port {port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        # tcpdump says "listening on lo" once the capture is on.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if b"listening on" in log.read_bytes():
                return
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        self.why_not = f"tcpdump did not start capturing: {log.read_text(errors='replace')[-300:]}"

    def stop(self) -> RoundTrips | None:
        """End the capture; the round trips it saw (None when there was no capture)."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            # libpcap hands packets over a block at a time, at the latest after
            # its buffer timeout (1 s for tcpdump); an interrupt drops a block
            # not handed over yet, so wait that long first.
            time.sleep(_BLOCK_TIMEOUT_SECONDS)
            process.send_signal(signal.SIGINT)  # writes out what it holds
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if self.why_not is not None:
            return None
        try:
            return round_trips(segments(self.path.read_bytes()), self.port)
        except (OSError, PcapError) as err:
            self.why_not = f"the capture {self.path} could not be read: {err}"
            return None
