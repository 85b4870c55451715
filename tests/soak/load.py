"""Load beside the system under test: CPU-burning loops and threads keeping the API server busy.

Both are bounded: each burner is a child process that exits by itself after
`seconds` (and is killed when the block ends), and the API load threads stop
when the block ends. They only touch what they create (a namespace of their
own) and read the rest.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

from kubernetes.client.exceptions import ApiException

from hack.clusterkit import stop_process
from tests.cluster.kube import Kube

_BURN = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)


@contextlib.contextmanager
def cpu_burners(count: int, seconds: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` processes spinning on a CPU each, for at most `seconds`."""
    burners = [subprocess.Popen([sys.executable, "-c", _BURN, str(seconds)]) for _ in range(count)]
    try:
        yield burners
    finally:
        for burner in burners:
            stop_process(burner, grace=2)


class ApiLoad:
    """Threads listing every pod and writing and deleting ConfigMaps in a namespace of their own."""

    def __init__(self, kube: Kube, threads: int) -> None:
        self.kube = kube
        self.threads = threads
        self.namespace = f"soak-api-load-{uuid.uuid4().hex[:5]}"
        self.calls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> ApiLoad:
        self.kube.core.create_namespace({"metadata": {"name": self.namespace}})
        for i in range(self.threads):
            worker = threading.Thread(target=self._work, args=(i,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(10)
        with contextlib.suppress(ApiException):
            self.kube.core.delete_namespace(self.namespace)

    def _work(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                if index % 2 == 0:
                    self.kube.core.list_pod_for_all_namespaces()
                else:
                    name = f"load-{index}-{n}"
                    self.kube.core.create_namespaced_config_map(
                        self.namespace, {"metadata": {"name": name}, "data": {"x": "y" * 2000}}
                    )
                    self.kube.core.delete_namespaced_config_map(name, self.namespace)
                with self._lock:
                    self.calls += 1
            except Exception:  # the API server may be restarting: count it, keep going
                with self._lock:
                    self.errors += 1
                time.sleep(0.5)


@contextlib.contextmanager
def api_load(kube: Kube, threads: int) -> Iterator[ApiLoad]:
    load = ApiLoad(kube, threads).start()
    try:
        yield load
    finally:
        load.stop()
