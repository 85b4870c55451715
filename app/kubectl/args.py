"""The command line: `kubectl gang get|describe|queues` with kubectl's own flags.

kubectl hands a plugin every argument after its name, so the flags a user
types for kubectl (`-n`, `-A`, `--context`, `--kubeconfig`, `-o`, `-w`) are
ours to read. A bad argument is one line on stderr and exit code 2, never
argparse's usage dump alone.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from app.kubectl.api import PluginError

COMMANDS = ("get", "describe", "queues")
OUTPUTS = ("", "wide", "json", "yaml")
# Where the chart is installed by default (docs/kubectl-gang.md), overridable by flag or env.
ENV_NAMESPACE = "KUBECTL_GANG_EXTENDER_NAMESPACE"
ENV_SERVICE = "KUBECTL_GANG_EXTENDER_SERVICE"
ENV_URL = "KUBECTL_GANG_EXTENDER_URL"
DEFAULT_EXTENDER_NAMESPACE = "gang-extender"


class UsageError(PluginError):
    """A command line we cannot run; exit code 2 as kubectl's own usage errors."""


@dataclass(frozen=True, slots=True)
class Options:
    command: str
    target: str | None
    namespace: str | None
    all_namespaces: bool
    kubeconfig: str | None
    context: str | None
    output: str
    watch: bool
    interval: float
    extender_namespace: str
    extender_service: str | None
    extender_url: str | None
    colour: str
    timeout: float


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see kubectl gang --help)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kubectl gang",
        description="Gangs of every source, their members and queues, "
        "with gang-extender's live state (docs/kubectl-gang.md).",
    )
    p.add_argument("command", choices=COMMANDS, help="get: every gang; describe: one; queues")
    p.add_argument("target", nargs="?", help="describe: NAMESPACE/NAME, NAME (with -n) or KEY")
    p.add_argument("-n", "--namespace", help="the namespace (default: the context's)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="gangs of every namespace")
    p.add_argument(
        "--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    p.add_argument("--context", help="the kubeconfig context to use")
    p.add_argument("-o", "--output", default="", help="wide, json or yaml")
    p.add_argument("-w", "--watch", action="store_true", help="print changes until interrupted")
    p.add_argument(
        "--watch-interval", type=float, default=2.0, help="seconds between reads with --watch"
    )
    p.add_argument(
        "--extender-namespace",
        default=os.environ.get(ENV_NAMESPACE, DEFAULT_EXTENDER_NAMESPACE),
        help=f"namespace of the extender's ops Service (${ENV_NAMESPACE})",
    )
    p.add_argument(
        "--extender-service",
        default=os.environ.get(ENV_SERVICE) or None,
        help=f"the ops Service's name (${ENV_SERVICE}; default: found by its label)",
    )
    p.add_argument(
        "--extender-url",
        default=os.environ.get(ENV_URL) or None,
        help=f"the extender's ops URL, e.g. a port-forward: http://127.0.0.1:9090 (${ENV_URL})",
    )
    p.add_argument("--color", default="auto", choices=("auto", "always", "never"))
    p.add_argument("--request-timeout", type=float, default=10.0, help="seconds per request")
    return p


def parse(argv: Sequence[str]) -> Options:
    ns = parser().parse_args(list(argv))
    output = ns.output
    if output not in OUTPUTS:
        raise UsageError(f"unknown output format {output!r}: use wide, json or yaml")
    if ns.command == "describe":
        if not ns.target:
            raise UsageError("describe needs a gang: kubectl gang describe NAMESPACE/NAME")
        _check_target(ns.target)
    elif ns.target:
        raise UsageError(f"{ns.command} takes no name (got {ns.target!r}); use describe")
    if ns.watch and (ns.command == "describe" or output in ("json", "yaml")):
        raise UsageError("--watch works with get and queues, as a table")
    if ns.watch_interval <= 0 or ns.request_timeout <= 0:
        raise UsageError("--watch-interval and --request-timeout must be positive")
    if ns.extender_url and urlparse(ns.extender_url).scheme not in ("http", "https"):
        raise UsageError(f"--extender-url must be an http(s) URL, got {ns.extender_url!r}")
    return Options(
        command=ns.command,
        target=ns.target,
        namespace=ns.namespace,
        all_namespaces=ns.all_namespaces,
        kubeconfig=ns.kubeconfig,
        context=ns.context,
        output=output,
        watch=ns.watch,
        interval=ns.watch_interval,
        extender_namespace=ns.extender_namespace,
        extender_service=ns.extender_service,
        extender_url=ns.extender_url,
        colour=ns.color,
        timeout=ns.request_timeout,
    )


def _check_target(target: str) -> None:
    """NS/NAME, NAME or SOURCE:NS/NAME; anything else is a typo worth naming."""
    body = target.split(":", 1)[1] if ":" in target else target
    parts = body.split("/")
    if len(parts) > 2 or any(not part for part in parts) or (":" in target and len(parts) != 2):
        raise UsageError(
            f"malformed gang {target!r}: use NAMESPACE/NAME, NAME with -n, "
            "or the group key SOURCE:NAMESPACE/NAME"
        )
