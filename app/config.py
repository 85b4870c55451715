"""Configuration: the one place every setting is declared, parsed and validated.

Each setting is a command-line flag of `gang-extender serve` and an
environment variable (GANG_EXTENDER_<NAME>); the flag wins. Invalid values stop
the process at start-up with a message naming the flag or variable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from app.core.topology import DEFAULT_LEVELS, parse_levels, with_key

ENV_PREFIX = "GANG_EXTENDER_"
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A setting with an invalid value; the message says which and why."""


@dataclass(frozen=True)
class Settings:
    kubeconfig: str | None = None
    host: str = "127.0.0.1"
    port: int = 8888
    url_prefix: str = "/scheduler"
    permit_waiting_time_seconds: float = 60.0
    max_permit_waiting_time_seconds: float = 80.0
    denied_pg_expiration_seconds: float = 3.0
    log_level: str = "info"
    log_format: str = "json"
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    ops_host: str | None = None
    ops_port: int | None = None
    gang_victim_policy: str = "protect"
    topology_key: str | None = None
    topology_levels: tuple[str, ...] = DEFAULT_LEVELS
    locality_weight: int = 2
    binpack_weight: int = 1
    binpack_resources: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1))
    score_non_gang: str = "binpack"
    x_k8s_podgroups: str = "auto"
    volcano_podgroups: str = "auto"
    native_podgroups: str = "auto"
    label_groups: str = "on"
    kueue_pod_groups: str = "on"
    leader_election_lease: str | None = None
    leader_identity: str | None = None
    on_partial_bind: str = "delete-bound"
    max_request_bytes: int = 64 * 1024 * 1024
    api_max_in_flight: int = 32
    shutdown_grace_seconds: float = 10.0
    gang_feasibility: bool = True
    gang_aging_seconds: float = 60.0
    queues: str = "auto"
    queue_overcommit_factor: float = 1.2
    webhook_port: int | None = None
    webhook_host: str | None = None
    webhook_cert_file: str | None = None
    webhook_key_file: str | None = None
    webhook_configuration: str | None = None
    webhook_cert_secret: str | None = None
    webhook_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    webhook_scheduler_names: tuple[str, ...] = ()

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def levels(self) -> tuple[str, ...]:
        """The topology levels, lowest first, with --topology-key among them."""
        return with_key(self.topology_levels, self.topology_key)


@dataclass(frozen=True)
class _Option:
    name: str
    parse: Callable[[str], Any]
    help: str
    metavar: str


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError("must be a number of seconds > 0")
    return value


def _overcommit(text: str) -> float:
    value = float(text)
    if not 1 <= value <= 10:
        raise ValueError("must be a factor between 1 and 10")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be a whole number >= 1")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise ValueError("must be a TCP port between 1 and 65535")
    return value


def _url_prefix(text: str) -> str:
    prefix = "/" + text.strip().strip("/")
    if " " in prefix:
        raise ValueError("must be a URL path such as /scheduler")
    return "" if prefix == "/" else prefix


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return value

    return parse


def _weight(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 100:
        raise ValueError("must be a whole number between 0 and 100")
    return value


def _resource_weights(text: str) -> tuple[tuple[str, int], ...]:
    pairs = []
    for item in text.split(","):
        name, sep, weight = item.strip().partition("=")
        if not sep or not name:
            raise ValueError("must look like cpu=1,memory=1,nvidia.com/gpu=4")
        try:
            pairs.append((name.strip(), _weight(weight)))
        except ValueError:
            raise ValueError(f"weight of {name.strip()!r} must be a whole number 0..100") from None
    return tuple(pairs)


def _lease(text: str) -> str:
    namespace, sep, name = text.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError("must be NAMESPACE/NAME of kube-scheduler's leader-election Lease")
    return f"{namespace}/{name}"


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _secret(text: str) -> str:
    namespace, sep, name = text.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError("must be NAMESPACE/NAME of a Secret")
    return f"{namespace}/{name}"


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _file(text: str) -> str:
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise ValueError(f"file {path} does not exist")
    return path


_OPTIONS = (
    _Option(
        "kubeconfig",
        _file,
        "kubeconfig file to reach the API server (else $KUBECONFIG, else in-cluster config)",
        "PATH",
    ),
    _Option("host", str, "address to listen on (verbs, and the rest unless --ops-port)", "ADDR"),
    _Option("port", _port, "port to listen on", "PORT"),
    _Option(
        "url_prefix",
        _url_prefix,
        "path prefix of the verbs; must match urlPrefix in KubeSchedulerConfiguration",
        "PATH",
    ),
    _Option(
        "permit_waiting_time_seconds",
        _positive_float,
        "how long a reserved gang member waits for its siblings when the PodGroup sets "
        "no scheduleTimeoutSeconds",
        "SECONDS",
    ),
    _Option(
        "max_permit_waiting_time_seconds",
        _positive_float,
        "cap on any gate wait; keep it below the extender's httpTimeout in "
        "KubeSchedulerConfiguration (90s in deploy/)",
        "SECONDS",
    ),
    _Option(
        "denied_pg_expiration_seconds",
        _positive_float,
        "how long a failed group is turned away before it is tried again; also the "
        "lifetime of a passed resource check",
        "SECONDS",
    ),
    _Option("log_level", _choice(LOG_LEVELS), "log verbosity", "LEVEL"),
    _Option("log_format", _choice(("json", "text")), "json (one object per line) or text", "FMT"),
    _Option(
        "tls_cert_file",
        _file,
        "serve HTTPS with this certificate (PEM); kube-scheduler then needs enableHTTPS",
        "PATH",
    ),
    _Option("tls_key_file", _file, "private key of --tls-cert-file (PEM)", "PATH"),
    _Option(
        "tls_client_ca_file",
        _file,
        "mutual TLS: answer only callers presenting a certificate signed by this CA",
        "PATH",
    ),
    _Option(
        "ops_host",
        str,
        "listen address of the operations server (/metrics, /debug, /healthz, /readyz) "
        "when --ops-port is set",
        "ADDR",
    ),
    _Option(
        "ops_port",
        _port,
        "serve /metrics, /debug, /healthz and /readyz on this separate plain-HTTP port "
        "instead of the verbs' port (for probes and scraping when the verbs use mTLS)",
        "PORT",
    ),
    _Option(
        "gang_victim_policy",
        _choice(("protect", "whole-gang")),
        "preemption of running gangs: protect (a member may be evicted only while its gang "
        "keeps minMember placed) or whole-gang (a gang is evicted all together or not at all)",
        "POLICY",
    ),
    _Option(
        "topology_key",
        str,
        "node label naming a topology domain (e.g. topology.kubernetes.io/zone): prioritize "
        "prefers domains that already hold members of the same gang",
        "LABEL",
    ),
    _Option(
        "topology_levels",
        parse_levels,
        "node labels naming topology levels, lowest tier first (e.g. kubernetes.io/hostname,"
        "example.com/rack,example.com/block,topology.kubernetes.io/zone): the levels a gang's "
        "topology constraint may ask for and falls back through (--topology-key is added)",
        "LABELS",
    ),
    _Option(
        "locality_weight",
        _weight,
        "weight of gang locality in the prioritize score (0 turns it off)",
        "N",
    ),
    _Option(
        "binpack_weight", _weight, "weight of binpack in the prioritize score (0 turns it off)", "N"
    ),
    _Option(
        "binpack_resources",
        _resource_weights,
        "resources binpack weighs, name=weight,... (Volcano's binpack.<resource>)",
        "LIST",
    ),
    _Option(
        "score_non_gang",
        _choice(("binpack", "none")),
        "prioritize for pods in no gang: binpack, or none (a neutral 0)",
        "MODE",
    ),
    _Option(
        "x_k8s_podgroups",
        _choice(("auto", "off")),
        "scheduler-plugins PodGroups (scheduling.x-k8s.io/v1alpha1, pod label "
        "scheduling.x-k8s.io/pod-group): auto (used when the API server serves them) or off",
        "MODE",
    ),
    _Option(
        "volcano_podgroups",
        _choice(("auto", "off")),
        "Volcano PodGroups (scheduling.volcano.sh/v1beta1, pod annotation "
        "scheduling.k8s.io/group-name): auto or off",
        "MODE",
    ),
    _Option(
        "native_podgroups",
        _choice(("auto", "off")),
        "Kubernetes PodGroups (scheduling.k8s.io/v1beta1, pod spec.schedulingGroup; feature "
        "gate GenericWorkload): auto, or off to leave them to the in-tree GangScheduling plugin",
        "MODE",
    ),
    _Option(
        "label_groups",
        _choice(("on", "off")),
        "label-only groups (pod-group.scheduling.sigs.k8s.io/name + /min-available): on or off",
        "MODE",
    ),
    _Option(
        "kueue_pod_groups",
        _choice(("on", "off")),
        "Kueue's plain pod groups (label kueue.x-k8s.io/pod-group-name + annotation "
        "kueue.x-k8s.io/pod-group-total-count): on or off",
        "MODE",
    ),
    _Option(
        "leader_election_lease",
        _lease,
        "NAMESPACE/NAME of the Lease kube-scheduler's leader election holds: with several "
        "replicas only the replica whose kube-scheduler holds it writes status, events and "
        "evictions (unset: this process always writes)",
        "NS/NAME",
    ),
    _Option(
        "leader_identity",
        str,
        "this replica's name as kube-scheduler's Lease holder identity starts (`<hostname>_`): "
        "the pod name",
        "NAME",
    ),
    _Option(
        "on_partial_bind",
        _choice(("delete-bound", "leave")),
        "when a binding fails after the gate opened and the gang is left below minMember "
        "bound: delete-bound (delete the members that admission bound, so their controllers "
        "recreate them and the gang is retried whole) or leave (keep them bound; the failed "
        "member joins them on kube-scheduler's retry)",
        "POLICY",
    ),
    _Option(
        "max_request_bytes",
        _positive_int,
        "largest verb request body accepted; larger ones get HTTP 413 (a filter call with "
        "full Node objects for 5,000 nodes is about 50 MiB)",
        "BYTES",
    ),
    _Option(
        "api_max_in_flight",
        _positive_int,
        "API requests of the verbs (bindings above all) under way at once; the rest wait "
        "their turn here, not in the API server. Each is a kept-alive connection, and a new "
        "one costs a TLS handshake on both sides",
        "N",
    ),
    _Option(
        "shutdown_grace_seconds",
        _positive_float,
        "on SIGTERM: verbs are refused and gate waiters answered at once, then bindings in "
        "flight get this long to finish; keep it below terminationGracePeriodSeconds",
        "SECONDS",
    ),
    _Option(
        "gang_feasibility",
        _bool,
        "admit a gang only when all the members it still needs fit at once, one competing "
        "gang at a time in priority order, releasing a gang at once when a member finds no "
        "node (false: members are admitted one by one, as in Coscheduling)",
        "BOOL",
    ),
    _Option(
        "gang_aging_seconds",
        _positive_float,
        "a gang that has waited this long for capacity is no longer overtaken by gangs of "
        "equal or lower priority behind it",
        "SECONDS",
    ),
    _Option(
        "queues",
        _choice(("auto", "off")),
        "Volcano Queues (scheduling.volcano.sh/v1beta1 queues): auto shares the cluster "
        "among them by weight once one exists; off ignores them",
        "MODE",
    ),
    _Option(
        "queue_overcommit_factor",
        _overcommit,
        "a queue below its deserved share may admit a gang that takes it up to this "
        "multiple of the share (gangs come whole)",
        "FACTOR",
    ),
    _Option(
        "webhook_port",
        _port,
        "serve the mutating admission webhook (HTTPS, path /mutate-pods) on this port: it "
        "marks gang members with gang-extender.dev/member for the gang-only mode (unset: "
        "no webhook)",
        "PORT",
    ),
    _Option("webhook_host", str, "listen address of the webhook (default --host)", "ADDR"),
    _Option(
        "webhook_cert_file",
        _file,
        "the webhook's serving certificate (PEM; reloaded when it changes); unset: "
        "gang-extender makes its own CA and certificate",
        "PATH",
    ),
    _Option("webhook_key_file", _file, "private key of --webhook-cert-file (PEM)", "PATH"),
    _Option(
        "webhook_configuration",
        str,
        "name of the MutatingWebhookConfiguration whose caBundle gang-extender keeps set to "
        "its own CA (self-made certificates only)",
        "NAME",
    ),
    _Option(
        "webhook_cert_secret",
        _secret,
        "NAMESPACE/NAME of a Secret holding the self-made CA and certificate, so that every "
        "replica serves the same ones (created and renewed by whichever replica comes first)",
        "NS/NAME",
    ),
    _Option(
        "webhook_hosts",
        _names,
        "DNS names and IP addresses of the self-made serving certificate (the Service's "
        "names in a cluster)",
        "LIST",
    ),
    _Option(
        "webhook_scheduler_names",
        _names,
        "mark only pods naming one of these schedulers (comma-separated; empty: every pod "
        "of a group). Other schedulers would count the resource and find no node",
        "LIST",
    ),
)


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_of(name: str) -> str:
    return ENV_PREFIX + name.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every setting as a flag; defaults are applied later, by load()."""
    defaults = Settings()
    for option in _OPTIONS:
        default = getattr(defaults, option.name)
        if isinstance(default, tuple):
            default = ",".join(
                f"{item[0]}={item[1]}" if isinstance(item, tuple) else str(item) for item in default
            )
        elif isinstance(default, bool):
            default = str(default).lower()
        parser.add_argument(
            flag_of(option.name),
            dest=option.name,
            metavar=option.metavar,
            default=None,
            help=f"{option.help} [env {env_of(option.name)}; default {default}]",
        )


def load(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """Settings from flags, then environment, then defaults; raise ConfigError if invalid."""
    values: dict[str, Any] = {}
    for option in _OPTIONS:
        raw = getattr(args, option.name, None)
        source = flag_of(option.name)
        if raw is None:
            raw = env.get(env_of(option.name))
            source = env_of(option.name)
        if raw is None:
            continue
        try:
            values[option.name] = option.parse(raw)
        except ValueError as err:
            raise ConfigError(f"{source}={raw!r}: {err}") from None
    if "kubeconfig" not in values and env.get("KUBECONFIG"):
        values["kubeconfig"] = env["KUBECONFIG"].split(os.pathsep)[0]
    settings = Settings(**values)
    _check_tls(settings)
    _check_webhook(settings)
    if settings.ops_port is not None and settings.ops_port == settings.port:
        raise ConfigError(
            f"{flag_of('ops_port')}={settings.ops_port} is the verbs' port: pick another port, "
            "or leave it unset to serve everything on one port"
        )
    if settings.permit_waiting_time_seconds > settings.max_permit_waiting_time_seconds:
        raise ConfigError(
            f"{flag_of('permit_waiting_time_seconds')}={settings.permit_waiting_time_seconds:g} "
            f"exceeds {flag_of('max_permit_waiting_time_seconds')}="
            f"{settings.max_permit_waiting_time_seconds:g}: raise the cap (and the scheduler's "
            "httpTimeout) or lower the wait"
        )
    return settings


def _check_tls(settings: Settings) -> None:
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        raise ConfigError(
            f"{flag_of('tls_cert_file')} and {flag_of('tls_key_file')} go together: set both "
            "to serve HTTPS, or neither"
        )
    if settings.tls_client_ca_file is not None and settings.tls_cert_file is None:
        raise ConfigError(
            f"{flag_of('tls_client_ca_file')} needs {flag_of('tls_cert_file')} and "
            f"{flag_of('tls_key_file')}: mutual TLS is only possible over HTTPS"
        )


def _check_webhook(settings: Settings) -> None:
    if (settings.webhook_cert_file is None) != (settings.webhook_key_file is None):
        raise ConfigError(
            f"{flag_of('webhook_cert_file')} and {flag_of('webhook_key_file')} go together: set "
            "both, or neither for self-made certificates"
        )
    if settings.webhook_port is not None and settings.webhook_port in (
        settings.port,
        settings.ops_port,
    ):
        raise ConfigError(
            f"{flag_of('webhook_port')}={settings.webhook_port} is taken by the verbs or the "
            "operations server: pick another port"
        )


def describe(settings: Settings) -> dict[str, Any]:
    """Settings as logged at start-up."""
    return {f.name: getattr(settings, f.name) for f in fields(settings)}
