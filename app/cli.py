"""Command line: `gang-extender serve [flags]` (also `python -m app serve`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from app import __version__
from app.config import ConfigError, add_arguments, describe, load

log = logging.getLogger("app")


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
    import uvicorn

    from app.logs import configure
    from app.server import KubeConfigError, build_app

    try:
        settings = load(args, os.environ)
    except ConfigError as err:
        print(f"gang-extender: invalid configuration: {err}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)
    try:
        application = build_app(settings)
    except KubeConfigError as err:
        print(f"gang-extender: {err}", file=sys.stderr)
        return 2
    log.info("configuration", extra={"reason": describe(settings)})
    uvicorn.run(
        application,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0
