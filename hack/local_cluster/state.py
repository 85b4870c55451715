"""What `up` recorded (state.json), the lock around it, and atomic file writes."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .layout import Layout


@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """Serialize up/down/add-node so parallel test workers cannot race."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with layout.lock_file.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_if_changed(path: Path, content: str, mode: int = 0o644) -> bool:
    """Atomic write that leaves the file alone when the content is the same.

    Readers (tests holding KUBECONFIG) never see a half-written file.
    """
    try:
        if path.read_text() == content:
            return False
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(content)
    tmp.chmod(mode)
    tmp.replace(path)
    return True


def load_state(layout: Layout) -> dict[str, Any]:
    """The JSON record of what `up` started with which options ({} if none)."""
    try:
        data = json.loads(layout.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_state(layout: Layout, state: dict[str, Any]) -> None:
    write_if_changed(layout.state_file, json.dumps(state, indent=2, sort_keys=True) + "\n")


def digest(text: str) -> str:
    """What state.json records to tell whether a running process is still current."""
    return hashlib.sha256(text.encode()).hexdigest()
