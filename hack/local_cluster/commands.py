"""The subcommands: up (reconcile), down, status, add-node, and the simulator's loop.

Each takes the `Config` the CLI built and returns the process exit code.
"""

from __future__ import annotations

import datetime as dt
import shlex
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .api import Api
from .components import (
    ALL_COMPONENTS,
    CORE_COMPONENTS,
    POD_SIMULATOR,
    SCHEDULER_COMPONENTS,
    component_ports,
)
from .layout import (
    MODE_GANG_ONLY,
    PACKAGE_DIR,
    SCHEDULER_CONFIG_TEMPLATES,
    WEBHOOK_TEMPLATE,
    WRAPPER,
    Config,
    Layout,
)
from .nodes import FAKE_NODE_LABEL, NodeShape, create_fake_node, ensure_nodes, node_counts
from .pki import certs_complete, ensure_certs, write_kubeconfigs
from .podsim import SIMULATOR_READY_LINE, PodSimulator
from .report import ClusterError, info, tail
from .scheduler_config import (
    NODELIST_SCHEDULER_NAME,
    desired_schedulers,
    render_scheduler_config,
    render_webhook,
)
from .state import digest, load_state, locked, save_state, write_if_changed
from .supervise import (
    Launcher,
    etcd_healthy,
    healthz_ok,
    is_ours,
    read_pid,
    running_pid,
    stop_all,
    stop_components,
    wait_until,
)
from .toolchain import apply_text, build_kube, install_crds, kubectl, read_versions


def _package_source() -> str:
    """The simulator's code (the wrapper and every module), to restart it after an edit."""
    paths = [WRAPPER, *sorted(PACKAGE_DIR.glob("*.py"))]
    return "".join(path.read_text() for path in paths)


@dataclass(frozen=True)
class UpOptions:
    """What `up` was asked for (recorded in state.json)."""

    nodes: int
    shape: NodeShape
    extender_url: str
    node_cache_capable: bool
    with_nodelist: bool
    pod_simulator: bool = True
    feature_gates: dict[str, bool] = field(default_factory=dict)
    scheduler: bool = True
    # gang-only (webhook + two extender entries) or every-verb; see layout.py.
    extender_mode: str = MODE_GANG_ONLY
    # gang-only: where kube-apiserver calls the extender's webhook (--webhook-port).
    webhook_url: str = ""


def core_health(
    config: Config, state: dict[str, Any], bin_dir: Path, feature_gates: dict[str, bool]
) -> str | None:
    """None if etcd, apiserver and controller-manager can be kept, else why not."""
    layout = config.layout
    if not state:
        return "no state file"
    if state.get("bin_dir") != str(bin_dir):
        return f"binaries changed ({state.get('bin_dir')} -> {bin_dir})"
    recorded = state.get("options", {}).get("feature_gates", {})
    if recorded != feature_gates:
        return f"feature gates changed ({recorded} -> {feature_gates})"
    if not certs_complete(layout):
        return "certificates are missing or incomplete"
    for name in CORE_COMPONENTS:
        if running_pid(layout, name) is None:
            return f"{name} is not running"
    api = Api(config)
    for _ in range(10):
        if api.readyz():
            return None
        time.sleep(0.5)
    return "kube-apiserver /readyz is not ok"


def cmd_up(config: Config, opts: UpOptions) -> int:
    """Bring the cluster to the requested shape, touching only what differs.

    Tests call `up` from every session fixture, so a healthy cluster must be
    reused as-is (seconds matter) while a half-dead one is rebuilt.
    """
    started_at = time.monotonic()
    layout = config.layout
    layout.ensure_dirs()
    with locked(layout):
        bin_dir = build_kube()
        kube_version = read_versions()["KUBE_VERSION"]
        state = load_state(layout)
        launcher = Launcher(config, bin_dir, dict(opts.feature_gates))
        components: dict[str, Any] = dict(state.get("components", {})) if state else {}

        why = core_health(config, state, bin_dir, opts.feature_gates)
        if why is None:
            info(
                "control plane already running and healthy; "
                "keeping etcd, kube-apiserver, kube-controller-manager"
            )
        else:
            running = [n for n in ALL_COMPONENTS if running_pid(layout, n) is not None]
            if running:
                info(f"restarting the cluster cleanly: {why}")
                for name in CORE_COMPONENTS:
                    if name not in running and layout.log(name).exists():
                        info(f"last lines of {layout.log(name)}:\n{tail(layout.log(name), 10)}")
            stop_all(layout)
            components = {}
            try:
                _start_core(config, launcher)
            except BaseException:
                info("start-up failed; stopping what was started (logs are kept)")
                stop_all(layout)
                raise
            components.update({n: {"pid": read_pid(layout, n)} for n in CORE_COMPONENTS})

        try:
            sched_changes = _reconcile_schedulers(config, launcher, opts, components)
            simulator_started = _reconcile_simulator(layout, launcher, opts, components)
        except BaseException:
            stop_components(layout, list(launcher.started))
            raise

        api = Api(config)
        state = {
            "bin_dir": str(bin_dir),
            "kube_version": kube_version,
            "state_dir": str(layout.root),
            "kubeconfig": str(layout.admin_kubeconfig),
            "ports": {n: list(component_ports(config.ports, n)) for n in ALL_COMPONENTS},
            "options": {
                "nodes": opts.nodes,
                "node_cpu": opts.shape.cpu,
                "node_memory": opts.shape.memory,
                "node_pods": opts.shape.pods,
                "extender_url": opts.extender_url,
                "node_cache_capable": opts.node_cache_capable,
                "with_nodelist_scheduler": opts.with_nodelist,
                "pod_simulator": opts.pod_simulator,
                "feature_gates": opts.feature_gates,
                "scheduler": opts.scheduler,
                "extender_mode": opts.extender_mode,
                "webhook_url": opts.webhook_url,
            },
            "components": components,
            "updated": dt.datetime.now().isoformat(timespec="seconds"),
        }
        save_state(layout, state)

        wait_until(
            "the `default` ServiceAccount in namespace default "
            "(created by kube-controller-manager)",
            lambda: (
                api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200
            ),
            90,
            launcher,
            CORE_COMPONENTS,
            "kube-controller-manager",
        )
        for spec in desired_schedulers(
            config.ports, opts.node_cache_capable, opts.with_nodelist, opts.scheduler
        ):
            wait_until(
                f"{spec.component} /healthz on port {spec.port}",
                healthz_ok(spec.port),
                60,
                launcher,
                (spec.component,),
                spec.component,
            )
        if sched_changes:
            info("scheduler(s) ready: " + ", ".join(sched_changes))

        install_crds(layout, bin_dir)
        _reconcile_webhook(layout, bin_dir, opts)
        ensure_nodes(api, opts.nodes, opts.shape, kube_version)
        if simulator_started:
            wait_until(
                "the pod simulator to list pods",
                lambda: SIMULATOR_READY_LINE in tail(layout.log(POD_SIMULATOR)),
                30,
                launcher,
                (POD_SIMULATOR,),
                POD_SIMULATOR,
            )
        ready, total = node_counts(api)
        info(
            f"cluster up in {time.monotonic() - started_at:.1f}s: {ready}/{total} nodes Ready, "
            + (
                f"extender {opts.extender_url} "
                f"(nodeCacheCapable={str(opts.node_cache_capable).lower()}, "
                f"{opts.extender_mode} mode"
                + (f", webhook {opts.webhook_url}" if opts.extender_mode == MODE_GANG_ONLY else "")
                + ")"
                if opts.scheduler
                else "no kube-scheduler (--no-scheduler)"
            )
            + (
                f", plus scheduler {NODELIST_SCHEDULER_NAME} (nodeCacheCapable=false)"
                if opts.with_nodelist
                else ""
            )
        )
        print(f"export KUBECONFIG={shlex.quote(str(layout.admin_kubeconfig))}", flush=True)
    return 0


def _start_core(config: Config, launcher: Launcher) -> None:
    """etcd -> kube-apiserver -> kube-controller-manager, each waited on in turn."""
    ports = config.ports
    ensure_certs(config.layout)
    write_kubeconfigs(config)
    launcher.start("etcd")
    wait_until(
        f"etcd /health on port {ports.etcd_client}",
        etcd_healthy(ports),
        60,
        launcher,
        ("etcd",),
        "etcd",
    )
    launcher.start("kube-apiserver")
    api = Api(config)
    wait_until(
        f"kube-apiserver /readyz on port {ports.apiserver}",
        api.readyz,
        180,
        launcher,
        ("etcd", "kube-apiserver"),
        "kube-apiserver",
    )
    info("kube-apiserver is ready")
    launcher.start("kube-controller-manager")
    wait_until(
        f"kube-controller-manager /healthz on port {ports.controller_manager}",
        healthz_ok(ports.controller_manager),
        60,
        launcher,
        CORE_COMPONENTS,
        "kube-controller-manager",
    )


def _reconcile_webhook(layout: Layout, bin_dir: Path, opts: UpOptions) -> None:
    """gang-only: apply deploy/webhook.yaml for opts.webhook_url; every-verb: remove it.

    The extender fills in the caBundle itself (--webhook-configuration
    gang-extender): server-side apply leaves a field it does not set alone.
    In every-verb mode a marked pod would find no node (no scheduler ignores
    the resource there), so the objects go.
    """
    if opts.extender_mode == MODE_GANG_ONLY:
        apply_text(layout, bin_dir, render_webhook(WEBHOOK_TEMPLATE.read_text(), opts.webhook_url))
        info(
            f"gang-only mode: webhook {opts.webhook_url}, its member-mark policy and the "
            "preemptor-mark policy applied"
        )
        return
    kubectl(
        layout,
        bin_dir,
        "delete",
        "--ignore-not-found",
        "mutatingwebhookconfiguration/gang-extender",
        "validatingadmissionpolicy/gang-extender-member-mark",
        "validatingadmissionpolicybinding/gang-extender-member-mark",
        "mutatingadmissionpolicy/gang-extender-preemptor-mark",
        "mutatingadmissionpolicybinding/gang-extender-preemptor-mark",
    )


def _reconcile_schedulers(
    config: Config, launcher: Launcher, opts: UpOptions, components: dict[str, Any]
) -> list[str]:
    """Start, restart or stop schedulers so exactly the requested ones run.

    A running scheduler is kept only if its rendered config is byte-for-byte
    what this `up` would render (extender URL, nodeCacheCapable, profile).
    """
    layout = config.layout
    changes: list[str] = []
    specs = desired_schedulers(
        config.ports, opts.node_cache_capable, opts.with_nodelist, opts.scheduler
    )
    wanted = {spec.component: spec for spec in specs}
    write_kubeconfigs(config)
    template = SCHEDULER_CONFIG_TEMPLATES[opts.extender_mode].read_text()
    for name in SCHEDULER_COMPONENTS:
        spec = wanted.get(name)
        pid = running_pid(layout, name)
        rendered = (
            render_scheduler_config(
                template, layout.kubeconfig_for("kube-scheduler"), spec, opts.extender_url
            )
            if spec
            else None
        )
        recorded = components.get(name, {}).get("config_sha256")
        if spec is None:
            if pid is not None:
                why = (
                    "--no-scheduler was given"
                    if not opts.scheduler
                    else ("--with-nodelist-scheduler was not given")
                )
                info(f"stopping {name}: {why}")
                stop_components(layout, (name,))
                changes.append(f"{name} stopped")
            components.pop(name, None)
            continue
        assert rendered is not None
        if pid is not None and recorded == digest(rendered):
            continue
        if pid is not None:
            info(f"restarting {name}: its configuration changed")
            stop_components(layout, (name,))
        write_if_changed(layout.scheduler_config(name), rendered)
        new_pid = launcher.start(name)
        components[name] = {
            "pid": new_pid,
            "scheduler_name": spec.scheduler_name,
            "node_cache_capable": spec.node_cache_capable,
            "extender_url": opts.extender_url,
            "config": str(layout.scheduler_config(name)),
            "config_sha256": digest(rendered),
        }
        changes.append(f"{name} ({spec.scheduler_name})")
    return changes


def _reconcile_simulator(
    layout: Layout, launcher: Launcher, opts: UpOptions, components: dict[str, Any]
) -> bool:
    """Run the pod simulator exactly when wanted; True if it was (re)started now.

    A running simulator is kept only if it runs the current version of this
    package, so an edit takes effect on the next `up`.
    """
    pid = running_pid(layout, POD_SIMULATOR)
    if not opts.pod_simulator:
        if pid is not None:
            info(f"stopping {POD_SIMULATOR}: --no-pod-simulator was given")
            stop_components(layout, (POD_SIMULATOR,))
        components.pop(POD_SIMULATOR, None)
        return False
    script = digest(_package_source())
    if pid is not None and components.get(POD_SIMULATOR, {}).get("script_sha256") == script:
        return False
    if pid is not None:
        info(f"restarting {POD_SIMULATOR}: hack/local_cluster changed")
        stop_components(layout, (POD_SIMULATOR,))
    components[POD_SIMULATOR] = {
        "pid": launcher.start(POD_SIMULATOR),
        "script_sha256": script,
    }
    return True


def cmd_down(config: Config) -> int:
    """Stop what `up` started and drop the etcd data, so the next `up` is empty.

    Certificates stay, so kubeconfigs handed out before remain valid.
    """
    layout = config.layout
    if not layout.root.exists():
        info(f"nothing to stop ({layout.root} does not exist)")
        return 0
    with locked(layout):
        running = [n for n in ALL_COMPONENTS if running_pid(layout, n) is not None]
        if not running:
            info("no component is running")
        stop_all(layout)
        if layout.etcd_data.exists():
            shutil.rmtree(layout.etcd_data)
            info(f"removed etcd data {layout.etcd_data} (certificates kept)")
        state = load_state(layout)
        if state:
            state["components"] = {}
            state["updated"] = dt.datetime.now().isoformat(timespec="seconds")
            save_state(layout, state)
    return 0


def cmd_status(config: Config) -> int:
    """Print component state; the exit code lets scripts branch (0 up, 1 degraded, 3 down)."""
    layout = config.layout
    state = load_state(layout)
    expected = [
        *CORE_COMPONENTS,
        *(
            n
            for n in (*SCHEDULER_COMPONENTS, POD_SIMULATOR)
            if n in state.get("components", {}) or layout.pid_file(n).exists()
        ),
    ]
    if "kube-scheduler" not in expected and state.get("options", {}).get("scheduler", True):
        expected.insert(3, "kube-scheduler")
    running = 0
    for name in expected:
        pid = read_pid(layout, name)
        alive = pid is not None and is_ours(layout, name, pid)
        running += alive
        pid_text = str(pid) if pid is not None else "-"
        print(f"{name:<26} {'running' if alive else 'stopped':<8} pid {pid_text}")
    ready_text, nodes_text, api_ok = "unreachable", "unknown", False
    if certs_complete(layout):
        api = Api(config)
        api_ok = api.readyz()
        if api_ok:
            ready_text = "ok"
            try:
                ready, total = node_counts(api)
                nodes_text = f"{ready} Ready / {total} total"
            except (ClusterError, OSError) as err:
                nodes_text = f"error: {err}"
    print(f"{'apiserver readyz':<26} {ready_text}")
    print(f"{'nodes':<26} {nodes_text}")
    if running:
        print(f"{'kubeconfig':<26} {layout.admin_kubeconfig}")
    if running == len(expected) and api_ok:
        return 0
    if running == 0:
        return 3
    return 1


def cmd_add_node(config: Config, name: str, shape: NodeShape) -> int:
    """Add one fake node, e.g. with a zone label for topology tests."""
    layout = config.layout
    if not certs_complete(layout) or running_pid(layout, "kube-apiserver") is None:
        raise ClusterError("the cluster is not running; start it with `hack/local-cluster up`")
    api = Api(config)
    if not api.readyz():
        raise ClusterError("kube-apiserver is not ready", layout.log("kube-apiserver"))
    create_fake_node(api, name, shape, read_versions()["KUBE_VERSION"])
    extra = "".join(f", {k}={v}" for k, v in shape.labels.items())
    info(
        f"added fake node {name} (cpu={shape.cpu}, memory={shape.memory}, pods={shape.pods}{extra})"
    )
    return 0


def cmd_simulate_pods(config: Config) -> int:
    """The pod-simulator component's main loop (started by `up`, stopped by `down`)."""
    layout = config.layout

    def log(message: str) -> None:
        stamp = dt.datetime.now().isoformat(timespec="milliseconds")
        print(f"{stamp} pod-simulator: {message}", flush=True)

    if not certs_complete(layout):
        raise ClusterError(f"no certificates in {layout.certs}: run `hack/local-cluster up` first")
    log(f"playing the kubelet for nodes labelled {FAKE_NODE_LABEL[0]}={FAKE_NODE_LABEL[1]}")
    PodSimulator(Api(config), log).run(threading.Event())
    return 0
