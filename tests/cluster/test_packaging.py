"""The wheel the image installs, installed into a fresh venv and run against the cluster.

This is the image's second stage without Docker: the wheel is built from
exactly what the Dockerfile's build stage copies, installed with its
dependencies as pinned in requirements.lock into an empty venv, and the console
script (the image's ENTRYPOINT) is run from there, not from the checkout.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

import app
from hack.clusterkit import answers, stop_process, wait_for
from tests.cluster.chart_pod import free_port
from tests.packaging.dockerfile import build_context, build_wheel, parse


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a fresh venv holding only the wheel and its dependencies."""
    root = tmp_path_factory.mktemp("image")
    wheel = build_wheel(root / "dist", build_context(root / "context"))
    env = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    # As the image's final stage: the pinned runtime lock with hashes, then the wheel alone.
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
    lock = Path(__file__).resolve().parents[2] / "requirements.lock"
    for args in (["--require-hashes", "-r", str(lock)], ["--no-deps", str(wheel)]):
        result = subprocess.run([*pip, *args], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"pip install {' '.join(args)} failed:\n{result.stderr}"
    return env / "bin"


def run(command: list[str], cwd: Path) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stderr}"
    return result.stdout


def test_console_script_of_the_image_answers_help(installed: Path, tmp_path: Path) -> None:
    entrypoint = parse()[-1].all("ENTRYPOINT")[0].words()
    script = str(installed / entrypoint[0])
    assert "serve" in run([script, "--help"], tmp_path)
    serve_help = run([script, "serve", "--help"], tmp_path)
    for flag in ("--tls-client-ca-file", "--ops-port", "--max-permit-waiting-time-seconds"):
        assert flag in serve_help
    assert run([script, "--version"], tmp_path).strip() == f"gang-extender {app.__version__}"
    # The code comes from the wheel in the venv, not from this checkout.
    where = run([str(installed / "python"), "-c", "import app; print(app.__file__)"], tmp_path)
    assert where.startswith(str(installed.parent)) and sys.prefix not in where


@pytest.fixture
def served(installed: Path, kubeconfig: str, tmp_path: Path) -> Iterator[str]:
    port, ops_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(installed / "gang-extender"),
                "serve",
                "--kubeconfig",
                kubeconfig,
                "--port",
                str(port),
                "--ops-port",
                str(ops_port),
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{ops_port}"
    finally:
        stop_process(process)
        if process.returncode not in (0, -15):
            pytest.fail(f"serve exited {process.returncode}:\n{log.read_text()[-3000:]}")


def test_installed_wheel_serves_and_becomes_ready(served: str) -> None:
    wait_for(lambda: answers(f"{served}/readyz"), 60, "/readyz of the installed gang-extender")
    with urllib.request.urlopen(f"{served}/metrics", timeout=5) as response:
        assert b"gang_extender_cache_objects" in response.read()
