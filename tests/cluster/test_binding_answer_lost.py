"""A binding the API server made but whose answer was lost is a binding, not a failure.

Found by the soak (seed 4, issue 49): the API server restarted while a gang
was being bound; one member's binding was made but its answer never came
back, the retry was refused with 409 ("already assigned to node ..."), the
gate counted the member as failed and rolled the gang back, deleting the
two members it had bound and leaving the third bound alone: a gang below
its minimum for the rest of the run.

Here the extender's own pod client talks to the real API server through a
relay that passes the first binding on and drops its answer, so the
binding exists and the client never hears of it.
"""

from __future__ import annotations

import asyncio
import copy
import re
import ssl
from collections.abc import AsyncIterator

import kubernetes.client as k8s
import pytest

from app.kube.errors import Conflict
from app.kube.http import AsyncApiClient
from app.kube.pods import PodApi
from tests.cluster.kube import Kube


class AnswerDroppingRelay:
    """http://127.0.0.1:<port> -> the API server's https; the first binding's answer is lost.

    The relay speaks TLS to the API server with the test's own credentials,
    so it sees each request: the first POST to a pods/binding path is
    forwarded whole, the API server's answer is awaited (the binding was
    handled) and the client's connection closed without it. Every other
    connection is piped as is.
    """

    def __init__(self, configuration: k8s.Configuration) -> None:
        host, _, port = configuration.host.removeprefix("https://").rpartition(":")
        self._target = (host, int(port))
        self._tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            self._tls.load_cert_chain(configuration.cert_file, configuration.key_file)
        self.dropped = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target, ssl=self._tls)
        try:
            if not self.dropped.is_set():
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                body = await reader.readexactly(int(length.group(1)) if length else 0)
                up_writer.write(head + body)
                if head.startswith(b"POST ") and b"/binding " in head.split(b"\r\n")[0]:
                    await up_reader.read(1)  # the API server has answered: drop it
                    self.dropped.set()
                    return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in (writer, up_writer):
                end.transport.abort()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while data := await source.read(65536):
        sink.write(data)
        await sink.drain()
    sink.transport.abort()


@pytest.fixture
async def relayed_pods(kube: Kube) -> AsyncIterator[tuple[PodApi, AnswerDroppingRelay]]:
    configuration = copy.copy(kube.client.configuration)
    relay = AnswerDroppingRelay(configuration)
    configuration.host = f"http://127.0.0.1:{await relay.start()}"
    requests = AsyncApiClient(configuration)
    yield PodApi(requests), relay
    await requests.close()
    await relay.stop()


def pending_pod(kube: Kube, namespace: str, name: str) -> str:
    """A pod no scheduler will place (its schedulerName is nobody's): only the test binds it."""
    created = kube.core.create_namespaced_pod(
        namespace, kube.pod_body(name, scheduler="no-scheduler-at-all")
    )
    uid: str = created.metadata.uid
    return uid


async def test_a_binding_whose_answer_was_lost_is_found_made_and_succeeds(
    kube: Kube, namespace: str, relayed_pods: tuple[PodApi, AnswerDroppingRelay]
) -> None:
    pods, relay = relayed_pods
    node = kube.node_names()[0]
    uid = pending_pod(kube, namespace, "p0")

    await pods.bind(namespace, "p0", uid, node)

    assert relay.dropped.is_set(), "the relay saw no binding"
    assert kube.core.read_namespaced_pod("p0", namespace).spec.node_name == node


async def test_a_pod_bound_elsewhere_is_still_a_conflict(
    kube: Kube, namespace: str, relayed_pods: tuple[PodApi, AnswerDroppingRelay]
) -> None:
    pods, relay = relayed_pods
    first, second = kube.node_names()[:2]
    uid = pending_pod(kube, namespace, "p0")
    await pods.bind(namespace, "p0", uid, first)  # the relay drops this answer

    with pytest.raises(Conflict, match="already assigned"):
        await pods.bind(namespace, "p0", uid, second)
    assert relay.dropped.is_set()
    assert kube.core.read_namespaced_pod("p0", namespace).spec.node_name == first
