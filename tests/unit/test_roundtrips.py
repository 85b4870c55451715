"""bench/roundtrips.py: verb round trips read from a pcap capture (built here byte by byte)."""

from __future__ import annotations

import struct

import pytest

from bench.roundtrips import PcapError, round_trips, segments

SERVER = 18888
CLIENT = 40000
LOOPBACK = bytes([127, 0, 0, 1])
_SYN, _ACK, _PSH, _FIN, _RST = 0x02, 0x10, 0x08, 0x01, 0x04


def packet(
    src_port: int, dst_port: int, payload: bytes = b"", flags: int = _ACK, *, snap: int = 192
) -> tuple[bytes, int]:
    """(captured bytes, length on the wire) of an Ethernet/IPv4/TCP packet on lo."""
    tcp = struct.pack("!HHIIBBHHH", src_port, dst_port, 0, 0, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(tcp) + len(payload),
        0,
        0,
        64,
        6,
        0,
        LOOPBACK,
        LOOPBACK,
    )
    frame = b"\0" * 12 + b"\x08\x00" + ip + tcp + payload
    return frame[:snap], len(frame)


def pcap(*records: tuple[float, tuple[bytes, int]], nanoseconds: bool = False) -> bytes:
    magic = 0xA1B23C4D if nanoseconds else 0xA1B2C3D4
    out = [struct.pack("<IHHiIII", magic, 2, 4, 0, 0, 192, 1)]
    for when, (data, length) in records:
        seconds = int(when)
        part = round((when - seconds) * (1e9 if nanoseconds else 1e6))
        out.append(struct.pack("<IIII", seconds, part, len(data), length) + data)
    return b"".join(out)


def request(verb: str, body_size: int = 400) -> bytes:
    body = b"{" + b"x" * (body_size - 2) + b"}"
    head = f"POST /scheduler/{verb} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


def test_each_request_is_timed_from_its_first_byte_to_the_last_byte_of_its_answer() -> None:
    data = pcap(
        (10.000, packet(CLIENT, SERVER, flags=_SYN)),
        (10.001, packet(CLIENT, SERVER, request("filter"))),
        (10.0015, packet(SERVER, CLIENT)),  # a bare ACK is no answer
        (10.003, packet(SERVER, CLIENT, ANSWER)),
        (10.010, packet(CLIENT, SERVER, request("prioritize", 60_000))),
        (10.011, packet(CLIENT, SERVER, b"x" * 5000)),  # the rest of its body
        (10.014, packet(SERVER, CLIENT, ANSWER[:20])),
        (10.016, packet(SERVER, CLIENT, ANSWER[20:])),  # the answer's last segment
        (10.020, packet(CLIENT, SERVER, flags=_FIN | _ACK)),
    )
    trips = round_trips(segments(data), SERVER)
    assert trips.by_verb.keys() == {"filter", "prioritize"}
    assert trips.by_verb["filter"] == [pytest.approx(0.002, abs=1e-6)]
    assert trips.by_verb["prioritize"] == [pytest.approx(0.006, abs=1e-6)]
    assert trips.unanswered == 0


def test_connections_are_told_apart_and_unanswered_requests_counted() -> None:
    other = CLIENT + 1
    data = pcap(
        (1.0, packet(CLIENT, SERVER, request("bind"))),
        (1.1, packet(other, SERVER, request("filter"))),
        (1.2, packet(SERVER, other, ANSWER)),
        (1.5, packet(SERVER, CLIENT, ANSWER)),
        (2.0, packet(other, SERVER, request("filter"))),
        (2.1, packet(SERVER, other, flags=_RST)),  # reset before any answer
        (3.0, packet(CLIENT, SERVER, request("filter"))),  # the capture ends first
        (3.5, packet(CLIENT + 2, 443, request("other"))),  # another port: not ours
    )
    trips = round_trips(segments(data), SERVER)
    assert trips.by_verb == {
        "bind": [pytest.approx(0.5, abs=1e-6)],
        "filter": [pytest.approx(0.1, abs=1e-6)],
    }
    assert trips.unanswered == 2


def test_nanosecond_captures_and_the_segment_fields() -> None:
    data = pcap((5.000000123, packet(CLIENT, SERVER, request("filter"), snap=80)), nanoseconds=True)
    (segment,) = segments(data)
    assert segment.time == pytest.approx(5.000000123, abs=1e-9)
    assert (segment.src, segment.dst) == ((LOOPBACK, CLIENT), (LOOPBACK, SERVER))
    assert segment.payload_length == len(request("filter"))
    assert segment.payload_start == request("filter")[: 80 - 54]  # the snap length
    assert not segment.ends


def test_what_is_not_a_pcap_file_is_refused_with_the_reason() -> None:
    with pytest.raises(PcapError, match="pcapng is not read"):
        list(segments(b"\x0a\x0d\x0d\x0a" + b"\0" * 40))
    with pytest.raises(PcapError, match="shorter than a pcap header"):
        list(segments(b"\xd4\xc3\xb2\xa1"))
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 192, 105)  # 802.11
    record = struct.pack("<IIII", 1, 0, 60, 60) + b"\0" * 60
    with pytest.raises(PcapError, match="link type 105"):
        list(segments(header + record))
