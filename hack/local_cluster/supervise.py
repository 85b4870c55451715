"""Start, recognise, wait on and stop the cluster's background processes.

A process counts as "ours" only if its /proc command line says so (see
`is_ours`), so pid files can never make us signal a stranger.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .api import http_get, insecure_context
from .components import (
    COMPONENT_BINARY,
    POD_SIMULATOR,
    SCHEDULER_COMPONENTS,
    SIMULATE_COMMAND,
    component_argv,
    component_ports,
)
from .layout import HACK_DIR, HOST, Config, Layout, Ports
from .report import ClusterError, info

STOP_GRACE_SECONDS = 15.0


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


def read_pid(layout: Layout, name: str) -> int | None:
    try:
        return int(layout.pid_file(name).read_text().strip())
    except (OSError, ValueError):
        return None


def is_ours(layout: Layout, name: str, pid: int) -> bool:
    """True if pid is alive and really is this component of this cluster.

    argv[0] must be the expected binary and the command line must mention our
    state directory (every component's flags do), so a recycled pid or the
    same binary run by someone else is never mistaken for ours.
    """
    argv = _cmdline(pid)  # empty for dead and zombie processes
    if name == POD_SIMULATOR:
        # <python> -B <this checkout's hack/...> simulate-pods --state-dir=<root> ...
        return (
            bool(argv)
            and any(arg.startswith(f"{HACK_DIR}/") for arg in argv[1:])
            and SIMULATE_COMMAND in argv[1:]
            and f"--state-dir={layout.root}" in argv[1:]
        )
    if not argv or Path(argv[0]).name != COMPONENT_BINARY[name]:
        return False
    if not any(str(layout.root) in arg for arg in argv[1:]):
        return False
    if name in SCHEDULER_COMPONENTS:
        return f"--config={layout.scheduler_config(name)}" in argv[1:]
    return True


def running_pid(layout: Layout, name: str) -> int | None:
    pid = read_pid(layout, name)
    return pid if pid is not None and is_ours(layout, name, pid) else None


def _reap(pid: int) -> None:
    """Collect a child we started in this invocation so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


@dataclass
class Launcher:
    """Starts components in the background and remembers them for error reports."""

    config: Config
    bin_dir: Path
    feature_gates: dict[str, bool] = field(default_factory=dict)
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str) -> int:
        layout = self.config.layout
        busy = [p for p in component_ports(self.config.ports, name) if not port_free(p)]
        if busy:
            raise ClusterError(
                f"cannot start {name}: port(s) {', '.join(map(str, busy))} on {HOST} "
                "already in use by another process (not started by this cluster; see `ss -ltnp`)"
            )
        argv = component_argv(self.config, self.bin_dir, name, self.feature_gates)
        log_path = layout.log(name)
        if log_path.exists() and log_path.stat().st_size:
            # The previous run's log is evidence (a test that restarts kube-scheduler
            # must not erase what it logged before): kept once, as <name>.previous.log.
            log_path.replace(log_path.with_name(f"{name}.previous.log"))
        with log_path.open("wb") as log:
            stamp = dt.datetime.now().isoformat(timespec="seconds")
            log.write(f"# {stamp} local-cluster started: {shlex.join(argv)}\n".encode())
            log.flush()
            # A new session detaches the process from our terminal/process
            # group, so it survives this script and Ctrl-C in the shell.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=layout.root,
                start_new_session=True,
                close_fds=True,
            )
        self.started[name] = proc
        layout.pid_file(name).write_text(f"{proc.pid}\n")
        # Popen returns as soon as exec begins; for a few ms the kernel still
        # shows an empty /proc/<pid>/cmdline (large binaries widen the gap),
        # which is_ours() would read as "not running". Wait it out.
        deadline = time.monotonic() + 5
        while not _cmdline(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        info(f"started {name} (pid {proc.pid}, log {log_path})")
        return proc.pid

    def check_alive(self, name: str, waiting_for: str) -> None:
        """Fail fast, with the log, if a component died while we wait on it."""
        layout = self.config.layout
        pid = read_pid(layout, name)
        if pid is not None and is_ours(layout, name, pid):
            return
        proc = self.started.get(name)
        code = proc.poll() if proc is not None else None
        how = f"exited with code {code}" if code is not None else "is not running"
        raise ClusterError(f"{name} {how} while waiting for {waiting_for}", layout.log(name))


def stop_components(layout: Layout, names: Sequence[str]) -> None:
    """SIGTERM the given components (only if really ours), SIGKILL stragglers."""
    targets: dict[str, int] = {}
    for name in names:
        pid = read_pid(layout, name)
        if pid is None:
            layout.pid_file(name).unlink(missing_ok=True)
            continue
        if is_ours(layout, name, pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            targets[name] = pid
        else:
            _reap(pid)
            layout.pid_file(name).unlink(missing_ok=True)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while targets and time.monotonic() < deadline:
        for name, pid in list(targets.items()):
            _reap(pid)
            if not is_ours(layout, name, pid):
                info(f"stopped {name} (pid {pid})")
                del targets[name]
                layout.pid_file(name).unlink(missing_ok=True)
        if targets:
            time.sleep(0.2)
    for name, pid in targets.items():
        info(f"{name} (pid {pid}) ignored SIGTERM for {STOP_GRACE_SECONDS:.0f}s; sending SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            _reap(pid)
            if not is_ours(layout, name, pid):
                break
            time.sleep(0.1)
        else:
            raise ClusterError(f"{name} (pid {pid}) survived SIGKILL")
        layout.pid_file(name).unlink(missing_ok=True)


def stop_all(layout: Layout) -> None:
    """Stop clients before servers so shutdown logs stay free of noise."""
    stop_components(layout, (POD_SIMULATOR, *SCHEDULER_COMPONENTS, "kube-controller-manager"))
    stop_components(layout, ("kube-apiserver",))
    stop_components(layout, ("etcd",))


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    launcher: Launcher | None = None,
    watch: Sequence[str] = (),
    log_of: str | None = None,
) -> None:
    """Poll check() until true; fail early if a watched component dies."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        if launcher is not None:
            for name in watch:
                launcher.check_alive(name, what)
        try:
            if check():
                return
        except (OSError, ssl.SSLError, ValueError) as err:
            last_error = f" (last error: {err})"
        if time.monotonic() >= deadline:
            log_file = (
                launcher.config.layout.log(log_of) if launcher is not None and log_of else None
            )
            raise ClusterError(
                f"timed out after {timeout:.0f}s waiting for {what}{last_error}", log_file
            )
        time.sleep(0.5)


def healthz_ok(port: int) -> Callable[[], bool]:
    """Probe for controller-manager/scheduler; /healthz needs no credentials."""

    def check() -> bool:
        status, body = http_get(f"https://{HOST}:{port}/healthz", insecure_context())
        return status == 200 and body.strip() == "ok"

    return check


def etcd_healthy(ports: Ports) -> Callable[[], bool]:
    """Probe for etcd's /health on its client port."""

    def check() -> bool:
        status, body = http_get(f"http://{HOST}:{ports.etcd_client}/health")
        return status == 200 and json.loads(body).get("health") == "true"

    return check
