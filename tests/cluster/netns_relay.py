"""A TCP relay into a network namespace of the test's own, so kube-apiserver can proxy to it.

kube-apiserver's service proxy (Kubernetes 1.37) sends a request only to an
endpoint that is a Pod whose status lists the endpoint's address, and the
test extender is a host process on 127.0.0.1. So the test makes a network
namespace with a veth pair (198.18.N.1 on the host side, 198.18.N.2 inside,
addresses of the benchmarking range that nothing else on the machine
uses), runs this module inside it as a relay from 198.18.N.2:PORT to
198.18.N.1, where a relay thread on the host side forwards to the
extender's loopback port. The Pod and EndpointSlice name 198.18.N.2: the
API server's request takes the same path as to a chart pod.

Only loopback and the namespace's own addresses are ever connected to.
Run as a script: `python3 netns_relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT
SECONDS`; it stops after SECONDS or when its stdin closes (the test is gone).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _serve_one(client: socket.socket, target: tuple[str, int]) -> None:
    with client, contextlib.suppress(OSError), socket.create_connection(target, 5) as upstream:
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join(30)


def relay(listener: socket.socket, target: tuple[str, int], stop: threading.Event) -> None:
    """Accept until `stop`, one thread per connection (a handful of requests per test)."""
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=_serve_one, args=(client, target), daemon=True).start()


def listen(host: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(16)
    return sock


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


@dataclass(frozen=True)
class Namespaced:
    """Where the API server reaches the relay: the address inside the namespace and its port."""

    address: str
    port: int


@contextlib.contextmanager
def relay_into_netns(
    slot: int, target_port: int, *, port: int = 9090, seconds: int = 600
) -> Iterator[Namespaced]:
    """A network namespace (unique per test slot) relaying `port` to 127.0.0.1:target_port.

    Everything is removed on the way out, whatever happened: the relay
    process (ours, by its pid), the host relay thread, the veth pair and
    the namespace.
    """
    netns, host_if, ns_if = f"gx-kgang-{slot}", f"gxk{slot}h", f"gxk{slot}n"
    host_ip, ns_ip = f"198.18.{10 + slot}.1", f"198.18.{10 + slot}.2"
    # A leftover of a killed run in this slot (only names of our own).
    subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
    stop = threading.Event()
    process: subprocess.Popen[bytes] | None = None
    host_side: socket.socket | None = None
    try:
        _ip("netns", "add", netns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", netns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", netns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("netns", "exec", netns, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")
        host_side = listen(host_ip, target_port)
        threading.Thread(
            target=relay, args=(host_side, ("127.0.0.1", target_port), stop), daemon=True
        ).start()
        command = ["ip", "netns", "exec", netns, sys.executable, str(Path(__file__).resolve())]
        command += [ns_ip, str(port), host_ip, str(target_port), str(seconds)]
        process = subprocess.Popen(command, stdin=subprocess.PIPE)
        _wait_listening(netns, ns_ip, port)
        yield Namespaced(ns_ip, port)
    finally:
        stop.set()
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if host_side is not None:
            host_side.close()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def _wait_listening(netns: str, address: str, port: int) -> None:
    probe = f"import socket; socket.create_connection(({address!r}, {port}), 1).close()"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-c", probe],
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the relay in {netns} does not listen on {address}:{port}")


def _stop_at_eof(stop: threading.Event) -> None:
    sys.stdin.read()
    stop.set()


def _main(argv: list[str]) -> None:
    listen_host, listen_port, target_host, target_port, seconds = argv
    stop = threading.Event()
    listener = listen(listen_host, int(listen_port))
    threading.Thread(
        target=relay, args=(listener, (target_host, int(target_port)), stop), daemon=True
    ).start()
    # Ends with the test: stdin closes when the test process goes, whatever killed it.
    threading.Thread(target=_stop_at_eof, args=(stop,), daemon=True).start()
    stop.wait(float(seconds))
    stop.set()
    listener.close()


if __name__ == "__main__":
    _main(sys.argv[1:])
