"""The command line: argument types, --help text, and `main` (what the wrapper runs).

`main` builds the one `Config` (paths and ports) from the environment and
hands it to the subcommand.
"""

from __future__ import annotations

import argparse
import os
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from .commands import UpOptions, cmd_add_node, cmd_down, cmd_simulate_pods, cmd_status, cmd_up
from .components import DISABLED_CONTROLLERS, POD_SIMULATOR, SIMULATE_COMMAND, parse_feature_gates
from .layout import MODE_EVERY_VERB, MODE_GANG_ONLY, Config, Layout, Ports
from .nodes import NodeShape
from .podsim import EXIT_AFTER_ANNOTATION, EXIT_PHASE_ANNOTATION
from .report import LOG_TAIL_LINES, ClusterError, info, tail
from .scheduler_config import NODELIST_SCHEDULER_NAME, default_webhook_url

DEFAULT_EXTENDER_URL = "http://127.0.0.1:8888/scheduler"

_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _quantity(value: str) -> str:
    if not _QUANTITY_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"not a Kubernetes quantity: {value!r} (e.g. 4, 500m, 8Gi)"
        )
    return value


def _http_url(value: str) -> str:
    """kube-scheduler accepts any string as urlPrefix and only fails per pod."""
    parsed = urllib.parse.urlsplit(value)
    if (
        parsed.scheme not in ("http", "https")
        or not parsed.hostname
        or any(c.isspace() for c in value)
    ):
        raise argparse.ArgumentTypeError(
            f"expected an http(s) URL such as {DEFAULT_EXTENDER_URL}, got {value!r}"
        )
    return value.rstrip("/")


def _feature_gates(value: str) -> dict[str, bool]:
    try:
        return parse_feature_gates(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return n


def _non_negative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return n


def _label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not _LABEL_KEY_RE.match(key) or len(val) > 63 or not _LABEL_VALUE_RE.match(val):
        raise argparse.ArgumentTypeError(f"expected a label key=value, got {value!r}")
    return key, val


def _node_name(value: str) -> str:
    if not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", value):
        raise argparse.ArgumentTypeError(
            f"not a valid node name: {value!r} (lowercase DNS subdomain)"
        )
    return value


DESCRIPTION = """\
Run a real local Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; built by hack/build-kube at the
version pinned in hack/kube/versions.env) on 127.0.0.1 for tests and demos,
with fake nodes (Node objects, no kubelet) for the scheduler to place pods on.
kube-scheduler calls the gang-extender at --extender-url: for gang members
(marked by its admission webhook at --webhook-url) and for the preemption of
plain pods that may preempt (marked by a MutatingAdmissionPolicy) in the
default gang-only mode, for every pod with --extender-mode every-verb.
"""


def epilog(ports: Ports) -> str:
    """The --help text after the options; it names this cluster's (offset) ports."""
    return f"""\
commands:
  up        start (or reconcile) the cluster; last stdout line is
            `export KUBECONFIG=<path>`, progress goes to stderr
  down      stop exactly the processes `up` started and delete the etcd data
            (certificates are kept); the next `up` starts an empty cluster
  status    components, pids, apiserver readyz, Ready nodes;
            exit 0 all running, 1 degraded, 3 down
  add-node  add one more fake node to the running cluster (fails if a node
            of that name exists)

`up` is idempotent: a healthy control plane is kept as it is (unless
--feature-gates differ from what runs); scheduler(s)
are restarted only if --extender-url, --node-cache-capable or
--with-nodelist-scheduler differ from what runs; missing node-1..node-N are
created (extra nodes are never deleted); the CRDs in deploy/crds/ are
re-applied. If etcd, kube-apiserver or kube-controller-manager died, all
components are stopped and started again (the etcd data is kept; use `down`
for an empty cluster); a scheduler that died is simply started again.
`up` returns once the `default` ServiceAccount exists, so pods can be created
in namespace default at once; in a namespace you create yourself, wait for
its `default` ServiceAccount (kube-controller-manager adds it within ~1s).

fake nodes: labels kubernetes.io/hostname=<name>, kubernetes.io/os=linux,
type=fake-node; Ready=True, no taints. They stay Ready because the
controller-manager runs with --controllers=*,-{",-".join(DISABLED_CONTROLLERS)}.

pod simulator (on unless --no-pod-simulator; log logs/{POD_SIMULATOR}.log):
plays the kubelet of the fake nodes. A pod bound to one goes Running (Ready,
containers running, made-up 10.x IPs); a pod deleted with a grace period is
deleted for good (grace 0), as a kubelet does once its containers stopped.
Annotations {EXIT_AFTER_ANNOTATION}: "N" and optionally
{EXIT_PHASE_ANNOTATION}: Succeeded|Failed (default Succeeded) make the pod
reach that phase N seconds after it started running (exit code 0 or 1).
Without the simulator bound pods stay Pending and deleted ones Terminating.

ports (127.0.0.1 only): etcd {ports.etcd_client} (peer {ports.etcd_peer}), \
kube-apiserver {ports.apiserver},
kube-controller-manager {ports.controller_manager}, kube-scheduler {ports.scheduler},
kube-scheduler-nodelist {ports.nodelist_scheduler}; the pod simulator listens on none.

state dir: <repo>/.local-cluster (or $LOCAL_CLUSTER_DIR): certs/, etcd/,
kubeconfig (admin, system:masters), *.kubeconfig, *-config.yaml (rendered
scheduler configs), logs/<component>.log, pids/<component>.pid, state.json.

examples:
  eval "$(hack/local-cluster up --nodes 3 --with-nodelist-scheduler)"
  hack/local-cluster up --feature-gates GenericWorkload=true   # native PodGroups
  hack/local-cluster add-node node-4 --label topology.kubernetes.io/zone=b
  hack/local-cluster status; hack/local-cluster down
"""


def build_parser(ports: Ports) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hack/local-cluster",
        description=DESCRIPTION,
        epilog=epilog(ports),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{up,down,status,add-node}")
    sub.required = True

    up = sub.add_parser(
        "up",
        help="start the cluster (idempotent)",
        description=DESCRIPTION,
        epilog=epilog(ports),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument(
        "--nodes", type=_non_negative_int, default=3, help="fake nodes node-1..node-N (default 3)"
    )
    up.add_argument(
        "--node-cpu", type=_quantity, default="4", help="cpu capacity per node (default 4)"
    )
    up.add_argument(
        "--node-memory", type=_quantity, default="8Gi", help="memory per node (default 8Gi)"
    )
    up.add_argument(
        "--node-pods", type=_positive_int, default=110, help="max pods per node (default 110)"
    )
    up.add_argument(
        "--extender-url",
        type=_http_url,
        default=DEFAULT_EXTENDER_URL,
        help=f"extender urlPrefix in the scheduler config (default {DEFAULT_EXTENDER_URL})",
    )
    up.add_argument(
        "--extender-mode",
        choices=(MODE_GANG_ONLY, MODE_EVERY_VERB),
        default=MODE_GANG_ONLY,
        help=f"{MODE_GANG_ONLY} (default): kube-scheduler calls filter/prioritize/bind only for "
        "pods marked gang-extender.dev/member by the extender's admission webhook, preempt for "
        "them and for plain pods that may preempt (deploy/scheduler-config.yaml, "
        f"deploy/webhook.yaml); {MODE_EVERY_VERB}: "
        "every verb for every pod, no webhook (deploy/scheduler-config-every-verb.yaml)",
    )
    up.add_argument(
        "--webhook-url",
        type=_http_url,
        default=None,
        help="where kube-apiserver calls the extender's webhook in gang-only mode (default: "
        "https, the extender URL's host and port + 1, /mutate-pods: start the extender with "
        "--webhook-port <its port + 1> --webhook-configuration gang-extender)",
    )
    up.add_argument(
        "--node-cache-capable",
        type=_bool,
        default=True,
        metavar="true|false",
        help="extender nodeCacheCapable of the default-scheduler profile (default true)",
    )
    up.add_argument(
        "--with-nodelist-scheduler",
        action="store_true",
        help=f"also run a second kube-scheduler, profile {NODELIST_SCHEDULER_NAME}, "
        "nodeCacheCapable=false, same extender (log logs/kube-scheduler-nodelist.log)",
    )
    up.add_argument(
        "--feature-gates",
        type=_feature_gates,
        default={},
        metavar="Name=true|false,...",
        help="Kubernetes feature gates for kube-apiserver, kube-controller-manager and the "
        "schedulers; APIs a gate needs are served too (GenericWorkload=true serves "
        "scheduling.k8s.io/v1beta1). A change restarts the control plane (etcd data is kept)",
    )
    up.add_argument(
        "--no-scheduler",
        dest="scheduler",
        action="store_false",
        help="run no kube-scheduler (the caller starts its own, e.g. bench/e2e.py)",
    )
    up.add_argument(
        "--no-pod-simulator",
        dest="pod_simulator",
        action="store_false",
        help="do not run the pod simulator: bound pods stay Pending, deleted ones Terminating",
    )

    sub.add_parser("down", help="stop the cluster and delete its etcd data")
    sub.add_parser("status", help="show components and health (exit 0 up, 1 degraded, 3 down)")

    add = sub.add_parser("add-node", help="add a fake node to the running cluster")
    add.add_argument("name", type=_node_name, help="node name, e.g. node-4")
    add.add_argument("--cpu", type=_quantity, default="4", help="cpu capacity (default 4)")
    add.add_argument(
        "--memory", type=_quantity, default="8Gi", help="memory capacity (default 8Gi)"
    )
    add.add_argument("--pods", type=_positive_int, default=110, help="max pods (default 110)")
    add.add_argument(
        "--label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra label, repeatable (e.g. topology.kubernetes.io/zone=a)",
    )

    # Hidden (no help): the pod-simulator component that `up` starts in the background.
    simulate = sub.add_parser(SIMULATE_COMMAND)
    simulate.add_argument("--state-dir", required=True)
    simulate.add_argument("--port-offset", type=int, default=ports.offset)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (errors -> 1, with the failing component's log)."""
    config = Config.from_env(os.environ)
    args = build_parser(config.ports).parse_args(argv)
    try:
        if args.command == "up":
            shape = NodeShape(cpu=args.node_cpu, memory=args.node_memory, pods=args.node_pods)
            return cmd_up(
                config,
                UpOptions(
                    args.nodes,
                    shape,
                    args.extender_url,
                    args.node_cache_capable,
                    args.with_nodelist_scheduler,
                    args.pod_simulator,
                    args.feature_gates,
                    args.scheduler,
                    args.extender_mode,
                    args.webhook_url or default_webhook_url(args.extender_url),
                ),
            )
        if args.command == "down":
            return cmd_down(config)
        if args.command == "status":
            return cmd_status(config)
        if args.command == SIMULATE_COMMAND:
            # The simulator's cluster is the one `up` named on its command line.
            return cmd_simulate_pods(
                replace(
                    config,
                    layout=Layout(Path(args.state_dir).resolve()),
                    ports=Ports(args.port_offset),
                )
            )
        if args.command == "add-node":
            shape = NodeShape(
                cpu=args.cpu, memory=args.memory, pods=args.pods, labels=dict(args.label)
            )
            return cmd_add_node(config, args.name, shape)
    except ClusterError as err:
        info(f"error: {err}")
        if err.log_file is not None:
            text = tail(err.log_file)
            if text:
                info(f"last {LOG_TAIL_LINES} lines of {err.log_file}:\n{text}")
        return 1
    except KeyboardInterrupt:
        info("interrupted")
        return 130
    raise AssertionError(args.command)
