"""Configuration: every setting declared with its default, loaded and validated.

Each setting is a command-line flag of `gang-extender serve` and an
environment variable (GANG_EXTENDER_<NAME>); the flag wins. Invalid values stop
the process at start-up with a message naming the flag or variable. What text
each flag accepts, and its help, is app/flags.py's table.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from app.core.topology.domains import DEFAULT_LEVELS, with_key
from app.flags import FLAGS

ENV_PREFIX = "GANG_EXTENDER_"


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
    member_node_choice: str = "extender"
    x_k8s_podgroups: str = "auto"
    volcano_podgroups: str = "auto"
    native_podgroups: str = "auto"
    label_groups: str = "on"
    kueue_pod_groups: str = "on"
    kai_podgroups: str = "auto"
    yunikorn_task_groups: str = "on"
    lws_gangs: str = "off"
    leader_election_lease: str | None = None
    leader_identity: str | None = None
    on_partial_bind: str = "delete-bound"
    max_request_bytes: int = 64 * 1024 * 1024
    api_max_in_flight: int = 32
    shutdown_grace_seconds: float = 10.0
    full_gc_interval_seconds: float = 60.0
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
    expect_marked_preemptors: bool = False
    hold_waiting_gangs: str = "auto"

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def holds_gangs(self) -> bool:
        """Whether gangs may be held in line at all (app/runtime/holds.py): --hold-waiting-gangs
        true, or auto where it can (the gang-only mode's webhook, --gang-feasibility=true)."""
        if self.hold_waiting_gangs == "true":
            return True
        return (
            self.hold_waiting_gangs == "auto"
            and self.webhook_port is not None
            and self.gang_feasibility
        )

    @property
    def levels(self) -> tuple[str, ...]:
        """The topology levels, lowest first, with --topology-key among them."""
        return with_key(self.topology_levels, self.topology_key)


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_of(name: str) -> str:
    return ENV_PREFIX + name.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every setting as a flag; defaults are applied later, by load()."""
    defaults = Settings()
    for option in FLAGS:
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
    for option in FLAGS:
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
    if settings.expect_marked_preemptors and settings.webhook_port is None:
        raise ConfigError(
            f"{flag_of('expect_marked_preemptors')}=true is for the gang-only mode, which "
            f"serves the webhook: set {flag_of('webhook_port')}"
        )
    if settings.hold_waiting_gangs == "true" and settings.webhook_port is None:
        raise ConfigError(
            f"{flag_of('hold_waiting_gangs')}=true needs the webhook that gives gang members "
            f"the line's scheduling gate: set {flag_of('webhook_port')} (the gang-only mode)"
        )
    if settings.hold_waiting_gangs == "true" and not settings.gang_feasibility:
        raise ConfigError(
            f"{flag_of('hold_waiting_gangs')}=true holds gangs while they wait in the line, "
            f"which only {flag_of('gang_feasibility')}=true keeps: set it, or leave it auto"
        )


# kube-scheduler's default podMaxBackoffSeconds: the longest a member it turned away (or
# the gate released) waits before it is tried again.
SCHEDULER_MAX_BACKOFF_SECONDS = 10.0


def advice(settings: Settings) -> list[str]:
    """Valid settings that are likely unwise, each with what to do (logged as warnings at
    start-up: they do not stop the extender, a test setup may want them)."""
    notes = []
    wait = settings.permit_waiting_time_seconds
    if wait < SCHEDULER_MAX_BACKOFF_SECONDS:
        notes.append(
            f"{flag_of('permit_waiting_time_seconds')}={wait:g} is below kube-scheduler's "
            f"default podMaxBackoffSeconds ({SCHEDULER_MAX_BACKOFF_SECONDS:g}s): a member it "
            "backed off can come back after its gang timed out in the gate, and under "
            "contention the gang may time out again and again; raise the wait to at least the "
            "scheduler's podMaxBackoffSeconds"
        )
    return notes


def describe(settings: Settings) -> dict[str, Any]:
    """Settings as logged at start-up."""
    return {f.name: getattr(settings, f.name) for f in fields(settings)}
