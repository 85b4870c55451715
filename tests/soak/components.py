"""Putting the session's kube-scheduler or extender behind a slow relay, and back.

kube-scheduler reads its API server from the kubeconfig its rendered
configuration names (`clientConnection.kubeconfig`). It is restarted with the
same command line and the same configuration path, the path's content
pointing at a copy of its kubeconfig whose server is the relay; so
`hack/local-cluster up` still recognises it as the cluster's own (it checks
the command line) and leaves it running. `restore` puts the rendered
configuration back and restarts it directly connected.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

from hack.clusterkit import local_cluster, wait_for
from tests.cluster.session import CLUSTER_DIR, PORT_OFFSET, UP_ARGS, Extender

APISERVER_PORT = 16443 + PORT_OFFSET
SCHEDULER = "kube-scheduler"


def relayed_kubeconfig(source: Path, relay_port: int, into: Path) -> Path:
    """A copy of `source` whose every cluster's server is the relay on 127.0.0.1."""
    config = yaml.safe_load(source.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{relay_port}"
    into.write_text(yaml.safe_dump(config))
    return into


def pid_of(component: str) -> int:
    return int((CLUSTER_DIR / "pids" / f"{component}.pid").read_text().strip())


def _alive(pid: int) -> bool:
    """Does the process, or any thread of it, still run (and may still hold its ports)?

    A zombie thread-group leader is not enough: under load its other threads may
    still be exiting, and the files they share, the listening sockets among them, are
    closed only when the last one is done. A kube-scheduler started again at that
    moment failed "bind: address already in use" and the soak ran on without one
    (seed 51, two sessions at once on 2 CPUs).
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return False
    return ") Z " not in stat or threads > 1


def kill_component(component: str) -> list[str]:
    """SIGKILL a control-plane component; its command line, to start it again."""
    pid = pid_of(component)
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 30, f"{component} gone")
    return argv


def start_component(component: str, argv: list[str]) -> int:
    """Start it again with that command line, logging and recorded as hack/local-cluster does."""
    with (CLUSTER_DIR / "logs" / f"{component}.log").open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=CLUSTER_DIR,
            start_new_session=True,
        )
    (CLUSTER_DIR / "pids" / f"{component}.pid").write_text(f"{process.pid}\n")
    return process.pid


def port_free(port: int) -> bool:
    """Can a new process listen on 127.0.0.1:`port` (the old one's socket is gone)?"""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def dump_scheduler_cache() -> str:
    """Ask kube-scheduler to write its cache, its queue and their differences from its
    informers to its log (SIGUSR2: pkg/scheduler/backend/cache/debugger, v1.37.2): what it
    believed when an invariant broke. Returns a line for the violation's text."""
    try:
        os.kill(pid_of(SCHEDULER), signal.SIGUSR2)
    except (OSError, ValueError) as error:
        return f"kube-scheduler's cache not dumped: {error}"
    return "kube-scheduler's cache and queue dumped to its log (SIGUSR2)"


def restart_component(component: str) -> None:
    """SIGKILL it and start it again at once, with the same command line."""
    start_component(component, kill_component(component))


def restore_cluster() -> None:
    """`up` with the session's arguments restarts whatever died, keeps the rest."""
    local_cluster("up", *UP_ARGS)


@contextlib.contextmanager
def scheduler_behind(relay_port: int) -> Iterator[None]:
    """kube-scheduler talks to the API server through the relay until the block ends."""
    config_path = CLUSTER_DIR / f"{SCHEDULER}-config.yaml"
    rendered = config_path.read_text()
    config = yaml.safe_load(rendered)
    direct = Path(config["clientConnection"]["kubeconfig"])
    slow = relayed_kubeconfig(direct, relay_port, CLUSTER_DIR / f"{SCHEDULER}-relayed.kubeconfig")
    config["clientConnection"]["kubeconfig"] = str(slow)
    argv = kill_component(SCHEDULER)
    try:
        config_path.write_text(yaml.safe_dump(config))
        start_component(SCHEDULER, argv)
        yield
    finally:
        config_path.write_text(rendered)
        with contextlib.suppress(Exception):
            kill_component(SCHEDULER)
        restore_cluster()


@contextlib.contextmanager
def extender_behind(extender: Extender, relay_port: int) -> Iterator[None]:
    """The extender restarted with a kubeconfig through the relay; back to direct afterwards."""
    direct = extender.kubeconfig
    extender.kubeconfig = str(
        relayed_kubeconfig(Path(direct), relay_port, CLUSTER_DIR / "extender-relayed.kubeconfig")
    )
    try:
        extender.restart(*extender.extra_args)
        yield
    finally:
        extender.kubeconfig = direct
        extender.restart(*extender.extra_args)
