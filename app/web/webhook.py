"""The mutating admission webhook: marks gang members with the managed resource.

kube-apiserver POSTs an AdmissionReview for every pod CREATE in the
namespaces the MutatingWebhookConfiguration selects; the answer (pure, in
app/core/marking.py) adds `gang-extender.dev/member: "0"` to the containers of a
pod that names a group, so that kube-scheduler calls the gang verbs for it
(docs/deployment-modes.md); plain pods that may preempt are marked by a
MutatingAdmissionPolicy in the API server, not here. It is served over
HTTPS on its own port (--webhook-port), with either the operator's
certificate files (cert-manager, or a Secret: reloaded when they change) or
certificates this process makes, renews and registers in the configuration's
caBundle itself (app/core/certs.py).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import shutil
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from app.base.metrics import Metrics
from app.core import certs
from app.core.clock import wall
from app.core.marking import review_response
from app.kube.errors import ApiError, Conflict, NotFound
from app.kube.webhook import WebhookApi

log = logging.getLogger(__name__)

WEBHOOK_PATH = "/mutate-pods"
# AdmissionReview bodies carry one pod; anything far larger is not one.
_MAX_BODY = 3 * 1024 * 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class WebhookApp:
    """The ASGI app kube-apiserver calls: POST /mutate-pods, GET /healthz."""

    def __init__(
        self,
        metrics: Metrics,
        scheduler_names: Collection[str] = (),
        member_labels: Collection[str] = (),
        hold: Callable[[], bool] = lambda: False,
    ) -> None:
        self._metrics = metrics
        self._scheduler_names = frozenset(scheduler_names)
        # Opt-in sources' labels that also make a pod a member (LeaderWorkerSet's).
        self._member_labels = tuple(member_labels)
        # --hold-waiting-gangs: whether a member gets the line's scheduling gate now.
        self._hold = hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope.get("path"), scope.get("method")
        if path == "/healthz" and method == "GET":
            await _answer(send, 200, b"ok")
            return
        if path != WEBHOOK_PATH:
            await _answer(send, 404, b'{"error": "not found"}')
            return
        if method != "POST":
            await _answer(send, 405, b'{"error": "POST an AdmissionReview"}')
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > _MAX_BODY:
                self._metrics.webhook_reviews.labels(result="invalid").inc()
                await _answer(send, 413, b'{"error": "body too large"}')
                return
            if not message.get("more_body"):
                break
        try:
            review = orjson.loads(bytes(body))
            if not isinstance(review, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            self._metrics.webhook_reviews.labels(result="invalid").inc()
            await _answer(send, 400, orjson.dumps({"error": f"bad AdmissionReview: {err}"}))
            return
        answer, result = review_response(
            review, self._scheduler_names, self._member_labels, self._hold()
        )
        self._metrics.webhook_reviews.labels(result=result).inc()
        if result in ("marked", "held"):
            request = review.get("request") or {}
            meta = (request.get("object") or {}).get("metadata") or {}
            name = meta.get("name") or meta.get("generateName")
            log.debug(
                "pod %s",
                result,
                extra={
                    "pod": f"{request.get('namespace')}/{name}",
                    "verb": "webhook",
                },
            )
        await _answer(send, 200, orjson.dumps(answer))


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True, slots=True)
class CertSettings:
    """Where the serving certificate comes from, and where its CA is published."""

    # The operator's files (--webhook-cert-file/--webhook-key-file); None: we make our own.
    cert_file: str | None = None
    key_file: str | None = None
    # The names our own certificate is for (--webhook-hosts).
    hosts: Collection[str] = ()
    # The MutatingWebhookConfiguration whose caBundle gets our CA (--webhook-configuration).
    configuration: str | None = None
    # NAMESPACE/NAME of the Secret every replica shares our bundle through (--webhook-cert-secret).
    secret: str | None = None


class WebhookCerts:
    """The serving certificate: the operator's files, or our own, kept current.

    `refresh()` brings the files uvicorn loads up to date and returns
    whether they changed; `reload(context)` then loads
    them into the running server's SSLContext (new connections use them).
    Self-managed: the bundle lives in memory, or in a Secret
    (--webhook-cert-secret) so that every replica serves the same CA; its CA
    is written to the configuration's caBundle (--webhook-configuration).
    """

    def __init__(
        self,
        settings: CertSettings,
        api: WebhookApi | None,
        *,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.fromtimestamp(
            wall(), datetime.UTC
        ),
    ) -> None:
        """api: reads and writes the Secret and the configuration (None: neither is used)."""
        self._own = settings.cert_file is None
        self._hosts = list(settings.hosts) or ["127.0.0.1"]
        self._api = api
        self._configuration = settings.configuration
        self._secret = settings.secret.partition("/")[::2] if settings.secret else None
        self._now = now
        self._bundle: certs.CertBundle | None = None
        self._mtimes: tuple[float, float] | None = None
        self._warned: set[str] = set()
        self._directory: Path | None = None
        if settings.cert_file is not None and settings.key_file is not None:
            self.cert_file, self.key_file = settings.cert_file, settings.key_file
        else:
            # Private (0700), and removed by close(): it holds a private key.
            self._directory = Path(tempfile.mkdtemp(prefix="gang-extender-webhook-"))
            self.cert_file = str(self._directory / "tls.crt")
            self.key_file = str(self._directory / "tls.key")

    def close(self) -> None:
        """Remove the self-made certificate's files (the process is stopping)."""
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    async def refresh(self) -> bool:
        """Make the files current; True when they changed since the last call."""
        if not self._own:
            mtimes = self._file_mtimes()
            changed = self._mtimes is not None and mtimes != self._mtimes
            self._mtimes = mtimes
            return changed
        shared = True
        if self._secret:
            try:
                bundle = await self._shared_bundle()
            except ApiError as err:
                shared = False
                # Serve something meanwhile (the verbs must not wait for the webhook):
                # our own bundle, replaced by the shared one on a later turn.
                log.warning("webhook: certificate Secret unavailable (%s); using our own", err)
                bundle = self._local_bundle()
        else:
            bundle = self._local_bundle()
        changed = bundle != self._bundle
        if changed:
            self._write(bundle)
            self._bundle = bundle
        # A stand-in bundle is not registered: the replicas that read the Secret
        # would have their CA replaced with ours every turn.
        if self._configuration and self._api is not None and shared:
            await self._register(bundle.ca_cert)
        return changed

    def _file_mtimes(self) -> tuple[float, float]:
        return os.path.getmtime(self.cert_file), os.path.getmtime(self.key_file)

    def _local_bundle(self) -> certs.CertBundle:
        now = self._now()
        if self._bundle is None:
            log.info("webhook: made a CA and a serving certificate for %s", ", ".join(self._hosts))
            return certs.new_bundle(self._hosts, now)
        reason = certs.renewal_reason(self._bundle, self._hosts, now)
        if reason is not None:
            log.info("webhook certificate: %s", reason)
        return certs.renewed(self._bundle, self._hosts, now)

    async def _shared_bundle(self) -> certs.CertBundle:
        """The Secret's bundle, made or renewed by whichever replica sees the need first."""
        assert self._secret is not None and self._api is not None
        namespace, name = self._secret
        for _attempt in range(3):
            found = await self._api.read_secret(namespace, name)
            current = certs.CertBundle.from_secret_data(found[0]) if found else None
            now = self._now()
            if current is not None and certs.renewal_reason(current, self._hosts, now) is None:
                return current
            bundle = (
                certs.renewed(current, self._hosts, now)
                if current is not None
                else certs.new_bundle(self._hosts, now)
            )
            try:
                await self._api.write_secret(
                    namespace, name, bundle.as_secret_data(), found[1] if found else None
                )
            except Conflict:
                continue  # another replica wrote first: read theirs
            log.info(
                "webhook: wrote %s certificates to Secret %s/%s",
                "renewed" if current else "new",
                namespace,
                name,
            )
            return bundle
        raise Conflict(f"Secret {namespace}/{name} kept changing under us")

    def _write(self, bundle: certs.CertBundle) -> None:
        for path, text in ((self.key_file, bundle.key), (self.cert_file, bundle.cert)):
            tmp = f"{path}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(tmp, path)

    async def _register(self, ca_pem: str) -> None:
        assert self._api is not None and self._configuration is not None
        try:
            if await self._api.register_ca(self._configuration, ca_pem):
                log.info(
                    "webhook: CA registered in MutatingWebhookConfiguration %s",
                    self._configuration,
                )
        except NotFound:
            self._warn_once(
                "missing",
                f"webhook: MutatingWebhookConfiguration {self._configuration} not found; "
                "nothing calls the webhook, and gang members are refused until it exists "
                "(the chart and hack/local-cluster create it)",
            )
        except ApiError as err:
            # Forbidden, a conflict with another writer, the API server away: next turn.
            log.warning("webhook: could not register the CA in %s: %s", self._configuration, err)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def reload(self, context: ssl.SSLContext) -> None:
        context.load_cert_chain(self.cert_file, self.key_file)

    async def maintain(self, context: ssl.SSLContext, interval_seconds: float = 30) -> None:
        """Every `interval_seconds`: renew, re-register, reload; an API error waits a turn."""
        while True:
            await asyncio.sleep(interval_seconds)
            try:
                if await self.refresh():
                    self.reload(context)
                    log.info("webhook: serving certificate reloaded")
            except (ApiError, OSError, ssl.SSLError, ValueError) as err:
                log.warning(
                    "webhook: certificate upkeep failed (next try in %gs): %s",
                    interval_seconds,
                    err,
                )
