"""The extender behind an HTTP proxy: every API call it makes goes through the proxy's tunnels.

A small CONNECT proxy runs in the test (standard library, a thread per
direction of each tunnel) and counts the tunnels it opened and the bytes
it carried. The extender is restarted with a kubeconfig whose cluster has a
`proxy-url` (what `kubectl config set clusters.X.proxy-url` writes), so it
lists, watches and binds through the proxy; a gang gets bound.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.session import Extender


class TunnelProxy(socketserver.ThreadingTCPServer):
    """An HTTP proxy that only tunnels (CONNECT), as the API server's https needs."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.lock = threading.Lock()
        self.tunnels: list[str] = []
        self.carried = 0  # bytes, both directions
        self.sockets: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, target: str, *sockets: socket.socket) -> None:
        with self.lock:
            self.tunnels.append(target)
            self.sockets.extend(sockets)

    def add_bytes(self, n: int) -> None:
        with self.lock:
            self.carried += n

    def close_tunnels(self) -> None:
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Tunnel(socketserver.StreamRequestHandler):
    server: TunnelProxy

    def handle(self) -> None:
        request_line = self.rfile.readline().decode("latin-1").split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # the request's headers
        if len(request_line) != 3 or request_line[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = request_line[1].rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=10)
        upstream.settimeout(None)
        self.server.count(request_line[1], self.connection, upstream)
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        back = threading.Thread(
            target=self._pipe, args=(upstream.recv, self.connection), daemon=True
        )
        back.start()
        # read1: first what the buffered reader already holds, then the socket.
        self._pipe(self.rfile.read1, upstream)
        back.join()
        upstream.close()

    def _pipe(self, read: Callable[[int], bytes], target: socket.socket) -> None:
        try:
            while data := read(65536):
                target.sendall(data)
                self.server.add_bytes(len(data))
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxy() -> Iterator[TunnelProxy]:
    server = TunnelProxy()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.close_tunnels()
    server.server_close()


def proxied_kubeconfig(kubeconfig: str, proxy_url: str, directory: Path) -> str:
    config = yaml.safe_load(Path(kubeconfig).read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["proxy-url"] = proxy_url
    path = directory / "kubeconfig-proxied"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_the_extender_lists_watches_and_binds_through_a_proxy(
    kube: Kube,
    extender: Extender,
    namespace: str,
    proxy: TunnelProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("NO_PROXY", "no_proxy"):  # the API server is on 127.0.0.1: never bypassed
        monkeypatch.delenv(name, raising=False)
    direct = extender.kubeconfig
    extender.stop()
    extender.kubeconfig = proxied_kubeconfig(direct, proxy.url, tmp_path)
    try:
        extender.start(*extender.extra_args)
        # Ready means every reflector listed and is watching: through the proxy.
        assert proxy.tunnels, "the extender reached the API server without the proxy"
        api_server = proxy.tunnels[0]
        assert set(proxy.tunnels) == {api_server}
        listed = proxy.carried
        assert listed > 0

        kube.create_podgroup(namespace, "g", 3)
        for i in range(3):
            kube.create_pod(namespace, f"g-{i}", group="g")
        bound = wait_for(
            lambda: len(kube.bound(namespace)) == 3 and kube.bound(namespace),
            60,
            "the gang bound through the proxy",
        )
        assert set(bound) == {f"g-{i}" for i in range(3)}
        # kube-scheduler's bind calls are answered (and counted) once the wave's bindings
        # are done: the API server may show the pods bound a moment before.
        wait_for(
            lambda: extender.sample("gang_extender_requests_total", verb="bind", code="200") >= 3,
            30,
            "the three bind calls answered",
        )
        # The bindings (and the watch events of the pods) went through the tunnels too.
        assert proxy.carried > listed
    finally:
        extender.stop()
        extender.kubeconfig = direct
        extender.start(*extender.extra_args)
