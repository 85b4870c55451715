"""Kubernetes resource quantities and the arithmetic the admission rules need.

Quantities are kept as integers in milli-units ("1" CPU is 1000, "1Ki" memory
is 1024000) so that sums and comparisons are exact: a gang check that says a
group fits must never be off by a rounding error.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

Resources = dict[str, int]
"""Resource name -> amount in milli-units."""

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


# Far beyond any real capacity (an exabyte is 1e18), small enough to stay cheap.
_MAX_QUANTITY = Decimal("1e30")


class QuantityError(ValueError):
    """A quantity string that Kubernetes itself would not accept."""


def parse_quantity(value: str | int | float) -> int:
    """Parse a Kubernetes quantity ("500m", "2Gi", "1e3", 4) into milli-units.

    Fractions of a milli-unit round up, as the API server does for requests.
    """
    if isinstance(value, str):
        return _parse_string(value)
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}: expected a number or a string like '2Gi'")
    if isinstance(value, int | float):
        number = Decimal(str(value))
        if not number.is_finite():
            raise QuantityError(f"invalid quantity {value!r}: not a finite number")
    else:
        raise QuantityError(f"invalid quantity {value!r}: expected a number or a string like '2Gi'")
    return _milli(number, value)


@functools.lru_cache(maxsize=4096)
def _parse_string(value: str) -> int:
    """Cached: every pod event re-reads its requests, and a cluster uses few distinct strings."""
    return _milli(_parse_text(value.strip()), value)


def _milli(number: Decimal, value: object) -> int:
    if abs(number) > _MAX_QUANTITY:
        # "1e999999999" would otherwise become an integer of a billion digits.
        raise QuantityError(f"invalid quantity {value!r}: larger than 1e30")
    return int((number * 1000).to_integral_value(rounding=ROUND_CEILING))


_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?\d+))?$"
)


def _parse_text(text: str) -> Decimal:
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(
            f"invalid quantity {text!r}: expected a number with an optional suffix "
            "such as m, k, M, G, Ki, Mi, Gi"
        )
    number = Decimal(match["number"])
    if match["binary"]:
        return number * _BINARY[match["binary"]]
    if match["decimal"]:
        return number * _DECIMAL[match["decimal"]]
    if match["exponent"]:
        # Clamped: scaleb beyond the context's range raises, and any exponent
        # past +-40 is far outside _MAX_QUANTITY either way.
        exponent = max(-40, min(40, int(match["exponent"])))
        return number.scaleb(exponent)
    return number


def parse_resource_list(raw: Mapping[str, Any] | None) -> Resources:
    """Parse a ResourceList ({"cpu": "2", "memory": "1Gi"}) into milli-units."""
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise QuantityError(f"expected a map of resource names to quantities, got {raw!r:.80}")
    return {str(name): parse_quantity(amount) for name, amount in raw.items()}


def add(total: Resources, extra: Mapping[str, int]) -> None:
    """Add `extra` into `total` in place."""
    for name, amount in extra.items():
        total[name] = total.get(name, 0) + amount


def subtract(total: Resources, extra: Mapping[str, int]) -> None:
    """Subtract `extra` from `total` in place, dropping names that reach zero."""
    for name, amount in extra.items():
        left = total.get(name, 0) - amount
        if left:
            total[name] = left
        else:
            total.pop(name, None)


def total_of(items: Iterable[Mapping[str, int]]) -> Resources:
    result: Resources = {}
    for item in items:
        add(result, item)
    return result


def fits(need: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """Whether `free` covers `need`: not shortfall(), without building the gap.

    First fit asks it of every full node it passes, a thousand gangs per admission.
    """
    for name, amount in need.items():  # noqa: SIM110 (a loop, not all() over a generator: hot)
        if amount > free.get(name, 0):
            return False
    return True


def shortfall(need: Mapping[str, int], free: Mapping[str, int]) -> Resources:
    """What is missing from `free` to cover `need` (only the positive gaps)."""
    gaps: Resources = {}
    for name, amount in need.items():
        missing = amount - free.get(name, 0)
        if missing > 0:
            gaps[name] = missing
    return gaps


def format_amount(name: str, milli: int) -> str:
    """Render an amount for people: cpu in cores/millicores, bytes with binary units."""
    if name == "cpu" or milli % 1000:
        if milli % 1000 == 0:
            return str(milli // 1000)
        return f"{milli}m"
    whole = milli // 1000
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        for suffix, factor in reversed(_BINARY.items()):
            if whole >= factor and whole % factor == 0:
                return f"{whole // factor}{suffix}"
    return str(whole)


def format_resources(resources: Mapping[str, int]) -> str:
    """ "cpu 2, memory 1Gi, 4 device(s) of class gpu.example.com" in a stable order, for people.

    A device count under a request's selectors is left out when its class's
    count is there too (the class's says it; the digest means nothing to people).
    """
    parts = []
    for name, amount in sorted(resources.items()):
        text = format_amount(name, amount)
        if name.startswith(DEVICE_PREFIX):
            device_class, _sep, digest = name[len(DEVICE_PREFIX) :].partition("/")
            if (
                digest
                and not name.startswith(MISSING_PREFIX)
                and (DEVICE_PREFIX + device_class in resources)
            ):
                continue
            parts.append(describe_device_resource(name, text))
        else:
            parts.append(f"{name} {text}")
    return ", ".join(parts)


# DRA devices counted as resources (app/core/devices/records.py): `devices/<class>`,
# `devices/<class>/<digest of selectors>`, and `devices/?/<what is missing>`.
DEVICE_PREFIX = "devices/"
MISSING_PREFIX = "devices/?/"


def describe_device_resource(name: str, amount: str) -> str:
    """How a message shows a device entry ("2 device(s) of class gpu.example.com")."""
    if name.startswith(MISSING_PREFIX):
        return name[len(MISSING_PREFIX) :]
    device_class, _sep, digest = name[len(DEVICE_PREFIX) :].partition("/")
    text = f"{amount} device(s) of class {device_class}"
    return f"{text} passing its request's selectors" if digest else text


# The gang-only mode's member mark (app/core/marking.py): kube-scheduler ignores it
# (ignoredByScheduler) and the kubelet drops it, and no node advertises it,
# so capacity checks here leave it out as well.
MEMBER_RESOURCE = "gang-extender.dev/member"
# The optional preemptor mark (--webhook-mark-preemptors): the same, on plain
# pods that may evict others, so that the preempt-only extender entry can
# name it and leave every other plain pod alone.
PREEMPTOR_RESOURCE = "gang-extender.dev/preemptor"


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """Effective requests of a pod, the way kube-scheduler's NodeResourcesFit counts them.

    Sum of the app containers and of restartable (sidecar) init containers,
    at least the largest regular init container (plus the sidecars started
    before it), plus the pod overhead; every pod also takes one "pods" slot.
    """
    containers: Resources = {}
    for container in spec.get("containers") or ():
        add(containers, _container_requests(container))

    init_max: Resources = {}
    sidecars: Resources = {}
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            add(sidecars, requests)
            add(containers, requests)
            continue
        # A regular init container runs beside the sidecars started before it.
        running = dict(sidecars)
        add(running, requests)
        for name, amount in running.items():
            init_max[name] = max(init_max.get(name, 0), amount)

    effective = dict(containers)
    for name, amount in init_max.items():
        effective[name] = max(effective.get(name, 0), amount)
    add(effective, parse_resource_list(spec.get("overhead")))
    effective.pop(MEMBER_RESOURCE, None)
    effective.pop(PREEMPTOR_RESOURCE, None)
    effective["pods"] = effective.get("pods", 0) + 1000
    return effective


def _container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    requests = parse_resource_list(resources.get("requests"))
    # The API server defaults requests to limits; repeat it for objects that
    # never went through defaulting (e.g. a NodeList a test builds by hand).
    for name, amount in parse_resource_list(resources.get("limits")).items():
        requests.setdefault(name, amount)
    return requests
