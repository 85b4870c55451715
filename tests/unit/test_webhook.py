"""The webhook's app (AdmissionReview in, patch out) and its certificate upkeep.

The certificate upkeep runs against an in-memory stand-in of the two API
objects it touches (the configuration's caBundle, the shared Secret); the
real API server is exercised by tests/cluster/test_gang_only.py.
"""

from __future__ import annotations

import base64
import datetime
import os
import ssl
from typing import Any

import httpx
import orjson
import pytest
from cryptography import x509

from app.base.metrics import Metrics
from app.core import certs
from app.kube.errors import Conflict, Forbidden, NotFound
from app.web.webhook import WEBHOOK_PATH, CertSettings, WebhookApp, WebhookCerts

NOW = datetime.datetime(2026, 11, 25, 3, 0, tzinfo=datetime.UTC)
HOSTS = ["svc.ns.svc", "127.0.0.1"]


class FakeWebhookApi:
    """The configuration's caBundle and the Secrets, as WebhookApi reads and writes them."""

    def __init__(self) -> None:
        self.ca_bundle: str | None = None
        self.configuration_exists = True
        self.secrets: dict[tuple[str, str], tuple[dict[str, str], str]] = {}
        self.version = 0
        self.conflicts = 0
        self.secret_error: Exception | None = None
        self.writes = 0

    async def register_ca(self, configuration: str, ca_pem: str) -> bool:
        if not self.configuration_exists:
            raise NotFound(f"{configuration} not found")
        changed = self.ca_bundle != ca_pem
        self.ca_bundle = ca_pem
        return changed

    async def read_secret(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        if self.secret_error is not None:
            raise self.secret_error
        return self.secrets.get((namespace, name))

    async def write_secret(
        self, namespace: str, name: str, data: dict[str, str], resource_version: str | None
    ) -> None:
        current = self.secrets.get((namespace, name))
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict("someone else wrote first")
        if (current is None) != (resource_version is None) or (
            current is not None and current[1] != resource_version
        ):
            raise Conflict("stale")
        self.version += 1
        self.writes += 1
        self.secrets[(namespace, name)] = (dict(data), str(self.version))


def certs_for(api: FakeWebhookApi, clock: list[datetime.datetime], secret: bool) -> WebhookCerts:
    return WebhookCerts(
        CertSettings(
            hosts=HOSTS,
            configuration="gang-extender",
            secret="ns/webhook-cert" if secret else None,
        ),
        api,  # type: ignore[arg-type]
        now=lambda: clock[0],
    )


def file_text(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def exists(path: str) -> bool:
    return os.path.exists(path)


def mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777


def served_ca(handle: WebhookCerts) -> str:
    """The CA that signed the certificate the files hold now (checked through a TLS context)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    handle.reload(context)
    with open(handle.cert_file) as cert:
        text = cert.read()
    return x509.load_pem_x509_certificate(text.encode()).issuer.rfc4514_string()


async def test_replicas_share_one_ca_through_the_secret_and_register_it() -> None:
    api, clock = FakeWebhookApi(), [NOW]
    first, second = certs_for(api, clock, True), certs_for(api, clock, True)
    assert await first.refresh() is True
    assert await second.refresh() is True
    assert api.writes == 1, "the second replica must read the first one's bundle"
    data, _version = api.secrets[("ns", "webhook-cert")]
    assert api.ca_bundle == data["ca.crt"]
    assert served_ca(first) == served_ca(second)
    # Nothing changes on the next turn.
    assert await first.refresh() is False and await second.refresh() is False
    assert api.writes == 1


async def test_a_conflicting_writer_is_read_not_overwritten() -> None:
    api, clock = FakeWebhookApi(), [NOW]
    api.conflicts = 1
    handle = certs_for(api, clock, True)
    assert await handle.refresh() is True
    assert api.writes == 1


async def test_renewal_keeps_the_ca_and_reloads_the_served_certificate() -> None:
    api, clock = FakeWebhookApi(), [NOW]
    handle = certs_for(api, clock, True)
    await handle.refresh()
    ca_before = api.ca_bundle
    before = file_text(handle.cert_file)
    clock[0] = NOW + datetime.timedelta(days=certs.SERVING_DAYS * 2 / 3 + 1)
    assert await handle.refresh() is True
    after = file_text(handle.cert_file)
    assert after != before
    assert api.ca_bundle == ca_before
    assert api.writes == 2  # the renewed bundle went into the Secret for the other replicas


async def test_without_a_secret_the_bundle_is_our_own_and_still_registered() -> None:
    api, clock = FakeWebhookApi(), [NOW]
    handle = certs_for(api, clock, False)
    assert await handle.refresh() is True
    assert api.secrets == {}
    assert api.ca_bundle is not None and "BEGIN CERTIFICATE" in api.ca_bundle


async def test_a_blanked_ca_bundle_is_written_again_on_the_next_turn() -> None:
    api, clock = FakeWebhookApi(), [NOW]
    handle = certs_for(api, clock, False)
    await handle.refresh()
    registered = api.ca_bundle
    api.ca_bundle = None  # e.g. `helm upgrade` re-applied the configuration without it
    await handle.refresh()
    assert api.ca_bundle == registered


async def test_an_unreadable_secret_serves_a_stand_in_that_is_not_registered() -> None:
    api, clock = FakeWebhookApi(), [NOW]
    api.secret_error = Forbidden("secrets is forbidden")
    handle = certs_for(api, clock, True)
    assert await handle.refresh() is True  # something to serve: the verbs do not wait for this
    assert api.ca_bundle is None
    api.secret_error = None
    assert await handle.refresh() is True
    assert api.ca_bundle == api.secrets[("ns", "webhook-cert")][0]["ca.crt"]


async def test_a_missing_configuration_is_not_fatal() -> None:
    api, clock = FakeWebhookApi(), [NOW]
    api.configuration_exists = False
    handle = certs_for(api, clock, False)
    assert await handle.refresh() is True
    api.configuration_exists = True
    await handle.refresh()
    assert api.ca_bundle is not None


async def test_operator_files_are_reloaded_when_they_change(tmp_path: Any) -> None:
    bundle = certs.new_bundle(HOSTS, NOW)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text(bundle.cert)
    key.write_text(bundle.key)
    handle = WebhookCerts(CertSettings(cert_file=str(cert), key_file=str(key), hosts=HOSTS), None)
    assert await handle.refresh() is False
    renewed = certs.renewed(bundle, [*HOSTS, "localhost"], NOW)
    cert.write_text(renewed.cert)
    key.write_text(renewed.key)
    os.utime(cert, (1, 1))
    assert await handle.refresh() is True


@pytest.fixture
def client() -> httpx.AsyncClient:
    app = WebhookApp(Metrics(), scheduler_names=())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://wh")


async def test_the_app_answers_a_review_with_a_patch(client: httpx.AsyncClient) -> None:
    pod = {
        "metadata": {"name": "m", "labels": {"scheduling.x-k8s.io/pod-group": "g"}},
        "spec": {"containers": [{"name": "c"}]},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "CREATE", "namespace": "ns", "object": pod},
    }
    async with client:
        response = await client.post(WEBHOOK_PATH, content=orjson.dumps(review))
        bad = await client.post(WEBHOOK_PATH, content=b"[1")
        wrong = await client.get(WEBHOOK_PATH)
        health = await client.get("/healthz")
    assert response.status_code == 200
    answer = response.json()["response"]
    assert answer["uid"] == "u" and answer["allowed"] is True
    ops = orjson.loads(base64.b64decode(answer["patch"]))
    assert ops[0]["path"] == "/spec/containers/0/resources"
    assert bad.status_code == 400 and "bad AdmissionReview" in bad.text
    assert wrong.status_code == 405
    assert health.status_code == 200


async def test_the_app_leaves_a_plain_pod_that_may_preempt_to_the_api_servers_policy() -> None:
    metrics = Metrics()
    app = WebhookApp(metrics, scheduler_names=())
    vip = {"metadata": {"name": "vip"}, "spec": {"priority": 1000, "containers": [{"name": "c"}]}}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "CREATE", "namespace": "ns", "object": vip},
    }
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://wh") as wh:
        response = await wh.post(WEBHOOK_PATH, content=orjson.dumps(review))
    assert response.status_code == 200
    assert "patch" not in response.json()["response"]
    assert metrics.webhook_reviews.labels(result="skipped")._value.get() == 1


async def test_close_removes_the_self_made_key() -> None:
    handle = certs_for(FakeWebhookApi(), [NOW], False)
    await handle.refresh()
    assert exists(handle.key_file)
    assert oct(mode(os.path.dirname(handle.key_file))) == "0o700"
    handle.close()
    assert not exists(os.path.dirname(handle.key_file))
