"""The Dockerfile, checked without a Docker engine: parsed, and its build stage replayed.

The image itself cannot be built here; what can go wrong in it is checked
from the file (stages, user, entrypoint, what the final stage installs) and
by building the wheel from exactly the files the build stage copies.
tests/cluster/test_packaging.py installs such a wheel into a fresh venv and
runs it against the local cluster.
"""

from __future__ import annotations

import re
import tomllib
import zipfile
from pathlib import Path

from tests.packaging.dockerfile import (
    REPO,
    build_context,
    build_wheel,
    copy_sources,
    ignore_patterns,
    ignored,
    parse,
    wheel_command,
)

BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3?-dev|libc6?-dev|musl-dev|"
    r"setuptools|wheel|build|pip wheel)\b"
)


def test_base_images_are_slim_python_pinned_by_tag() -> None:
    stages = parse()
    assert len(stages) >= 2, "multi-stage: build the wheel, then install it"
    for stage in stages:
        repository, _, tag = stage.image.partition(":")
        assert repository == "python", stage.image
        assert re.fullmatch(r"3\.11(\.\d+)?-slim-\w+", tag), f"{stage.image}: pin a slim tag"


def test_final_stage_installs_only_the_wheel_built_in_the_first() -> None:
    build, *_, final = parse()
    assert build.name, "the build stage needs a name for COPY --from"
    out_dir = wheel_command(build)[wheel_command(build).index("--wheel-dir") + 1]
    copies = [c.words() for c in final.all("COPY")]
    assert copies == [[f"--from={build.name}", out_dir, copies[0][-1]]], (
        "the final stage copies the build stage's wheels and nothing from the context"
    )
    installs = [r.args for r in final.all("RUN") if "pip install" in r.args]
    assert len(installs) == 1
    assert f"{copies[0][-1]}/*.whl" in installs[0]
    for run in final.all("RUN"):
        assert not BUILD_TOOLS.search(run.args.replace("pip install", "")), run.args
        assert "apt-get" not in run.args and "apk " not in run.args, run.args


def test_final_stage_runs_the_console_script_as_a_numeric_non_root_user() -> None:
    final = parse()[-1]
    (user,) = final.all("USER")
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can check it"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    (entrypoint,) = final.all("ENTRYPOINT")
    (cmd,) = final.all("CMD")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint.words() == ["gang-extender"] and "gang-extender" in scripts
    assert cmd.words() == ["serve"]
    # Exec form: signals reach the process (uvicorn shuts down gracefully).
    assert entrypoint.args.startswith("[") and cmd.args.startswith("[")


def test_dockerignore_keeps_what_the_build_copies_and_drops_local_state() -> None:
    patterns = ignore_patterns()
    build = parse()[0]
    for source in copy_sources(build):
        assert (REPO / source).exists(), source
        assert not ignored(source, patterns), f".dockerignore drops {source}, which is COPYed"
    for local in (
        ".venv/bin/python",
        ".local-cluster/kubeconfig",
        ".git/config",
        "app/__pycache__/x.pyc",
    ):
        assert ignored(local, patterns), f"{local} would be sent to the Docker daemon"


def test_wheel_from_the_build_context_holds_the_app_and_its_console_script(tmp_path: Path) -> None:
    context = build_context(tmp_path / "context")
    assert not list(context.rglob("__pycache__"))
    wheel = build_wheel(tmp_path / "dist", context)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "gang-extender = app.cli:main" in archive.read(entry_points).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    modules = {n for n in names if n.startswith("app/")}
    assert modules == {p.relative_to(REPO).as_posix() for p in (REPO / "app").rglob("*.py")}
    assert not [n for n in names if n.startswith("tests/")]
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(r.replace(" ", "") for r in requires) == sorted(
        d.replace(" ", "") for d in declared
    )
