"""Structured logging: one JSON object per line, with pod/podgroup/node/verb/queue keys.

Call sites pass context as `extra={"pod": ..., "podgroup": ...}`; the
formatter lifts those keys into the object so log pipelines can filter by
gang without parsing messages.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

CONTEXT_KEYS = ("pod", "podgroup", "node", "verb", "reason", "queue")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(
            f"{key}={getattr(record, key)}"
            for key in CONTEXT_KEYS
            if getattr(record, key, None) is not None
        )
        line = f"{self.formatTime(record)} {record.levelname:<7} {record.getMessage()}"
        if context:
            line += f"  [{context}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str, fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log duplicates our per-verb metrics; keep its errors only.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("asyncio").setLevel(logging.INFO)
