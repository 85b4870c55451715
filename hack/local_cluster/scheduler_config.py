"""Which kube-schedulers run, and the KubeSchedulerConfiguration of each.

The rendering is pure (template text in, YAML text out), so it is unit-tested
without a cluster; `commands` reads deploy/scheduler-config.yaml and writes the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .layout import SCHEDULER_CONFIG_TEMPLATE, Ports
from .report import ClusterError

DEFAULT_SCHEDULER_NAME = "default-scheduler"
NODELIST_SCHEDULER_NAME = "gang-scheduler-nodelist"

_DEFAULT_PROFILE_LINE = re.compile(
    r"^(\s*-?\s*schedulerName:\s*)\"?default-scheduler\"?[ \t]*$", re.MULTILINE
)
_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


@dataclass(frozen=True)
class SchedulerSpec:
    """One kube-scheduler process: its component name, profile and extender mode."""

    component: str
    scheduler_name: str
    node_cache_capable: bool
    port: int


def desired_schedulers(
    ports: Ports, node_cache_capable: bool, with_nodelist: bool, scheduler: bool = True
) -> list[SchedulerSpec]:
    """The schedulers `up` runs for its options (none with --no-scheduler)."""
    if not scheduler:
        # `up --no-scheduler`: the caller runs its own kube-scheduler (bench/e2e.py
        # starts one per run, after the pods exist).
        return []
    specs = [
        SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, node_cache_capable, ports.scheduler)
    ]
    if with_nodelist:
        # The second scheduler always runs the extender in node-list mode so
        # tests can exercise both nodeCacheCapable modes at once.
        specs.append(
            SchedulerSpec(
                "kube-scheduler-nodelist",
                NODELIST_SCHEDULER_NAME,
                False,
                ports.nodelist_scheduler,
            )
        )
    return specs


def render_scheduler_config(
    template: str, kubeconfig: Path, spec: SchedulerSpec, extender_url: str
) -> str:
    """Fill deploy/scheduler-config.yaml's placeholders for one scheduler.

    The template has no placeholder for the profile name; if it gains
    @SCHEDULER_NAME@ that is used, otherwise the single
    `schedulerName: default-scheduler` line is rewritten.
    """
    quoted_url = extender_url.replace("\\", "\\\\").replace('"', '\\"')
    text = template.replace("@KUBECONFIG@", str(kubeconfig))
    text = text.replace("@EXTENDER_URL@", quoted_url)
    text = text.replace("@NODE_CACHE_CAPABLE@", "true" if spec.node_cache_capable else "false")
    if "@SCHEDULER_NAME@" in text:
        text = text.replace("@SCHEDULER_NAME@", spec.scheduler_name)
    elif spec.scheduler_name != DEFAULT_SCHEDULER_NAME:
        text, count = _DEFAULT_PROFILE_LINE.subn(lambda m: m.group(1) + spec.scheduler_name, text)
        if count != 1:
            raise ClusterError(
                f"{SCHEDULER_CONFIG_TEMPLATE}: expected exactly one "
                "`schedulerName: default-scheduler` line (or an @SCHEDULER_NAME@ "
                f"placeholder) to set profile {spec.scheduler_name}, found {count}"
            )
    leftover = [
        m.group(0)
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        for m in _PLACEHOLDER.finditer(line)
    ]
    if leftover:
        raise ClusterError(
            f"{SCHEDULER_CONFIG_TEMPLATE}: unknown placeholder(s) "
            + ", ".join(sorted(set(leftover)))
        )
    return text


def default_webhook_url(extender_url: str) -> str:
    """The webhook next to the verbs: same host, the verbs' port + 1, HTTPS.

    The test sessions, the demo and the benches start the extender with
    `--webhook-port <port + 1>` (hack/clusterkit.py webhook_args).
    """
    parts = urlsplit(extender_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"https://{parts.hostname}:{port + 1}/mutate-pods"


def render_webhook(
    template: str,
    webhook_url: str,
    scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER_NAME, NODELIST_SCHEDULER_NAME),
) -> str:
    """deploy/webhook.yaml with the webhook's URL and the schedulers whose pods it marks."""
    for placeholder in ("@WEBHOOK_URL@", "@SCHEDULER_NAMES@"):
        if placeholder not in template:
            raise ClusterError(f"deploy/webhook.yaml: no {placeholder} placeholder")
    names = "[" + ", ".join(f"'{name}'" for name in scheduler_names) + "]"
    return template.replace("@WEBHOOK_URL@", webhook_url.replace('"', "%22")).replace(
        "@SCHEDULER_NAMES@", names
    )
