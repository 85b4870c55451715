"""Where the benchmarks' JSON results go, and what run a result came from.

`make bench` has each script write its figures to bench/results/<name>.json
(`--json`); those files are committed with the figures BENCHMARKS.md shows,
so that `make bench-plots` (bench/plots.py) can redraw the plots from them
without running anything. A script run by hand writes no JSON unless told
to: a reduced run must not replace the published figures by accident.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hack.clusterkit import REPO

RESULTS = REPO / "bench" / "results"
"""The committed JSON of the current figures, one file per benchmark."""

CONTENTION_JSON = RESULTS / "contention.json"
LINE_JSON = RESULTS / "line.json"
LINE_BLOCKED_JSON = RESULTS / "line-blocked.json"
E2E_JSON = RESULTS / "e2e.json"


def commit() -> str:
    """This checkout's commit, with -dirty when app/ (the code measured) had changes not
    committed; edits elsewhere (documents, other benchmarks) do not change a figure."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
        )

    try:
        head = git("rev-parse", "--short=7", "HEAD")
        changed = git("diff", "--quiet", "HEAD", "--", "app").returncode != 0
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if changed else "")


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (what a figure was measured on)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def machine_description() -> str:
    """Architecture, CPU model, CPU count (nproc) and memory of this machine."""
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()} {cpu_model()}, {os.cpu_count()} CPUs, {mem_gb:.0f} GiB"


def run_info(command: str) -> dict[str, str]:
    """When, where and from what a result was measured: what BENCHMARKS.md states beside it."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": f"{machine_description()}, Python {platform.python_version()}",
        "command": command,
    }


def write_json(path: str | Path, figures: Mapping[str, Any]) -> None:
    """`figures` as indented JSON at `path`, its directory made if need be."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(figures, indent=2, default=str) + "\n")
