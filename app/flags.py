"""Every setting's flag: how its value is parsed, and the help `--help` shows for it.

app/config.py declares and loads the settings; this table says what text each accepts (a parser
raises ValueError with the rule broken; load() adds the flag or variable) and why to set it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import inf
from typing import Any, TypeVar

from app.base.flag_parsers import namespaced, resource_weights, url_prefix
from app.core.topology.domains import parse_levels

LOG_LEVELS = ("debug", "info", "warning", "error")

_Value = TypeVar("_Value", int, float)


@dataclass(frozen=True)
class Flag:
    """One setting's flag: `name` is the Settings field (--name-with-dashes on the command line)."""

    name: str
    parse: Callable[[str], Any]
    help: str
    metavar: str


def _checked(
    convert: Callable[[str], _Value], ok: Callable[[_Value], bool], rule: str
) -> Callable[[str], _Value]:
    """A parser: `convert` the text, then refuse a value that is not `ok` with `rule`."""

    def parse(text: str) -> _Value:
        value = convert(text)
        if not ok(value):
            raise ValueError(rule)
        return value

    return parse


_positive_float = _checked(float, lambda v: 0 < v < inf, "must be a number of seconds > 0")
_seconds_or_off = _checked(float, lambda v: 0 <= v < inf, "must be a number of seconds >= 0")
_overcommit = _checked(float, lambda v: 1 <= v <= 10, "must be a factor between 1 and 10")
_positive_int = _checked(int, lambda v: v >= 1, "must be a whole number >= 1")
_port = _checked(int, lambda v: 1 <= v <= 65535, "must be a TCP port between 1 and 65535")
_weight = _checked(int, lambda v: 0 <= v <= 100, "must be a whole number between 0 and 100")


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return value

    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


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


FLAGS = (
    Flag(
        "kubeconfig",
        _file,
        "kubeconfig file to reach the API server (else $KUBECONFIG, else in-cluster config)",
        "PATH",
    ),
    Flag("host", str, "address to listen on (verbs, and the rest unless --ops-port)", "ADDR"),
    Flag("port", _port, "port to listen on", "PORT"),
    Flag(
        "url_prefix",
        url_prefix,
        "path prefix of the verbs; must match urlPrefix in KubeSchedulerConfiguration",
        "PATH",
    ),
    Flag(
        "permit_waiting_time_seconds",
        _positive_float,
        "how long a reserved gang member waits for its siblings when the PodGroup sets "
        "no scheduleTimeoutSeconds",
        "SECONDS",
    ),
    Flag(
        "max_permit_waiting_time_seconds",
        _positive_float,
        "cap on any gate wait; keep it below the extender's httpTimeout in "
        "KubeSchedulerConfiguration (90s in deploy/)",
        "SECONDS",
    ),
    Flag(
        "denied_pg_expiration_seconds",
        _positive_float,
        "how long a failed group is turned away before it is tried again; also the "
        "lifetime of a passed resource check",
        "SECONDS",
    ),
    Flag("log_level", _choice(LOG_LEVELS), "log level; debug logs each filter decision", "LEVEL"),
    Flag("log_format", _choice(("json", "text")), "json (one object per line) or text", "FMT"),
    Flag(
        "tls_cert_file",
        _file,
        "serve HTTPS with this certificate (PEM); kube-scheduler then needs enableHTTPS: true",
        "PATH",
    ),
    Flag("tls_key_file", _file, "private key of --tls-cert-file (PEM)", "PATH"),
    Flag(
        "tls_client_ca_file",
        _file,
        "mutual TLS: answer only callers presenting a certificate signed by this CA",
        "PATH",
    ),
    Flag(
        "ops_host",
        str,
        "listen address of the operations server (/metrics, /debug, /healthz, /readyz) "
        "when --ops-port is set (unset: --host)",
        "ADDR",
    ),
    Flag(
        "ops_port",
        _port,
        "serve /metrics, /debug, /healthz and /readyz on this separate plain-HTTP port "
        "instead of the verbs' port (for probes and scraping when the verbs use mTLS)",
        "PORT",
    ),
    Flag(
        "gang_victim_policy",
        _choice(("protect", "whole-gang")),
        "preemption of running gangs: protect (a member may be evicted only while its gang "
        "keeps minMember placed) or whole-gang (a gang is evicted all together or not at all)",
        "POLICY",
    ),
    Flag(
        "topology_key",
        str,
        "node label naming a topology domain (e.g. topology.kubernetes.io/zone): prioritize "
        "prefers domains that already hold members of the same gang (unset: no domain locality)",
        "LABEL",
    ),
    Flag(
        "topology_levels",
        parse_levels,
        "node labels naming topology levels, lowest tier first (e.g. kubernetes.io/hostname,"
        "example.com/rack,example.com/block,topology.kubernetes.io/zone): the levels a gang's "
        "topology constraint may ask for and falls back through (--topology-key is added)",
        "LABELS",
    ),
    Flag("locality_weight", _weight, "weight of gang locality in prioritize's score (0: off)", "N"),
    Flag("binpack_weight", _weight, "weight of binpack in prioritize's score (0: off)", "N"),
    Flag(
        "binpack_resources",
        resource_weights,
        "resources binpack weighs, name=weight,... (Volcano's binpack.<resource>)",
        "LIST",
    ),
    Flag(
        "score_non_gang",
        _choice(("binpack", "none")),
        "prioritize for pods in no gang: binpack, or none (a neutral 0)",
        "MODE",
    ),
    Flag(
        "member_node_choice",
        _choice(("extender", "scheduler")),
        "who picks an admitted gang member's node: extender (the filter answers with the "
        "node prioritize ranks first, so kube-scheduler skips scoring; not for pods with "
        "preferred affinities, ScheduleAnyway spreading or a ReplicaSet, ReplicationController "
        "or StatefulSet owner) or scheduler (every node passes and kube-scheduler's scoring, "
        "with prioritize, decides)",
        "MODE",
    ),
    Flag(
        "x_k8s_podgroups",
        _choice(("auto", "off")),
        "scheduler-plugins PodGroups (scheduling.x-k8s.io/v1alpha1, pod label "
        "scheduling.x-k8s.io/pod-group): auto (used when the API server serves them) or off",
        "MODE",
    ),
    Flag(
        "volcano_podgroups",
        _choice(("auto", "off")),
        "Volcano PodGroups (scheduling.volcano.sh/v1beta1, pod annotation "
        "scheduling.k8s.io/group-name): auto or off",
        "MODE",
    ),
    Flag(
        "native_podgroups",
        _choice(("auto", "off")),
        "Kubernetes PodGroups (scheduling.k8s.io/v1beta1, pod spec.schedulingGroup; feature "
        "gate GenericWorkload): auto, or off to leave them to the in-tree GangScheduling plugin",
        "MODE",
    ),
    Flag(
        "label_groups",
        _choice(("on", "off")),
        "label-only groups (pod-group.scheduling.sigs.k8s.io/name + /min-available): on or off",
        "MODE",
    ),
    Flag(
        "kueue_pod_groups",
        _choice(("on", "off")),
        "Kueue's plain pod groups (label kueue.x-k8s.io/pod-group-name + annotation "
        "kueue.x-k8s.io/pod-group-total-count): on or off",
        "MODE",
    ),
    Flag("kai_podgroups", _choice(("auto", "off")), "KAI PodGroups (v2alpha2): auto/off", "MODE"),
    Flag("yunikorn_task_groups", _choice(("on", "off")), "YuniKorn task groups: on/off", "MODE"),
    Flag(
        "lws_gangs",
        _choice(("on", "off")),
        "LeaderWorkerSet replicas as gangs (labels leaderworkerset.sigs.k8s.io/name + "
        "/group-index, annotation /size; the webhook marks their pods): off (default) or on",
        "MODE",
    ),
    Flag(
        "leader_election_lease",
        namespaced("kube-scheduler's leader-election Lease"),
        "NAMESPACE/NAME of the Lease kube-scheduler's leader election holds: with several "
        "replicas only the replica whose kube-scheduler holds it writes status, events and "
        "evictions (unset: this process always writes)",
        "NS/NAME",
    ),
    Flag(
        "leader_identity",
        str,
        "this replica's name as kube-scheduler's Lease holder identity starts (`<hostname>_`): "
        "the pod name (unset: the hostname)",
        "NAME",
    ),
    Flag(
        "on_partial_bind",
        _choice(("delete-bound", "leave")),
        "when a binding fails after the gate opened and the gang is left below minMember "
        "bound: delete-bound (delete the members that admission bound, so their controllers "
        "recreate them and the gang is retried whole) or leave (keep them bound; the failed "
        "member joins them on kube-scheduler's retry)",
        "POLICY",
    ),
    Flag(
        "max_request_bytes",
        _positive_int,
        "largest verb request body accepted; larger ones get HTTP 413 (a filter call with "
        "full Node objects for 5,000 nodes is about 50 MiB)",
        "BYTES",
    ),
    Flag(
        "api_max_in_flight",
        _positive_int,
        "API requests of the verbs (bindings above all) under way at once; the rest wait "
        "their turn here, not in the API server. Each is a kept-alive connection, and a new "
        "one costs a TLS handshake on both sides",
        "N",
    ),
    Flag(
        "shutdown_grace_seconds",
        _positive_float,
        "on SIGTERM: verbs are refused and gate waiters answered at once, then bindings in "
        "flight get this long to finish; keep it below terminationGracePeriodSeconds",
        "SECONDS",
    ),
    Flag(
        "full_gc_interval_seconds",
        _seconds_or_off,
        "once the caches are listed, full garbage collections run this often and no other "
        "time (Python's own rule runs one every ~70,000 allocations, in a verb); 0: Python's",
        "SECONDS",
    ),
    Flag(
        "gang_feasibility",
        _bool,
        "admit a gang only when all the members it still needs fit at once, one competing "
        "gang at a time in priority order, releasing a gang at once when a member finds no "
        "node (false: members are admitted one by one, as in Coscheduling)",
        "BOOL",
    ),
    Flag(
        "gang_aging_seconds",
        _positive_float,
        "a gang that has waited this long for capacity is no longer overtaken by gangs of "
        "equal or lower priority behind it",
        "SECONDS",
    ),
    Flag(
        "queues",
        _choice(("auto", "off")),
        "Volcano Queues (scheduling.volcano.sh/v1beta1 queues): auto shares the cluster "
        "among them by weight once one exists; off ignores them",
        "MODE",
    ),
    Flag(
        "queue_overcommit_factor",
        _overcommit,
        "a queue below its deserved share may admit a gang that takes it up to this "
        "multiple of the share (gangs come whole); 1..10",
        "FACTOR",
    ),
    Flag(
        "webhook_port",
        _port,
        "serve the mutating admission webhook (HTTPS, path /mutate-pods) on this port: it "
        "marks gang members with gang-extender.dev/member for the gang-only mode (unset: "
        "no webhook)",
        "PORT",
    ),
    Flag("webhook_host", str, "webhook listen address (unset: --host; chart: 0.0.0.0)", "ADDR"),
    Flag(
        "webhook_cert_file",
        _file,
        "the webhook's serving certificate (PEM; reloaded when it changes); unset: "
        "gang-extender makes its own CA and certificate",
        "PATH",
    ),
    Flag("webhook_key_file", _file, "private key of --webhook-cert-file (PEM)", "PATH"),
    Flag(
        "webhook_configuration",
        str,
        "name of the MutatingWebhookConfiguration whose caBundle gang-extender keeps set to "
        "its own CA (self-made certificates only; hack/local-cluster: gang-extender)",
        "NAME",
    ),
    Flag(
        "webhook_cert_secret",
        namespaced("a Secret"),
        "NAMESPACE/NAME of a Secret holding the self-made CA and certificate, so that every "
        "replica serves the same ones (created and renewed by whichever replica comes first)",
        "NS/NAME",
    ),
    Flag(
        "webhook_hosts",
        _names,
        "DNS names and IP addresses of the self-made serving certificate (the Service's "
        "names in a cluster)",
        "LIST",
    ),
    Flag(
        "webhook_scheduler_names",
        _names,
        "mark only pods naming one of these schedulers (comma-separated; empty: every pod "
        "of a group). Other schedulers would count the resource and find no node",
        "LIST",
    ),
    Flag(
        "expect_marked_preemptors",
        _bool,
        "the preempt-only entry names gang-extender.dev/preemptor in managedResources, "
        "which a MutatingAdmissionPolicy gives plain pods that may preempt (the chart's "
        "markPreemptors, hack/local-cluster's gang-only mode): warn about a pending one "
        "without it, which would preempt without the extender (needs --webhook-port; see "
        '"Deployment modes" in the manual)',
        "BOOL",
    ),
    Flag(
        "hold_waiting_gangs",
        _choice(("auto", "true", "false")),
        "the webhook gives gang members a scheduling gate (gang-extender.dev/line), removed "
        "once their gang can be admitted as a whole or, for a gang that may preempt, once its "
        "preemption plan lives: a gang waiting in line costs kube-scheduler nothing, and its "
        "retried members do not crowd lower-priority pods out of kube-scheduler's queue. auto "
        "(default): a member created while gangs wait in line, in the gang-only mode with "
        "--gang-feasibility=true (else never); true: every member (needs --webhook-port); "
        'false: none. See "Held in line" in docs/contention.md',
        "MODE",
    ),
)
