"""Parsers of the flags whose values have a structure (app/flags.py names them per flag).

Each raises ValueError with the rule the text broke; app/config.py adds which
flag or variable the text came from.
"""

from __future__ import annotations

from collections.abc import Callable


def _weight(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 100:
        raise ValueError("must be a whole number between 0 and 100")
    return value


def url_prefix(text: str) -> str:
    prefix = "/" + text.strip().strip("/")
    if " " in prefix:
        raise ValueError("must be a URL path such as /scheduler")
    return "" if prefix == "/" else prefix


def resource_weights(text: str) -> tuple[tuple[str, int], ...]:
    pairs = []
    for item in text.split(","):
        name, sep, weight = item.strip().partition("=")
        if not sep or not name:
            raise ValueError("must look like cpu=1,memory=1,nvidia.com/gpu=4")
        try:
            pairs.append((name.strip(), _weight(weight)))
        except ValueError:
            raise ValueError(f"weight of {name.strip()!r} must be a whole number 0..100") from None
    return tuple(pairs)


def namespaced(what: str) -> Callable[[str], str]:
    """A parser of NAMESPACE/NAME of `what`."""

    def parse(text: str) -> str:
        namespace, sep, name = text.strip().partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"must be NAMESPACE/NAME of {what}")
        return f"{namespace}/{name}"

    return parse
