"""How the tool talks to its user: progress on stderr, errors with a log tail."""

from __future__ import annotations

import os
import sys
from pathlib import Path

LOG_TAIL_LINES = 30


class ClusterError(Exception):
    """A failure to report to the user: which component, and its log if any."""

    def __init__(self, message: str, log_file: Path | None = None) -> None:
        super().__init__(message)
        self.log_file = log_file


def info(message: str) -> None:
    """Progress goes to stderr so stdout carries only the `export` line."""
    print(f"local-cluster: {message}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last lines of a log file, for error messages (empty if unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
