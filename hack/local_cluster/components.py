"""The components of a cluster and the command line each one runs with.

Pure: given a `Config` (and feature gates) these functions return argv lists;
starting them is `supervise`'s job.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .layout import HOST, WRAPPER, Config, Ports
from .pki import FRONT_PROXY_CLIENT

CORE_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")
SCHEDULER_COMPONENTS = ("kube-scheduler", "kube-scheduler-nodelist")
# Plays the kubelet for the fake nodes: a Python process running this very
# package (`hack/local-cluster simulate-pods`), not a Kubernetes binary.
POD_SIMULATOR = "pod-simulator"
SIMULATE_COMMAND = "simulate-pods"
ALL_COMPONENTS = (*CORE_COMPONENTS, *SCHEDULER_COMPONENTS, POD_SIMULATOR)
COMPONENT_BINARY = {
    "etcd": "etcd",
    "kube-apiserver": "kube-apiserver",
    "kube-controller-manager": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler",
    "kube-scheduler-nodelist": "kube-scheduler",
}

SERVICE_CIDR = "10.96.0.0/12"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# Fake nodes have no kubelet, so nothing renews their heartbeat. The node
# lifecycle controller would mark them NotReady/Unknown after the grace period
# and taint them unreachable; disabling it keeps them Ready for as long as the
# cluster runs, with no background heartbeat process to manage.
DISABLED_CONTROLLERS = ("node-lifecycle-controller",)
# TaintNodesByCondition adds node.kubernetes.io/not-ready:NoSchedule to every
# new Node and relies on the (disabled) node lifecycle controller to lift it.
DISABLED_ADMISSION_PLUGINS = ("TaintNodesByCondition",)

# Alpha/beta APIs that a feature gate needs served, so `up --feature-gates
# GenericWorkload=true` is enough to use Kubernetes' native PodGroups.
FEATURE_RUNTIME_CONFIG = {
    "GenericWorkload": "scheduling.k8s.io/v1beta1=true",
    # KEP-6012 (1.37 alpha): CompositePodGroup trees (app/core/composite.py).
    "CompositePodGroup": "scheduling.k8s.io/v1alpha3=true",
}


def component_ports(ports: Ports, name: str) -> tuple[int, ...]:
    """The ports a component listens on (checked free before it starts)."""
    return {
        "etcd": (ports.etcd_client, ports.etcd_peer),
        "kube-apiserver": (ports.apiserver,),
        "kube-controller-manager": (ports.controller_manager,),
        "kube-scheduler": (ports.scheduler,),
        "kube-scheduler-nodelist": (ports.nodelist_scheduler,),
        POD_SIMULATOR: (),
    }[name]


def parse_feature_gates(text: str) -> dict[str, bool]:
    """`A=true,B=false` -> {"A": True, "B": False}; ValueError naming the bad item."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key):
            raise ValueError(f"expected Name=true|false, got {item!r}")
        if value.lower() not in ("true", "false"):
            raise ValueError(f"feature gate {key}: expected true or false, got {value!r}")
        gates[key] = value.lower() == "true"
    return gates


def feature_gate_flags(name: str, gates: dict[str, bool]) -> list[str]:
    """The --feature-gates (and, for the apiserver, --runtime-config) flags of a component."""
    if not gates or name not in (*CORE_COMPONENTS, *SCHEDULER_COMPONENTS) or name == "etcd":
        return []
    flags = [
        "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))
    ]
    if name == "kube-apiserver":
        apis = [
            FEATURE_RUNTIME_CONFIG[k]
            for k, on in sorted(gates.items())
            if on and k in FEATURE_RUNTIME_CONFIG
        ]
        if apis:
            flags.append("--runtime-config=" + ",".join(apis))
    return flags


def component_args(
    config: Config, name: str, feature_gates: dict[str, bool] | None = None
) -> list[str]:
    """Command-line flags of each component (the binary path is added later)."""
    return _base_component_args(config, name) + feature_gate_flags(name, feature_gates or {})


def _base_component_args(config: Config, name: str) -> list[str]:
    layout, ports = config.layout, config.ports
    c = layout.cert
    if name == "etcd":
        return [
            "--name=local-cluster",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls=http://{HOST}:{ports.etcd_client}",
            f"--advertise-client-urls=http://{HOST}:{ports.etcd_client}",
            f"--listen-peer-urls=http://{HOST}:{ports.etcd_peer}",
            f"--initial-advertise-peer-urls=http://{HOST}:{ports.etcd_peer}",
            f"--initial-cluster=local-cluster=http://{HOST}:{ports.etcd_peer}",
            # A throwaway test cluster: durability is not worth the fsync
            # latency that slows every write on small CI disks.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={ports.apiserver}",
            f"--etcd-servers=http://{HOST}:{ports.etcd_client}",
            # ConfigMaps are watched straight from etcd, compacted every 10s:
            # a watch from an old resourceVersion then really gets 410 Gone,
            # which the reflector tests rely on. Nothing else uses ConfigMaps.
            "--watch-cache-sizes=configmaps#0",
            "--etcd-compaction-interval=10s",
            f"--client-ca-file={c('ca.crt')}",
            f"--tls-cert-file={c('apiserver.crt')}",
            f"--tls-private-key-file={c('apiserver.key')}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={c('sa.pub')}",
            f"--service-account-signing-key-file={c('sa.key')}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--requestheader-client-ca-file={c('front-proxy-ca.crt')}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={c(FRONT_PROXY_CLIENT + '.crt')}",
            f"--proxy-client-key-file={c(FRONT_PROXY_CLIENT + '.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
            "--allow-privileged=true",
            # No kube-proxy or pods serve the `kubernetes` Service, and
            # endpoints may not point at loopback anyway.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={layout.root / 'apiserver-certs'}",
        ]
    if name == "kube-controller-manager":
        kubeconfig = layout.kubeconfig_for("kube-controller-manager")
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={HOST}",
            f"--secure-port={ports.controller_manager}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={c('sa.key')}",
            f"--root-ca-file={c('ca.crt')}",
            f"--cluster-signing-cert-file={c('ca.crt')}",
            f"--cluster-signing-key-file={c('ca.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*," + ",".join(f"-{ctrl}" for ctrl in DISABLED_CONTROLLERS),
            f"--cert-dir={layout.root / 'kube-controller-manager-certs'}",
            # Default is under /usr/libexec, which it would create.
            f"--flex-volume-plugin-dir={layout.root / 'flexvolume'}",
        ]
    if name in SCHEDULER_COMPONENTS:
        kubeconfig = layout.kubeconfig_for("kube-scheduler")
        (port,) = component_ports(ports, name)
        return [
            f"--config={layout.scheduler_config(name)}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={HOST}",
            f"--secure-port={port}",
            f"--cert-dir={layout.root / (name + '-certs')}",
            f"--v={config.scheduler_verbosity}",
        ]
    raise ValueError(name)


def component_argv(
    config: Config, bin_dir: Path, name: str, feature_gates: dict[str, bool] | None = None
) -> list[str]:
    """The full command line of a component."""
    if name == POD_SIMULATOR:
        # -B: keep hack/ free of __pycache__, as the wrapper does. The port offset
        # is passed, not inherited, so the simulator talks to this very cluster.
        return [
            sys.executable,
            "-B",
            str(WRAPPER),
            SIMULATE_COMMAND,
            f"--state-dir={config.layout.root}",
            f"--port-offset={config.ports.offset}",
        ]
    return [
        str(bin_dir / COMPONENT_BINARY[name]),
        *component_args(config, name, feature_gates),
    ]
