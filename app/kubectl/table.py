"""Columns as kubectl prints them: upper-case headers, three spaces apart, ages like `5m12s`.

Colour only on a terminal (and never with NO_COLOR set, https://no-color.org):
a piped or redirected output is plain text a script can cut.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

GAP = "   "
_RESET = "\033[0m"
_COLOURS = {"green": "\033[32m", "yellow": "\033[33m", "red": "\033[31m", "bold": "\033[1m"}
# Phases of every source (x-k8s, Volcano, the extender's own) and member states.
_PHASE_COLOURS = {
    "Running": "green",
    "Scheduling": "green",
    "Finished": "green",
    "Completed": "green",
    "Bound": "green",
    "Pending": "yellow",
    "PreScheduling": "yellow",
    "Inqueue": "yellow",
    "Reserved": "yellow",
    "Gated": "yellow",
    "Failed": "red",
    "Unknown": "red",
}


def use_colour(mode: str, stream: TextIO) -> bool:
    """--color auto (a terminal, NO_COLOR unset), always or never."""
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


def paint(text: str, colour: str | None, on: bool) -> str:
    if not on or colour is None:
        return text
    return f"{_COLOURS[colour]}{text}{_RESET}"


def phase_colour(phase: str) -> str | None:
    return _PHASE_COLOURS.get(phase)


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    colour: bool = False,
    colour_column: str | None = None,
    header: bool = True,
) -> str:
    """Aligned columns (widths from the plain text, so colour never shifts them)."""
    table = [list(headers), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    painted = headers.index(colour_column) if colour_column in headers else -1
    lines = []
    for n, row in enumerate(table if header else table[1:]):
        cells = []
        for i, cell in enumerate(row):
            padded = cell if i == len(row) - 1 else cell.ljust(widths[i])
            if (n > 0 or not header) and i == painted:
                padded = paint(padded, phase_colour(cell), colour)
            cells.append(padded)
        lines.append(GAP.join(cells).rstrip())
    return "\n".join(lines)


def human_age(seconds: float) -> str:
    """kubectl's duration.HumanDuration: 45s, 5m12s, 3h, 2d4h, 90d, 3y."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // (24 * 365), (hours // 24) % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // (24 * 365)}y"


def age(created: float, now: float) -> str:
    return human_age(now - created) if created > 0 else "<unknown>"


def clip(text: str, limit: int) -> str:
    """One line, at most `limit` characters (the wide output shows it whole)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
