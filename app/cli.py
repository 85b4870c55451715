"""Command line: `gang-extender serve [flags]` (also `python -m app serve`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from app import __version__
from app.config import ConfigError, Settings, add_arguments, advice, describe, load

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

    from app.server import Apps
    from app.web.webhook import WebhookApp, WebhookCerts

log = logging.getLogger("app")

_SWITCH_INTERVAL_SECONDS = 0.0005


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="gang-extender",
        description="All-or-nothing (gang) scheduling for Kubernetes, as a kube-scheduler "
        "extender (filter, prioritize, preempt and bind verbs).",
    )
    top.add_argument("--version", action="version", version=f"gang-extender {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the extender HTTP service",
        description="Run the extender. Every flag can also be set with the environment "
        "variable shown in its help; flags win.",
    )
    add_arguments(serve)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return 2


def serve(args: argparse.Namespace) -> int:
    # Imported here so `--help` stays fast and works without the runtime deps.
    from app.kube.client import KubeConfigError
    from app.ops.logs import configure
    from app.server import build_apps

    try:
        settings = load(args, os.environ)
    except ConfigError as err:
        print(f"gang-extender: invalid configuration: {err}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)
    try:
        apps = build_apps(settings)
    except KubeConfigError as err:
        print(f"gang-extender: {err}", file=sys.stderr)
        return 2
    log.info("configuration: %s", json.dumps(describe(settings)))
    for note in advice(settings):
        log.warning("configuration: %s", note)
    # The event loop answers kube-scheduler's filter and prioritize calls, one
    # pod after the other, and makes every API call itself (app/kube/http.py):
    # no thread of ours competes with it. The short switch interval bounds what
    # any other thread (a library's) can cost it: after a socket call the loop
    # waits for the GIL up to the interval (5 ms by default) whenever such a
    # thread holds it, and that wait lands on every pod's scheduling.
    # bench/e2e.py, with API threads competing, measured plain-pod throughput
    # at 0.75 of kube-scheduler alone with 5 ms and 0.92 with 0.5 ms
    # (BENCHMARKS.md, "GIL hand-over").
    sys.setswitchinterval(_SWITCH_INTERVAL_SECONDS)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_run(settings, apps))
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (a dependency on Linux), else asyncio's own loop.

    Every verb call, watch event and gate wake-up goes through the loop; on a
    control-plane node the extender shares the CPUs with kube-scheduler and
    the API server, so the loop's own overhead per pod counts.
    """
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _run(settings: Settings, apps: Apps) -> None:
    servers = [_verbs_server(settings, apps)]
    if apps.ops is not None:
        servers.append(
            _server(
                apps,
                apps.ops,
                settings,
                host=settings.ops_host or settings.host,
                port=settings.ops_port or 0,
                lifespan="off",
            )
        )
    upkeep: list[asyncio.Task[None]] = []
    if apps.webhook is not None and apps.webhook_certs is not None:
        server, maintain = await _webhook_server(settings, apps, apps.webhook, apps.webhook_certs)
        servers.append(server)
        upkeep.append(asyncio.create_task(maintain))
    try:
        await asyncio.gather(*(server.serve() for server in servers))
    finally:
        for task in upkeep:
            task.cancel()
        if apps.webhook_certs is not None:
            apps.webhook_certs.close()


def verbs_http() -> dict[str, Any]:
    """uvicorn's settings for the verbs' port (bench.verbfloor's uvicorn floor uses them too).

    kube-scheduler calls the verbs directly: no proxy headers to honour, and
    the answers need no Server or Date header; each is work on every filter
    call. Each answer's head and body leave in one write
    (app/web/joined_writes.py).
    """
    from app.web.joined_writes import JoinedWritesProtocol

    return {
        "http": JoinedWritesProtocol,
        "proxy_headers": False,
        "server_header": False,
        "date_header": False,
    }


def _verbs_server(settings: Settings, apps: Apps) -> uvicorn.Server:
    tls: dict[str, Any] = {}
    if settings.tls:
        tls = {"ssl_certfile": settings.tls_cert_file, "ssl_keyfile": settings.tls_key_file}
        if settings.tls_client_ca_file:
            tls |= {"ssl_ca_certs": settings.tls_client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return _server(
        apps,
        apps.main,
        settings,
        host=settings.host,
        port=settings.port,
        **verbs_http(),
        **tls,
    )


async def _webhook_server(
    settings: Settings, apps: Apps, webhook: WebhookApp, certs: WebhookCerts
) -> tuple[uvicorn.Server, Coroutine[Any, Any, None]]:
    """The webhook's server, and the upkeep of its certificate to run alongside it."""
    # The first certificate (and its caBundle registration) before we listen.
    await certs.refresh()
    server = _server(
        apps,
        webhook,
        settings,
        host=settings.webhook_host or settings.host,
        port=settings.webhook_port or 0,
        lifespan="off",
        ssl_certfile=certs.cert_file,
        ssl_keyfile=certs.key_file,
    )
    # Loaded now so that renewals can reach the SSLContext the server uses.
    server.config.load()
    assert server.config.ssl is not None
    return server, certs.maintain(server.config.ssl)


# How long an idle connection is kept open. Our clients (the API server calling the webhook,
# kube-scheduler calling the verbs) are Go programs keeping idle connections for 90 s
# (http.DefaultTransport's IdleConnTimeout, through client-go's SetTransportDefaults). A
# server closing first races the client's next request on that connection, which then
# fails with EOF, and Go retries no POST: uvicorn's default of 5 s lost a webhook call
# (failurePolicy Ignore: the pod was created unmarked, and the member-mark policy refused
# it) after 5 s without a member created. The client must be the one to close.
KEEP_ALIVE_SECONDS = 120


def _server(apps: Apps, app: ASGIApp, settings: Settings, **config: Any) -> uvicorn.Server:
    """A uvicorn server that, on SIGTERM, answers the gate's waiters before waiting for requests.

    Gate waiters are open requests: left alone, uvicorn would wait for
    them until its graceful timeout and then cut the connections.
    """
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            apps.begin_shutdown()
            super().handle_exit(sig, frame)

    config |= {
        "timeout_graceful_shutdown": settings.shutdown_grace_seconds,
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
    }
    return Server(uvicorn.Config(app, log_config=None, access_log=False, **config))
