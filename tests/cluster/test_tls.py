"""The chart's TLS option end to end: kube-scheduler calls the extender over mutual TLS.

Certificates are made with the openssl CLI (tests/tlscerts.py) the way the chart expects the
Secret: one certificate (server auth + client auth, SANs 127.0.0.1 and
localhost) that the extender serves and kube-scheduler presents, and its CA.
The chart's pod runs locally (tests/cluster/chart_pod.py) with those files
in place of the Secret volume.
"""

from __future__ import annotations

import socket
import ssl
import urllib.request
from pathlib import Path

from hack.clusterkit import wait_for
from tests.cluster.chart_pod import run_chart_pod, schedule_gang
from tests.cluster.kube import Kube
from tests.packaging.helm import find, render
from tests.tlscerts import make_ca, make_leaf


def tls_secret(directory: Path) -> Path:
    """The Secret's three keys, as the kubelet would project them."""
    make_ca(directory, "ca")
    make_leaf(directory, "ca", "tls")
    secret = directory / "secret"
    secret.mkdir()
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (secret / key).write_bytes((directory / key).read_bytes())
    return secret


def call(port: int, ca: Path, cert: tuple[Path, Path] | None) -> str:
    """GET /healthz over TLS: the HTTP status line, or how the connection failed."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            reply = tls.recv(1024)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as err:
        return f"refused: {err}"
    return reply.split(b"\r\n", 1)[0].decode() if reply else "refused: connection closed"


def test_scheduler_reaches_the_extender_over_mutual_tls_and_nobody_else_does(
    kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    secret = tls_secret(tmp_path / "pki")
    make_ca(tmp_path / "rogue", "rogue-ca")
    make_leaf(tmp_path / "rogue", "rogue-ca", "intruder")

    # every-verb: the scheduler-extender link is the same in both modes, and the
    # gang needs no webhook (test_chart.py runs the gang-only chart pod with one).
    docs = render("--set", "tls.enabled=true,mode=every-verb", release="tls", namespace=namespace)
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (secret_name,) = [v["secret"]["secretName"] for v in volumes if "secret" in v]
    with run_chart_pod(
        docs, kubeconfig=kubeconfig, workdir=tmp_path, secret_dirs={secret_name: secret}
    ) as pod:
        assert pod.extender_url.startswith("https://")
        port = int(pod.extender_url.split(":")[2].split("/")[0])

        schedule_gang(kube, namespace, pod)
        # Every bind went over the mTLS link and succeeded.
        # (answered, and counted, a moment after the API server shows the pods bound)
        wait_for(
            lambda: pod.metric("gang_extender_requests_total", verb="bind", code="200") >= 3,
            30,
            "the three bind calls answered",
        )

        pod_cert = (secret / "tls.crt", secret / "tls.key")
        assert call(port, secret / "ca.crt", pod_cert) == "HTTP/1.1 200 OK"
        no_cert = call(port, secret / "ca.crt", None)
        assert no_cert.startswith("refused"), no_cert
        rogue = tmp_path / "rogue"
        wrong_ca = call(port, secret / "ca.crt", (rogue / "intruder.crt", rogue / "intruder.key"))
        assert wrong_ca.startswith("refused"), wrong_ca

        # Plain HTTP to the verbs' port gets no HTTP answer either.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            try:
                answer = raw.recv(1024)
            except ConnectionResetError:
                answer = b""
            assert not answer.startswith(b"HTTP/"), answer

        # Probes and Prometheus use the operations port: plain HTTP, no certificate.
        with urllib.request.urlopen(f"{pod.ops_url}/readyz", timeout=5) as response:
            assert response.status == 200
        assert pod.metric("gang_extender_cache_objects", kind="nodes") == len(kube.node_names())
