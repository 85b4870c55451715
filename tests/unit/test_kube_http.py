"""app/kube/http.py against a real HTTP server started in the test (plain asyncio, TLS, a proxy).

The server reads each request whole and answers with the bytes the test's
handler returns (None: close the connection without a byte), so every
framing, error and connection case is on a real socket.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import orjson
import pytest
from kubernetes import client as k8s

from app import __version__
from app.kube.errors import ApiError, Conflict, Invalid, NotFound, Transient
from app.kube.http import AsyncApiClient, uses_proxy
from app.kube.pods import PodApi
from tests.tlscerts import make_ca, make_leaf
from tests.unit.fakes import eventually


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int


class Cut(bytes):
    """An answer after which the server closes the connection."""


Handler = Callable[[Request], Awaitable[bytes | None]]


@dataclass
class Server:
    """An HTTP/1.1 server on 127.0.0.1 that answers with what `handler` returns."""

    handler: Handler
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    hung_up: int = 0  # connections the client closed or lost
    peer_names: list[str] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        peer = writer.get_extra_info("peercert")
        if peer:
            self.peer_names.append(dict(x[0] for x in peer["subject"])["commonName"])
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
                method, path, _version = request_line.split(" ")
                headers = {}
                for line in lines:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, path, headers, body, number)
                self.requests.append(request)
                answer = await self.handler(request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if isinstance(answer, Cut):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            self.hung_up += 1
        finally:
            writer.close()


def answer(status: int, body: bytes = b"{}", reason: str = "OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def chunked(*chunks: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body


def status_body(code: int, message: str) -> bytes:
    return orjson.dumps({"kind": "Status", "code": code, "message": message})


async def echo(request: Request) -> bytes:
    return answer(200, orjson.dumps({"path": request.path, "n": len(request.body)}))


class Start(Protocol):
    def __call__(
        self, handler: Handler = ..., tls: ssl.SSLContext | None = None
    ) -> Awaitable[Server]: ...


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler = echo, tls: ssl.SSLContext | None = None) -> Server:
        server = Server(handler)
        listener = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=tls)
        server.port = listener.sockets[0].getsockname()[1]
        servers.append(listener)
        return server

    yield start
    for listener in servers:
        listener.close()


def client_for(host: str, **settings: object) -> k8s.Configuration:
    configuration = k8s.Configuration(host=host)
    for name, value in settings.items():
        setattr(configuration, name, value)
    return configuration


async def test_sequential_requests_share_one_keep_alive_connection(start: Start) -> None:
    server = await start()
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    for n in range(5):
        data = await api.request("POST", f"/x/{n}", {"n": n})
        assert orjson.loads(data) == {"path": f"/x/{n}", "n": len(b'{"n":0}')}
    assert server.connections == 1
    first = server.requests[0]
    assert first.headers["content-type"] == "application/json"
    assert first.headers["host"] == f"127.0.0.1:{server.port}"
    assert orjson.loads(first.body) == {"n": 0}
    assert server.hung_up == 0  # kept alive
    await api.close()
    await eventually(lambda: server.hung_up == 1)  # closed with the client
    with pytest.raises(Transient, match="the client is closed"):
        await api.request("GET", "/")


async def test_concurrent_requests_open_connections_and_keep_them_for_the_next(
    start: Start,
) -> None:
    async def slow(request: Request) -> bytes:
        await asyncio.sleep(0.05)
        return answer(200)

    server = await start(slow)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"), max_in_flight=6)
    await asyncio.gather(*(api.request("GET", "/") for _ in range(6)))
    assert server.connections == 6
    await asyncio.gather(*(api.request("GET", "/") for _ in range(3)))
    assert server.connections == 6  # three of the idle ones were reused
    assert server.hung_up == 0
    await api.close()


async def test_requests_beyond_max_in_flight_wait_for_a_slot(start: Start) -> None:
    """A bind wave of many gangs reaches the API server a bounded number at a time."""
    in_flight = 0
    most = 0

    async def slow(request: Request) -> bytes:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return answer(200)

    server = await start(slow)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"), max_in_flight=2)
    await asyncio.gather(*(api.request("GET", "/") for _ in range(7)))
    assert most == 2
    assert len(server.requests) == 7
    assert server.connections == 2
    await api.close()


async def test_chunked_and_content_length_answers_on_one_connection(start: Start) -> None:
    answers = [chunked(b'{"a":', b"1}"), answer(200, b'{"b":2}'), chunked(), answer(204, b"")]

    async def scripted(request: Request) -> bytes:
        return answers.pop(0)

    server = await start(scripted)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    assert await api.request("GET", "/a") == b'{"a":1}'
    assert await api.request("GET", "/b") == b'{"b":2}'
    assert await api.request("GET", "/c") == b""
    assert await api.request("DELETE", "/d") == b""
    assert server.connections == 1
    await api.close()


async def test_a_body_that_ends_with_the_connection(start: Start) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"eof":true}')
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{port}"))
    assert await api.request("GET", "/") == b'{"eof":true}'
    assert await api.request("GET", "/") == b'{"eof":true}'  # on a new connection
    await api.close()
    listener.close()


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, NotFound), (409, Conflict), (422, Invalid), (500, Transient), (429, Transient)],
)
async def test_error_statuses_raise_their_api_error(
    start: Start, status: int, error: type[ApiError]
) -> None:
    async def failing(request: Request) -> bytes:
        return answer(status, status_body(status, f"no luck {status}"), reason="Nope")

    server = await start(failing)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    for _ in range(2):
        with pytest.raises(error) as caught:
            await api.request("GET", "/api/v1/namespaces/a/pods/b")
        assert type(caught.value) is error
        assert caught.value.message == f"API server answered {status}: no luck {status}"
    assert server.connections == 1  # an error answer read whole keeps the connection
    await api.close()


async def test_error_without_status_body_names_the_reason(start: Start) -> None:
    async def failing(request: Request) -> bytes:
        return answer(503, b"", reason="Service Unavailable")

    server = await start(failing)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    with pytest.raises(Transient, match="answered 503: Service Unavailable"):
        await api.request("GET", "/")
    await api.close()


async def test_a_connection_closed_while_idle_is_retried_once_on_a_new_one(start: Start) -> None:
    async def closes_second_request_on_first_connection(request: Request) -> bytes | None:
        if request.connection == 1 and len(server.requests) == 2:
            return None  # the server's idle timeout raced our request: no byte back
        return answer(200, request.body)

    server = await start(closes_second_request_on_first_connection)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    assert await api.request("POST", "/", {"n": 1}) == b'{"n":1}'
    assert await api.request("POST", "/", {"n": 2}) == b'{"n":2}'
    assert [(r.connection, r.body) for r in server.requests] == [
        (1, b'{"n":1}'),
        (1, b'{"n":2}'),
        (2, b'{"n":2}'),
    ]
    await api.close()


async def test_a_connection_the_server_closed_while_idle_is_not_reused(start: Start) -> None:
    async def closes_after_answer(request: Request) -> bytes:
        return answer(200, extra="Connection: close\r\n")

    server = await start(closes_after_answer)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    await api.request("GET", "/")
    await api.request("GET", "/")
    assert server.connections == 2
    assert len(server.requests) == 2
    await api.close()


async def test_a_fresh_connection_closed_without_answer_is_transient_and_not_retried(
    start: Start,
) -> None:
    async def hang_up(request: Request) -> None:
        return None

    server = await start(hang_up)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    with pytest.raises(Transient, match=rf"API server http://127.0.0.1:{server.port} unreachable"):
        await api.request("POST", "/", {})
    assert len(server.requests) == 1
    await api.close()


async def test_an_answer_cut_short_is_transient_and_not_retried(start: Start) -> None:
    async def partial(request: Request) -> bytes | None:
        if len(server.requests) == 1:
            return answer(200)
        # Part of the answer on the reused connection, then the server closes it.
        return Cut(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{")

    server = await start(partial)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    await api.request("GET", "/")
    with pytest.raises(Transient, match="closed after part of the answer"):
        await api.request("POST", "/", {})
    assert len(server.requests) == 2  # no retry: the server may have acted on it
    await api.close()


async def test_idle_connections_past_their_age_are_not_reused(start: Start) -> None:
    server = await start()
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"), idle_seconds=0.05)
    await api.request("GET", "/")
    await asyncio.sleep(0.1)
    await api.request("GET", "/")
    assert server.connections == 2
    await api.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_connection_refused_is_transient_naming_the_api_server() -> None:
    port = free_port()
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{port}"))
    with pytest.raises(Transient, match=rf"API server http://127.0.0.1:{port} unreachable"):
        await api.request("GET", "/")


async def test_timeout_is_transient_and_the_connection_is_closed(start: Start) -> None:
    async def slow_first(request: Request) -> bytes:
        if len(server.requests) == 1:
            await asyncio.sleep(5)
        return answer(200, b'{"late":false}')

    server = await start(slow_first)
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    with pytest.raises(Transient, match=r"did not answer GET in 0.2s"):
        await api.request("GET", "/", timeout_seconds=0.2)
    # The next request does not read the late answer: it has a connection of its own.
    assert await api.request("GET", "/") == b'{"late":false}'
    assert server.connections == 2
    await api.close()


async def test_auth_headers_are_computed_for_every_request(start: Start) -> None:
    server = await start()
    tokens = iter(["one", "two"])

    def rotate(configuration: k8s.Configuration) -> None:
        configuration.api_key["authorization"] = next(tokens)

    configuration = client_for(
        f"http://127.0.0.1:{server.port}",
        api_key={"authorization": "zero"},
        api_key_prefix={"authorization": "Bearer"},
        refresh_api_key_hook=rotate,
    )
    api = AsyncApiClient(configuration)
    await api.request("GET", "/")
    await api.request("GET", "/")
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer one", "Bearer two"]
    assert server.requests[0].headers["user-agent"] == f"gang-extender/{__version__}"
    # Uncompressed answers: the API server spends no CPU compressing, we none inflating.
    assert "accept-encoding" not in server.requests[0].headers
    await api.close()


async def test_a_path_prefix_in_the_host_is_kept(start: Start) -> None:
    server = await start()
    api = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}/k8s/clusters/c-1/"))
    await api.request("GET", "/api/v1/pods")
    assert server.requests[0].path == "/k8s/clusters/c-1/api/v1/pods"
    await api.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "ca")
    make_leaf(directory, "ca", "server")
    make_leaf(directory, "ca", "client")
    make_ca(directory, "rogue-ca")
    return directory


def server_tls(pki: Path, *, client_ca: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    if client_ca:
        context.load_verify_locations(pki / "ca.crt")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def test_tls_with_a_self_signed_ca(start: Start, pki: Path) -> None:
    server = await start(tls=server_tls(pki, client_ca=False))
    host = f"https://127.0.0.1:{server.port}"
    api = AsyncApiClient(client_for(host, ssl_ca_cert=str(pki / "ca.crt")))
    assert orjson.loads(await api.request("GET", "/a"))["path"] == "/a"
    await api.request("GET", "/b")
    assert server.connections == 1
    await api.close()

    # Another CA: the handshake fails, which is no answer.
    rogue = AsyncApiClient(client_for(host, ssl_ca_cert=str(pki / "rogue-ca.crt")))
    with pytest.raises(Transient, match="CERTIFICATE_VERIFY_FAILED"):
        await rogue.request("GET", "/")
    # verify_ssl=False (insecure-skip-tls-verify) accepts it.
    insecure = AsyncApiClient(client_for(host, verify_ssl=False))
    await insecure.request("GET", "/")
    await insecure.close()


async def test_tls_server_name_is_the_name_checked(start: Start, pki: Path) -> None:
    server = await start(tls=server_tls(pki, client_ca=False))
    host = f"https://127.0.0.1:{server.port}"
    ca = str(pki / "ca.crt")
    good = AsyncApiClient(client_for(host, ssl_ca_cert=ca, tls_server_name="localhost"))
    await good.request("GET", "/")
    await good.close()
    wrong = AsyncApiClient(client_for(host, ssl_ca_cert=ca, tls_server_name="elsewhere.example"))
    with pytest.raises(Transient, match=r"elsewhere\.example"):
        await wrong.request("GET", "/")
    unchecked = AsyncApiClient(
        client_for(host, ssl_ca_cert=ca, tls_server_name="elsewhere.example", assert_hostname=False)
    )
    await unchecked.request("GET", "/")
    await unchecked.close()


async def test_client_certificate_auth(start: Start, pki: Path) -> None:
    server = await start(tls=server_tls(pki, client_ca=True))
    host = f"https://127.0.0.1:{server.port}"
    ca = str(pki / "ca.crt")
    api = AsyncApiClient(
        client_for(
            host,
            ssl_ca_cert=ca,
            cert_file=str(pki / "client.crt"),
            key_file=str(pki / "client.key"),
        )
    )
    await api.request("GET", "/")
    assert server.peer_names == ["client"]
    await api.close()

    anonymous = AsyncApiClient(client_for(host, ssl_ca_cert=ca))
    with pytest.raises(Transient):
        await anonymous.request("GET", "/")


async def test_pod_api_binds_reads_and_treats_absent_pods_as_nothing_to_do(start: Start) -> None:
    async def api_server(request: Request) -> bytes:
        if request.path.endswith("/gone") or request.path.endswith("/gone/binding"):
            return answer(404, status_body(404, 'pods "gone" not found'))
        if request.method == "GET":
            return answer(200, b'{"metadata":{"name":"p"}}')
        return answer(201 if request.method == "POST" else 200)

    server = await start(api_server)
    requests = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    pods = PodApi(requests)
    await pods.bind("ns", "p", "uid-1", "node-1")
    binding = server.requests[-1]
    assert (binding.method, binding.path) == ("POST", "/api/v1/namespaces/ns/pods/p/binding")
    assert orjson.loads(binding.body)["metadata"] == {
        "name": "p",
        "namespace": "ns",
        "uid": "uid-1",
    }
    assert await pods.read_pod("ns", "p") == {"metadata": {"name": "p"}}
    assert await pods.read_pod("ns", "gone") is None
    await pods.touch_pod("ns", "gone", "uid-2", "now")
    assert server.requests[-1].headers["content-type"] == "application/merge-patch+json"
    await pods.evict_pod("ns", "gone", "uid-3")
    assert orjson.loads(server.requests[-1].body)["preconditions"] == {"uid": "uid-3"}
    with pytest.raises(NotFound):
        await pods.bind("ns", "gone", "", "node-1")
    assert server.connections == 1
    await requests.close()


@pytest.mark.parametrize(
    ("bound_pod", "made"),
    [
        ({"metadata": {"uid": "uid-1"}, "spec": {"nodeName": "node-1"}}, True),
        ({"metadata": {"uid": "uid-1"}, "spec": {}}, False),
        ({"metadata": {"uid": "uid-2"}, "spec": {"nodeName": "node-1"}}, False),
    ],
    ids=["made-there", "not-made", "a-new-pod-of-the-name"],
)
async def test_a_binding_never_answered_is_read_back_before_it_is_called_failed(
    start: Start, bound_pod: dict[str, object], made: bool
) -> None:
    """Every binding attempt unanswered (the API server restarting): the pod says if it was made."""

    async def api_server(request: Request) -> bytes | None:
        if request.method == "POST":
            return None  # hang up: the client cannot know whether the binding was made
        return answer(200, orjson.dumps(bound_pod))

    server = await start(api_server)
    requests = AsyncApiClient(client_for(f"http://127.0.0.1:{server.port}"))
    pods = PodApi(requests)
    if made:
        await pods.bind("ns", "p", "uid-1", "node-1")
    else:
        with pytest.raises(Transient):
            await pods.bind("ns", "p", "uid-1", "node-1")
    assert [r.method for r in server.requests] == ["POST"] * 3 + ["GET"]
    await requests.close()


async def test_no_usable_address_is_transient_at_the_first_request() -> None:
    api = AsyncApiClient(k8s.Configuration(host=""))  # built without a cluster
    with pytest.raises(Transient, match=r"API server '': the address is not http\(s\)://HOST"):
        await api.request("GET", "/")


class ConnectProxy:
    """An HTTP CONNECT proxy: counts the tunnels it opened and pipes their bytes."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _version = head.split(b"\r\n", 1)[0].decode().split(" ")
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        host, _, port = target.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self.tunnels.append(target)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_requests_and_watches_go_through_the_configured_proxy(
    start: Start, pki: Path
) -> None:
    async def api_server(request: Request) -> bytes:
        if "watch=true" in request.path:
            return Cut(chunked(b'{"type":"ADDED","n":1}\n'))
        return answer(200, b'{"ok":true}')

    server = await start(api_server, tls=server_tls(pki, client_ca=False))
    proxy = ConnectProxy()
    listener = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    proxy.port = listener.sockets[0].getsockname()[1]
    configuration = client_for(
        f"https://127.0.0.1:{server.port}",
        ssl_ca_cert=str(pki / "ca.crt"),
        proxy=f"http://127.0.0.1:{proxy.port}",
        no_proxy="",
    )
    assert uses_proxy(configuration)
    api = AsyncApiClient(configuration)
    assert await api.request("GET", "/a") == b'{"ok":true}'
    assert await api.request("POST", "/b", {"n": 1}) == b'{"ok":true}'
    lines: list[bytes] = []
    await api.watch("/c?watch=true", lines.append, timeout_seconds=5)
    assert lines == [b'{"type":"ADDED","n":1}']
    # Every connection the API server saw came through a tunnel (kept alive between calls).
    assert set(proxy.tunnels) == {f"127.0.0.1:{server.port}"}
    assert len(proxy.tunnels) == server.connections
    await api.close()
    listener.close()


async def test_no_proxy_bypasses_the_proxy_and_socks_is_refused(start: Start) -> None:
    server = await start()
    host = f"http://127.0.0.1:{server.port}"
    bypassed = client_for(host, proxy="http://127.0.0.1:1", no_proxy="127.0.0.0/8")
    assert not uses_proxy(bypassed)
    api = AsyncApiClient(bypassed)
    await api.request("GET", "/")
    await api.close()
    socks = AsyncApiClient(client_for(host, proxy="socks5://127.0.0.1:1080", no_proxy=""))
    with pytest.raises(Transient, match=r"only http\(s\) proxies are supported"):
        await socks.request("GET", "/")
