"""Dynamic Resource Allocation (resource.k8s.io/v1) objects as slim records, and their names.

A GPU pod names ResourceClaims (or ResourceClaimTemplates); each claim asks a
DeviceClass for devices; drivers publish the devices of each node in
ResourceSlices. These records keep what counting devices needs, parsed once
when the watch delivers the object. Parsing never fails: what cannot be read
becomes an `error` shown in messages, logs and /debug/caches.

Devices are counted as ordinary resources (app/core/resources.py), in whole
devices times 1000 like every other amount:
`devices/<class>` is how many devices of a class a node offers or a pod asks
for; `devices/<class>/<digest>` the same for the devices that also pass a
request's own selectors. `devices/?/<what>` is a demand no node can meet: a
claim naming something that does not exist (the message says what).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from app.core.placement import Placement, placement_of
from app.core.resources import DEVICE_PREFIX, MISSING_PREFIX, QuantityError, parse_quantity

API_GROUP = "resource.k8s.io"
API_VERSION = "v1"
PLURALS = ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates")

ALL_MODE = "All"


def class_resource(device_class: str) -> str:
    return f"{DEVICE_PREFIX}{device_class}"


def selector_digest(selectors: tuple[str, ...]) -> str:
    """A stable short name of one selector set."""
    return hashlib.sha256("\n".join(selectors).encode()).hexdigest()[:10]


def selector_resource(device_class: str, selectors: tuple[str, ...]) -> str:
    """The resource of a class's devices that also pass `selectors` (a stable digest)."""
    return f"{DEVICE_PREFIX}{device_class}/{selector_digest(selectors)}"


def union_resource(device_class: str, group: tuple[tuple[str, ...], ...]) -> str:
    """The resource of a class's devices that pass any of several overlapping selector sets.

    Offered: how many devices pass at least one set; asked: what every request
    of any of the sets asks. Checking it for every group of overlapping sets is
    Hall's condition, so the counts fit exactly when the devices can be shared
    out (app/core/devices/counting.py).
    """
    return f"{DEVICE_PREFIX}{device_class}/" + "+".join(sorted(map(selector_digest, group)))


def missing_resource(what: str) -> str:
    return f"{MISSING_PREFIX}{what}"


class SelectorError(ValueError):
    """A selector the engine cannot evaluate: its request is counted by class instead."""


class CompileError(SelectorError):
    """A selector our library cannot compile (the API server did: a feature it lacks)."""


class EvaluationError(SelectorError):
    """A selector that fails on a device: counted by class instead, logged and in a metric."""


class SelectorEngine(Protocol):
    """Compiles and evaluates CEL device selectors (app/runtime/device_cel.py's CelEngine)."""

    def compile(self, expression: str) -> Any:
        """The compiled program; raises CompileError (SelectorError: no engine) naming why."""
        ...

    def matches(self, program: Any, device: Mapping[str, Any]) -> bool:
        """Whether the program is true for this CEL `device` value; EvaluationError if it fails."""
        ...


class NoSelectorEngine:
    """No CEL engine wired (a bare ClusterState): every selector counts by class alone."""

    def compile(self, expression: str) -> Any:
        raise SelectorError(f"CEL selector {expression!r:.120} not evaluated: no CEL engine")

    def matches(self, program: Any, device: Mapping[str, Any]) -> bool:
        return True


@dataclass(slots=True)
class Device:
    """One published device: its CEL value (`device.driver`, `.attributes`, `.capacity`)."""

    name: str
    value: dict[str, Any]
    # The value as canonical bytes: devices alike (same attributes and capacity)
    # share one evaluation of each selector (app/core/devices/counting.py).
    content: bytes = b""

    def __post_init__(self) -> None:
        if not self.content:
            self.content = orjson.dumps(self.value, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class SliceRecord:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str  # spec.nodeName ("" for node-selector or all-nodes pools)
    node_selector: Placement | None
    all_nodes: bool
    devices: tuple[Device, ...]
    error: str = ""

    @property
    def pool_key(self) -> tuple[str, str]:
        return self.driver, self.pool


@dataclass(frozen=True, slots=True)
class ClassRecord:
    name: str
    selectors: tuple[str, ...]
    extended_resource: str = ""


@dataclass(frozen=True, slots=True)
class Request:
    """One device request: `exactly`, or one `firstAvailable` alternative."""

    name: str
    device_class: str
    selectors: tuple[str, ...]
    mode: str  # ExactCount or All
    count: int
    # firstAvailable: the alternatives in order (this request's own fields unused).
    alternatives: tuple[Request, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: tuple[Request, ...]
    error: str = ""


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    namespace: str
    name: str
    spec: ClaimSpec
    # status.allocation.devices.results: (request, driver, pool, device); () = not allocated.
    allocated: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of a pod's spec.resourceClaims, with the claim generated for it, if any."""

    entry: str
    claim: str  # resourceClaimName, or the generated name from status.resourceClaimStatuses
    template: str  # resourceClaimTemplateName ("" for a named claim)


# ---- parsing ------------------------------------------------------------------------


def _meta(raw: Mapping[str, Any]) -> tuple[str, str]:
    meta = raw.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _selectors(raw: Any) -> tuple[str, ...]:
    out = []
    for item in raw or ():
        expression = (
            ((item or {}).get("cel") or {}).get("expression") if isinstance(item, Mapping) else None
        )
        if isinstance(expression, str) and expression.strip():
            out.append(expression.strip())
    return tuple(out)


def class_from(raw: Mapping[str, Any]) -> ClassRecord:
    spec = raw.get("spec") or {}
    return ClassRecord(
        _meta(raw)[1],
        _selectors(spec.get("selectors")),
        str(spec.get("extendedResourceName") or ""),
    )


def _device_value(driver: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The CEL `device` of a published device: attributes and capacity by domain."""
    attributes: dict[str, dict[str, Any]] = {}
    for qualified, value in (raw.get("attributes") or {}).items():
        domain, _sep, ident = str(qualified).rpartition("/")
        if isinstance(value, Mapping) and value:
            kind, item = next(iter(value.items()))
            attributes.setdefault(domain or driver, {})[ident] = (
                int(item) if kind == "int" else item
            )
    capacity: dict[str, dict[str, Any]] = {}
    for qualified, value in (raw.get("capacity") or {}).items():
        domain, _sep, ident = str(qualified).rpartition("/")
        amount = value.get("value") if isinstance(value, Mapping) else value
        capacity.setdefault(domain or driver, {})[ident] = parse_quantity(
            amount if isinstance(amount, str | int | float) else str(amount)
        )
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


def slice_from(raw: Mapping[str, Any]) -> SliceRecord:
    spec = raw.get("spec") or {}
    pool = spec.get("pool") or {}
    driver = str(spec.get("driver") or "")
    name = _meta(raw)[1]
    devices: list[Device] = []
    seen: set[str] = set()
    errors: list[str] = []
    for item in spec.get("devices") or ():
        device_name = str((item or {}).get("name") or "")
        if device_name in seen:
            errors.append(f"duplicate device name {device_name!r} (counted once)")
            continue
        seen.add(device_name)
        try:
            devices.append(Device(device_name, _device_value(driver, item)))
        except (QuantityError, TypeError, ValueError, AttributeError) as err:
            errors.append(f"device {device_name!r} unreadable ({err}): not counted")
    selector = spec.get("nodeSelector")
    return SliceRecord(
        name=name,
        driver=driver,
        pool=str(pool.get("name") or ""),
        generation=_int(pool.get("generation")),
        slice_count=max(1, _int(pool.get("resourceSliceCount"))),
        node=str(spec.get("nodeName") or ""),
        node_selector=_node_selector(selector) if selector else None,
        all_nodes=bool(spec.get("allNodes")),
        devices=tuple(devices),
        error=f"ResourceSlice {name}: " + "; ".join(errors) if errors else "",
    )


def _node_selector(raw: Mapping[str, Any]) -> Placement | None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": raw}}
    return placement_of({"affinity": affinity})


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _request(raw: Mapping[str, Any], name: str) -> Request:
    count = raw.get("count")
    return Request(
        name=name,
        device_class=str(raw.get("deviceClassName") or ""),
        selectors=_selectors(raw.get("selectors")),
        mode=ALL_MODE if raw.get("allocationMode") == ALL_MODE else "ExactCount",
        count=max(1, _int(count)) if count is not None else 1,
    )


def claim_spec_from(spec: Mapping[str, Any] | None, what: str = "claim") -> ClaimSpec:
    """The requests of a claim (or a template's claims); `what` names it in the error."""
    requests: list[Request] = []
    unread: list[str] = []
    for item in ((spec or {}).get("devices") or {}).get("requests") or ():
        if not isinstance(item, Mapping):
            continue
        name = str(item.get("name") or "")
        if isinstance(item.get("exactly"), Mapping):
            requests.append(_request(item["exactly"], name))
        elif item.get("firstAvailable"):
            options = tuple(
                _request(sub, f"{name}/{sub.get('name') or ''}")
                for sub in item["firstAvailable"]
                if isinstance(sub, Mapping)
            )
            if options:
                requests.append(Request(name, "", (), "ExactCount", 0, options))
        elif item.get("deviceClassName"):  # the v1beta1 shape, if a client still sends it
            requests.append(_request(item, name))
        else:
            unread.append(name)
    error = f"{what}: request(s) {', '.join(unread)} ask for no device class: not counted"
    return ClaimSpec(tuple(requests), error if unread else "")


def claim_from(raw: Mapping[str, Any]) -> ClaimRecord:
    namespace, name = _meta(raw)
    allocation = (raw.get("status") or {}).get("allocation") or {}
    results = tuple(
        (
            str(r.get("request") or ""),
            str(r.get("driver") or ""),
            str(r.get("pool") or ""),
            str(r.get("device") or ""),
        )
        for r in (allocation.get("devices") or {}).get("results") or ()
        if isinstance(r, Mapping)
    )
    spec = claim_spec_from(raw.get("spec"), f"ResourceClaim {namespace}/{name}")
    return ClaimRecord(namespace, name, spec, results)


def template_from(raw: Mapping[str, Any]) -> tuple[str, ClaimSpec]:
    """(namespace/name, the spec of the claims it generates)."""
    namespace, name = _meta(raw)
    return f"{namespace}/{name}", claim_spec_from((raw.get("spec") or {}).get("spec"))


def pod_claims_of(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[PodClaim, ...]:
    """The pod's claims (spec.resourceClaims), each with its generated claim's name once made."""
    entries = spec.get("resourceClaims")
    if not entries:
        return ()
    generated = {
        str(s.get("name") or ""): str(s.get("resourceClaimName") or "")
        for s in status.get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    claims = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        name = str(entry.get("name") or "")
        direct = str(entry.get("resourceClaimName") or "")
        template = str(entry.get("resourceClaimTemplateName") or "")
        claims.append(PodClaim(name, direct or generated.get(name, ""), "" if direct else template))
    return tuple(claims)
