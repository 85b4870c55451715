"""Run the chart's pod (kube-scheduler + extender sidecar) as two local processes.

The containers' command lines and the scheduler configuration come from
`helm template`; volumes are "mounted" by writing the ConfigMap (and a
test-supplied directory for the TLS Secret) to local directories and
mapping the container paths onto them, as the kubelet would. Only what
cannot work outside a pod is changed: the API server is reached with a
kubeconfig instead of the in-cluster ServiceAccount mount, and ports and
listen addresses are free loopback ones (several tests, and the session's
own schedulers, run side by side).
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import re
import socket
import ssl
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from app.web.webhook import WEBHOOK_PATH
from hack.clusterkit import REPO, sample, scrape, stop_process, wait_for, wait_ready
from tests.cluster.kube import Kube
from tests.packaging.helm import container, find, kube_bin

SCHEDULER_NAME = "gang-scheduler"
SIBLINGS = "cannot find enough sibling pods"


# Below the kernel's range for outgoing connections (ip_local_port_range, from 32768
# by default) and above the session clusters' fixed ports (hack/local_cluster/layout.py).
_PORTS = range(28000, 32768)
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, for a server the test starts next.

    Not bind(0): the kernel answers with a port of its range for outgoing
    connections, and any connection opened between this check and the
    server's own bind may take it (a kube-scheduler exited with "bind:
    address already in use"). A port is handed out once per test session.
    """
    low = _outgoing_ports_start()
    for port in random.sample(_PORTS, len(_PORTS)):
        if port >= low or port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {_PORTS} below {low}")


def _outgoing_ports_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _set_flag(args: list[str], name: str, value: str) -> list[str]:
    """Replace --name=... (the chart uses the = form), or append it."""
    prefix = f"--{name}="
    out = [a for a in args if not a.startswith(prefix)]
    return [*out, prefix + value]


def _remap(value: Any, mounts: Mapping[str, Path]) -> Any:
    """Container paths under a mount point -> the local directory standing in for it."""
    if isinstance(value, dict):
        return {k: _remap(v, mounts) for k, v in value.items()}
    if isinstance(value, list):
        return [_remap(v, mounts) for v in value]
    if isinstance(value, str):
        for mount, local in mounts.items():
            value = re.sub(rf"(?<![\w/]){re.escape(mount)}(?=/|$)", str(local), value)
    return value


@dataclass
class ChartPod:
    namespace: str
    lease: str
    extender_url: str
    ops_url: str
    scheduler_port: int
    logs: dict[str, Path]
    # "extender" and "kube-scheduler", to stop one container of the pod.
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def tail(self) -> str:
        return "\n".join(
            f"--- {name} ---\n{path.read_text(errors='replace')[-2500:]}"
            for name, path in self.logs.items()
        )

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the extender's /metrics, read on the plain-HTTP operations port."""
        return sample(scrape(self.ops_url), name, **labels)


def _mounts(
    docs: Sequence[dict[str, Any]], workdir: Path, secret_dirs: Mapping[str, Path]
) -> dict[str, dict[str, Path]]:
    """Per container: mount path -> local directory with the volume's files."""
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    volumes: dict[str, Path] = {}
    for volume in pod["volumes"]:
        if "configMap" in volume:
            configmap = next(
                d
                for d in docs
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
            )
            local = workdir / "volumes" / volume["name"]
            local.mkdir(parents=True, exist_ok=True)
            for key, data in configmap["data"].items():
                (local / key).write_text(data)
            volumes[volume["name"]] = local
        elif "secret" in volume:
            volumes[volume["name"]] = secret_dirs[volume["secret"]["secretName"]]
        elif "emptyDir" in volume:
            local = workdir / "volumes" / volume["name"]
            local.mkdir(parents=True, exist_ok=True)
            volumes[volume["name"]] = local
    return {
        c["name"]: {m["mountPath"]: volumes[m["name"]] for m in c.get("volumeMounts", [])}
        for c in pod["containers"]
    }


@contextlib.contextmanager
def run_chart_pod(
    docs: Sequence[dict[str, Any]],
    *,
    kubeconfig: str,
    workdir: Path,
    secret_dirs: Mapping[str, Path] | None = None,
    pod_name: str | None = None,
    webhook_port: int | None = None,
) -> Iterator[ChartPod]:
    """Start the rendered pod's extender, then its kube-scheduler; stop both on exit.

    webhook_port: in gang-only mode, where the extender serves its webhook
    (default: a free port). kube-apiserver cannot reach it through the
    chart's Service here, only on loopback: its certificate is made for
    127.0.0.1 instead of the Service's names (local_webhook() points a
    configuration there).

    pod_name: give this "pod" its own hostname, as a pod has (kube-scheduler
    runs in a UTS namespace of its own, and its Lease identity starts with
    that name), and pass it to the extender the way the chart's downward API
    does. Without it both share the machine's hostname.
    """
    mounts = _mounts(docs, workdir, secret_dirs or {})
    config_cm = find(docs, "ConfigMap", "-scheduler")
    config: dict[str, Any] = yaml.safe_load(config_cm["data"]["config.yaml"])
    extender_port, ops_port, scheduler_port = free_port(), free_port(), free_port()

    # --- scheduler configuration: the ConfigMap, with the two local changes ---
    config["clientConnection"] = {"kubeconfig": kubeconfig}
    # every-verb: one entry; gang-only: two (members' verbs, everyone's preempt).
    for extender_cfg in config["extenders"]:
        url = urllib.parse.urlsplit(extender_cfg["urlPrefix"])
        assert url.hostname == "127.0.0.1", "the chart reaches its sidecar on loopback"
        extender_cfg["urlPrefix"] = url._replace(netloc=f"127.0.0.1:{extender_port}").geturl()
    (config_dir,) = [d for d in mounts["kube-scheduler"].values() if (d / "config.yaml").exists()]
    # Files the configuration names (the TLS Secret) live where their volume is "mounted".
    config = _remap(config, mounts["kube-scheduler"])
    (config_dir / "config.yaml").write_text(yaml.safe_dump(config))

    # --- extender: the container's args, local ports and a kubeconfig ---
    ext_args = _remap(container(docs, "gang-extender")["args"], mounts["gang-extender"])
    ext_args = _set_flag(ext_args, "port", str(extender_port))
    ext_args = _set_flag(ext_args, "ops-port", str(ops_port))
    ext_args = _set_flag(ext_args, "ops-host", "127.0.0.1")
    ext_args = _set_flag(ext_args, "kubeconfig", kubeconfig)
    if any(a.startswith("--webhook-port=") for a in ext_args):
        ext_args = _set_flag(ext_args, "webhook-port", str(webhook_port or free_port()))
        ext_args = _set_flag(ext_args, "webhook-host", "127.0.0.1")
        ext_args = _set_flag(ext_args, "webhook-hosts", "127.0.0.1")

    # --- kube-scheduler: the container's command and args, plus what in-cluster defaults give ---
    sched = container(docs, "kube-scheduler")
    assert sched["command"] == ["kube-scheduler"]
    sched_args = _remap(sched["args"], mounts["kube-scheduler"])
    sched_args = _set_flag(sched_args, "secure-port", str(scheduler_port))
    sched_args = _set_flag(sched_args, "bind-address", "127.0.0.1")
    sched_args = _set_flag(sched_args, "authentication-kubeconfig", kubeconfig)
    sched_args = _set_flag(sched_args, "authorization-kubeconfig", kubeconfig)

    logs = {"extender": workdir / "extender.log", "kube-scheduler": workdir / "kube-scheduler.log"}
    leader = config["leaderElection"]
    pod = ChartPod(
        namespace=leader["resourceNamespace"],
        lease=leader["resourceName"],
        extender_url=f"{url.scheme}://127.0.0.1:{extender_port}{url.path}",
        ops_url=f"http://127.0.0.1:{ops_port}",
        scheduler_port=scheduler_port,
        logs=logs,
    )
    processes: list[subprocess.Popen[bytes]] = []
    ext_env = dict(os.environ)
    if pod_name:
        ext_env["GANG_EXTENDER_LEADER_IDENTITY"] = pod_name
    try:
        with logs["extender"].open("wb") as log:
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "app", *ext_args],
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=ext_env,
                )
            )
        wait_ready(f"{pod.ops_url}/readyz", processes[0], logs["extender"], "the extender", 60)
        argv = [str(kube_bin() / "kube-scheduler"), *sched_args]
        if pod_name:
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', pod_name, *argv]
        with logs["kube-scheduler"].open("wb") as log:
            processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        wait_ready(
            f"https://127.0.0.1:{scheduler_port}/healthz",
            processes[1],
            logs["kube-scheduler"],
            "kube-scheduler",
            60,
            # kube-scheduler's serving certificate is self-signed.
            ssl._create_unverified_context(),
        )
        pod.processes = dict(zip(("extender", "kube-scheduler"), processes, strict=True))
        yield pod
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                stop_process(process)


def local_webhook(docs: Sequence[dict[str, Any]], port: int) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration, calling run_chart_pod's extender on
    127.0.0.1:`port` (its `webhook_port`) instead of its Service.

    Everything else (rules, matchConditions, failurePolicy, the empty
    caBundle the extender fills in) stays as rendered.
    """
    configuration = copy.deepcopy(find(docs, "MutatingWebhookConfiguration"))
    for webhook in configuration["webhooks"]:
        client_config = webhook["clientConfig"]
        assert "service" in client_config, "the chart reaches its webhook through a Service"
        del client_config["service"]
        client_config["url"] = f"https://127.0.0.1:{port}{WEBHOOK_PATH}"
    return configuration


def lease_holder(kube: Kube, namespace: str, name: str) -> str | None:
    coordination: Any = k8s.CoordinationV1Api(kube.client)
    try:
        lease = coordination.read_namespaced_lease(name, namespace)
    except k8s.ApiException as err:
        if err.status == 404:
            return None
        raise
    holder: str | None = lease.spec.holder_identity
    return holder


def schedule_gang(kube: Kube, namespace: str, pod: ChartPod, size: int = 3) -> dict[str, str]:
    """A PodGroup of `size`: nothing bound while a member is missing, all bound once it exists.

    Every step needs the extender behind the chart's scheduler: the sibling
    message comes from its filter, the bindings from its bind verb, and the
    wake-up of the waiting members from its pod patches.
    """
    kube.create_podgroup(namespace, "gang", size)
    for i in range(size - 1):
        kube.create_pod(namespace, f"gang-{i}", group="gang", scheduler=SCHEDULER_NAME)

    def told_why(name: str) -> Callable[[], bool]:
        return lambda: any(SIBLINGS in e for e in kube.events(namespace, name))

    for i in range(size - 1):
        wait_for(told_why(f"gang-{i}"), 30, f"the sibling message on gang-{i}\n{pod.tail()}")
    assert kube.bound(namespace) == {}, "a member was bound before the gang was complete"
    kube.create_pod(namespace, f"gang-{size - 1}", group="gang", scheduler=SCHEDULER_NAME)
    bound: dict[str, str] = wait_for(
        lambda: len(kube.bound(namespace)) == size and kube.bound(namespace),
        30,
        f"all {size} members bound\n{pod.tail()}",
    )
    return bound
