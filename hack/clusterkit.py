"""Driving the local control plane and the extender from outside: tests, demo and benches.

The cluster tests, `make demo` (hack/demo.py) and the benches (bench/) all
start `hack/local-cluster`, start `python -m app serve` and wait for its
/readyz, poll the API until something shows, and read the extender's
/metrics. This module is the one place that does those things, so a change
to how the extender starts or how metrics are read is made once.

Imported as `hack.clusterkit` (hack/ is a namespace package, the repository
root is on sys.path: pytest puts it there, `python -m bench...` runs from
it, and the scripts run by path insert it). mypy checks it through its
importers: listing the file in pyproject's `files` would name it
`clusterkit`, not `hack.clusterkit`. Standard library, the kubernetes client,
prometheus-client's parser and app.core.groups (the API coordinates) only.
"""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client.parser import text_string_to_metric_families

from app.core.groups import GroupApi
from app.core.resources import MEMBER_RESOURCE, PREEMPTOR_RESOURCE

REPO = Path(__file__).resolve().parents[1]
LOCAL_CLUSTER = REPO / "hack" / "local-cluster"

# (sample name, sorted label pairs) -> value: every sample of one /metrics page.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.25
) -> Any:
    """Poll until condition() is truthy and return it; TimeoutError naming `what` when time is up.

    The condition is asked at least once, and once more at the deadline, so a
    slow condition still gets its last look.
    """
    deadline = time.monotonic() + timeout
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout:g}s waiting for {what} (last: {last!r:.500})"
            )
        time.sleep(interval)


def stop_process(process: subprocess.Popen[bytes], grace: float = 10) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds: how every helper stops what it started."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def http_text(url: str, timeout: float = 10.0, context: ssl.SSLContext | None = None) -> str:
    """GET `url` as text, ignoring *_proxy variables: everything we read is on loopback."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    with opener.open(url, timeout=timeout) as response:
        return str(response.read().decode())


def answers(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether `url` answers 200 now (a readiness probe); False while nothing listens."""
    try:
        http_text(url, 2, context)
    except OSError:  # refused, reset, timed out, or an HTTP error status
        return False
    return True


def wait_ready(
    url: str,
    process: subprocess.Popen[bytes],
    log_path: Path,
    what: str,
    timeout: float,
    context: ssl.SSLContext | None = None,
) -> None:
    """Poll `url` until it answers 200; fail at once, with the log's tail, if `process` exits."""

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(
                f"{what} exited ({process.returncode}); the end of {log_path}:\n"
                f"{log_path.read_text(errors='replace')[-4000:]}"
            )
        return answers(url, context)

    wait_for(ready, timeout, f"{what} at {url}")


def start_ready(
    command: Sequence[str],
    ready_url: str,
    log_path: Path,
    what: str,
    timeout: float,
    *,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    detach: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `command`, its output in `log_path`, and return once `ready_url` answers 200.

    How every helper starts a server of its own (the extender, the no-op Go
    extender, the bench's verb floors). `detach` starts it in its own
    session, so it outlives the caller. If it never becomes ready it is
    stopped before the error is raised.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
        )
    try:
        wait_ready(ready_url, process, log_path, what, timeout)
    except BaseException:
        if process.poll() is None:
            stop_process(process)
        raise
    return process


def start_extender(
    kubeconfig: str,
    port: int,
    log_path: Path,
    args: tuple[str, ...] | list[str] = (),
    *,
    cwd: Path = REPO,
    timeout: float = 60,
    detach: bool = False,
) -> subprocess.Popen[bytes]:
    """`python -m app serve` on 127.0.0.1:`port`, logging to `log_path`; returns once ready.

    `cwd` picks the checkout whose app/ runs: it is the working directory
    (`python -m` imports from it first) and it leads PYTHONPATH too, so the
    choice does not rest on `python -m`'s path rule alone. `detach`: the
    demo leaves it running.
    """
    pythonpath = os.environ.get("PYTHONPATH", "")
    return start_ready(
        [
            sys.executable,
            "-m",
            "app",
            "serve",
            "--kubeconfig",
            kubeconfig,
            "--port",
            str(port),
            *args,
        ],
        f"http://127.0.0.1:{port}/readyz",
        log_path,
        "the extender",
        timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(cwd), pythonpath)))},
        detach=detach,
    )


# hack/local-cluster's gang-only mode (deploy/webhook.yaml): the configuration
# the extender registers its CA in, and the webhook next to the verbs' port.
WEBHOOK_CONFIGURATION = "gang-extender"


def webhook_args(port: int) -> tuple[str, ...]:
    """Extender flags for the local cluster's webhook: HTTPS on the verbs' port + 1.

    That is where `hack/local-cluster up` points kube-apiserver by default
    (its --webhook-url); the extender makes its own certificate and writes
    its CA into the configuration; deploy/webhook.yaml's policy marks
    preemptors, which the extender then expects.
    """
    return (
        "--webhook-port",
        str(port + 1),
        "--webhook-configuration",
        WEBHOOK_CONFIGURATION,
        "--expect-marked-preemptors",
        "true",
    )


def marked_by_webhook(core: Any, namespace: str = "default", scheduler: str | None = None) -> bool:
    """Whether kube-apiserver, right now, gets a gang member marked by the webhook.

    A server-side dry run of a label-only gang member: admission runs in
    full (the webhook is called, the policy is checked), nothing is stored.
    False when the pod comes back unmarked or is refused (webhook down,
    its CA not registered yet). `scheduler`: the probe's schedulerName,
    for a webhook scoped to other schedulers than the default one.
    """
    body = pause_pod(
        "webhook-probe",
        cpu="1m",
        memory="1Mi",
        labels={
            "pod-group.scheduling.sigs.k8s.io/name": "probe",
            "pod-group.scheduling.sigs.k8s.io/min-available": "1",
        },
        spec={"schedulerName": scheduler} if scheduler else None,
    )
    return _admitted_with(core, namespace, body, MEMBER_RESOURCE)


def marked_as_preemptor(core: Any, scheduler: str | None = None) -> bool:
    """Whether kube-apiserver, right now, marks a plain pod that may preempt.

    A server-side dry run of a system-cluster-critical pod (a priority the
    API server lets only kube-system use) through the preemptor-mark
    MutatingAdmissionPolicy, which the API server loads a moment after it
    is created.
    """
    spec: dict[str, Any] = {"priorityClassName": "system-cluster-critical"}
    if scheduler:
        spec["schedulerName"] = scheduler
    body = pause_pod("preemptor-probe", cpu="1m", memory="1Mi", spec=spec)
    return _admitted_with(core, "kube-system", body, PREEMPTOR_RESOURCE)


def _admitted_with(core: Any, namespace: str, body: dict[str, Any], resource: str) -> bool:
    """Whether a server-side dry run of `body` is admitted requesting `resource`.

    Admission runs in full (webhooks called, policies applied), nothing is
    stored; a refusal counts as not marked.
    """
    try:
        pod = core.create_namespaced_pod(namespace, body, dry_run="All")
    except k8s.ApiException:
        return False
    requests = pod.spec.containers[0].resources.requests or {}
    return resource in requests


def wait_webhook_marks(core: Any, timeout: float = 30) -> None:
    """Until gang members and preemptors are marked (the gang-only mode's admission).

    The extender's CA registered and kube-apiserver calling it, and the
    preemptor-mark policy loaded.
    """
    wait_for(lambda: marked_by_webhook(core), timeout, "the webhook to mark a gang member")
    wait_for(lambda: marked_as_preemptor(core), timeout, "the policy to mark a preemptor")


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus text page, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(base_url: str, context: ssl.SSLContext | None = None) -> Samples:
    """Every sample of `base_url`/metrics (the extender's, or a component's)."""
    return parse_metrics(http_text(f"{base_url}/metrics", 5, context))


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels; 0 when it is absent (a counter not yet counted)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def sum_by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """`{value of label: sum}` of the samples named `name`, whatever their other labels."""
    out: dict[str, float] = {}
    for (sample_name, pairs), value in samples.items():
        if sample_name == name:
            key = dict(pairs).get(label, "")
            out[key] = out.get(key, 0.0) + value
    return out


def local_cluster(*args: str, env: Mapping[str, str] | None = None) -> str:
    """Run `hack/local-cluster ARGS` (state dir and ports from `env`); its stdout."""
    result = subprocess.run(
        [str(LOCAL_CLUSTER), *args], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"hack/local-cluster {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stderr[-4000:]}"
        )
    return result.stdout


def kubeconfig_of(up_output: str) -> str:
    """The kubeconfig path `hack/local-cluster up` prints as `export KUBECONFIG=...`."""
    match = re.search(r"^export KUBECONFIG=(\S+)$", up_output, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"hack/local-cluster up printed no KUBECONFIG line:\n{up_output}")
    return match.group(1)


def api_client(kubeconfig: str, pool_size: int | None = None) -> k8s.ApiClient:
    """A client for the cluster of `kubeconfig`; `pool_size` raises the connection pool.

    The pool is sized when the client is built, so it is set here, not after.
    """
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return k8s.ApiClient(configuration)


def wait_for_default_service_account(core: Any, namespace: str, timeout: float = 60) -> None:
    """A new namespace admits pods only once the controller manager gave it its ServiceAccount."""
    wait_for(
        lambda: any(
            account.metadata.name == "default"
            for account in core.list_namespaced_service_account(namespace).items
        ),
        timeout,
        f"the default ServiceAccount in {namespace}",
    )


def create_group(
    custom: Any,
    api: GroupApi,
    namespace: str,
    name: str,
    spec: Mapping[str, Any],
    annotations: Mapping[str, str] | None = None,
) -> None:
    """Create a group object of `api` (x-k8s, Volcano or native PodGroup) with this spec."""
    custom.create_namespaced_custom_object(
        api.group,
        api.version,
        namespace,
        api.plural,
        {
            "apiVersion": api.api_version,
            "kind": api.kind,
            "metadata": {"name": name}
            | ({"annotations": dict(annotations)} if annotations else {}),
            "spec": dict(spec),
        },
    )


def pause_pod(
    name: str,
    *,
    cpu: str,
    memory: str,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The pod tests, the demo's checks and the benches create: it requests `cpu`
    and `memory` and needs no kubelet (fake nodes; the pod simulator "runs" it).

    `spec` adds pod spec fields (schedulerName, nodeSelector, priorityClassName, ...).
    """
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if annotations:
        metadata["annotations"] = dict(annotations)
    # No apiVersion/kind: the body doubles as a Deployment's pod template.
    return {
        "metadata": metadata,
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
            **(spec or {}),
        },
    }
