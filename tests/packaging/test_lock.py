"""Pinned dependencies: the lock files, and that make install, CI and the image use them."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from tests.packaging.dockerfile import REPO, copy_sources, parse

LOCK = REPO / "requirements.lock"
DEV_LOCK = REPO / "requirements-dev.lock"
# name==version, an optional environment marker (uvloop: not on Windows), then the hashes.
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(?: ; [^\\]+)? \\$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version; every requirement must be pinned with == and carry hashes."""
    found: dict[str, str] = {}
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        if not line or line.startswith((" ", "#")):
            continue
        match = REQUIREMENT.match(line)
        assert match, f"{path.name}: not an exact pin with hashes: {line!r}"
        assert lines[index + 1].strip().startswith("--hash=sha256:"), f"{line}: no hash"
        found[canonical(match[1])] = match[2]
    return found


def declared(extra: str | None = None) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {canonical(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requirements}


def test_locks_pin_every_declared_dependency_with_hashes() -> None:
    runtime, dev = pins(LOCK), pins(DEV_LOCK)
    missing = declared() - set(runtime)
    assert not missing, f"requirements.lock lacks {missing}: run `make lock`"
    missing = (declared() | declared("dev")) - set(dev)
    assert not missing, f"requirements-dev.lock lacks {missing}: run `make lock`"
    # One set of versions: the runtime lock is compiled under the dev lock's constraints.
    assert {n: v for n, v in dev.items() if n in runtime} == runtime
    assert "pip-audit" in dev and "hypothesis" in dev and "pip-tools" in dev


def test_image_installs_the_runtime_lock_with_hashes_then_the_wheel_alone() -> None:
    build, *_, final = parse()
    assert "requirements.lock" in copy_sources(build)
    (install,) = [r.args for r in final.all("RUN") if "pip install" in r.args]
    assert re.search(r"--require-hashes -r \S*/requirements\.lock", install), install
    assert re.search(r"--no-deps \S*/\*\.whl", install), install


def test_make_install_and_ci_install_from_the_dev_lock() -> None:
    # -W: as if pyproject.toml changed, so make prints the venv recipe.
    result = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", ".venv/.installed"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--require-hashes -r requirements-dev.lock" in result.stdout
    assert "pip install -q --no-deps -e ." in result.stdout
    assert "make test" in (REPO / ".ci" / "run").read_text()
    test_target = next(
        line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("test:")
    )
    assert " audit " in test_target, "make test runs pip-audit on the lock"
