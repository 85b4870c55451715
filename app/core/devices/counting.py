"""The cluster's DRA devices counted as resources: what each node offers, what each pod asks.

Devices become ordinary entries of the resource vectors the rest of the
project already counts (app/core/devices/records.py names them), so whole-gang
feasibility, packing, the claims of gangs in line, preemption and queues see
them without paths of their own:

- a node offers, per DeviceClass, the devices of the newest generation of
  each pool published for it that pass the class's selectors
  (`devices/<class>`), and per selector set some request uses, those that
  pass it too (`devices/<class>/<digest>`); a DeviceClass with
  `extendedResourceName` also offers its devices under that name, unless
  the node advertises the name itself (a device plugin);
- a pod asks what its claims ask: per request `count` devices (`All`: as
  many as the node with most matching devices has), `firstAvailable` the
  first alternative the cluster has enough devices for; a claim that several
  pods share counts once, on the first of them by name; an allocated claim
  counts exactly what it was given.

Where this is not exact (say so in docs/dra.md): a pool published for
several nodes (nodeSelector, allNodes) is offered in full to each node it
selects, two selector sets of one class that overlap are counted apart, and
constraints (matchAttribute) and device taints are not checked;
kube-scheduler's DynamicResources plugin still decides the exact devices.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from app.core.devices.records import (
    ALL_MODE,
    ClaimRecord,
    ClaimSpec,
    ClassRecord,
    Device,
    NoSelectorEngine,
    PodClaim,
    Request,
    SelectorEngine,
    SelectorError,
    SliceRecord,
    class_resource,
    missing_resource,
    selector_resource,
)
from app.core.resources import Resources

log = logging.getLogger(__name__)

# Distinct (selector, device) pairs remembered: a cluster's devices are mostly
# alike (8 GPUs of one model a node), so this holds every pair many times over.
_MAX_RESULTS = 100_000


class DeviceModel:
    def __init__(self, engine: SelectorEngine | None = None) -> None:
        self.engine: SelectorEngine = engine or NoSelectorEngine()
        self.classes: dict[str, ClassRecord] = {}
        self.slices: dict[str, SliceRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self.templates: dict[str, ClaimSpec] = {}
        # (class, selectors) some request uses: counted per node as a resource of its own.
        self.signatures: set[tuple[str, tuple[str, ...]]] = set()
        # Selector text -> why our CEL library cannot evaluate it (counted by class instead).
        self.fallbacks: dict[str, str] = {}
        # Node -> the device resources it offers (devices/... and extended names).
        self.offered: dict[str, Resources] = {}
        # Claim key -> pods using it (a shared claim counts on the first, by name).
        self.users: dict[str, set[str]] = {}
        # Set by demand() when the count depended on the nodes' offers (All, firstAvailable).
        self.used_offers = False
        # (selector, device content) -> whether it passes: identical devices are evaluated once.
        self._results: dict[tuple[str, bytes], bool] = {}
        # (driver, pool, device) -> the device, in the newest generation (None: build anew).
        self._index: dict[tuple[str, str, str], Device] | None = None

    # ---- what the nodes offer ---------------------------------------------------

    def newest_slices(self) -> list[SliceRecord]:
        """The slices of each pool's newest generation: older ones are being replaced."""
        newest: dict[tuple[str, str], int] = {}
        for s in self.slices.values():
            newest[s.pool_key] = max(newest.get(s.pool_key, s.generation), s.generation)
        return [s for s in self.slices.values() if s.generation == newest[s.pool_key]]

    def slices_changed(self) -> None:
        """The slices changed: the device an allocation names is looked up anew."""
        self._index = None

    def device(self, driver: str, pool: str, name: str) -> Device | None:
        """A published device by the names a claim's allocation gives it."""
        if self._index is None:
            self._index = {
                (s.driver, s.pool, d.name): d for s in self.newest_slices() for d in s.devices
            }
        return self._index.get((driver, pool, name))

    def devices_for(
        self, node: str, labels: Mapping[str, str], slices: Iterable[SliceRecord]
    ) -> list[Device]:
        """The devices a node can use, each device of a pool once (duplicates are not counted)."""
        seen: set[tuple[str, str, str]] = set()
        out: list[Device] = []
        for s in slices:
            if s.node:
                if s.node != node:
                    continue
            elif not (
                s.all_nodes or (s.node_selector and s.node_selector.allows(node, labels, ()))
            ):
                continue
            for device in s.devices:
                key = (s.driver, s.pool, device.name)
                if key not in seen:
                    seen.add(key)
                    out.append(device)
        return out

    def offer_of(self, devices: Iterable[Device]) -> Resources:
        """The device resources a node with these devices offers."""
        devices = list(devices)
        offer: Resources = {}
        for record in self.classes.values():
            count = sum(1 for d in devices if self._passes(d, record.selectors))
            if count:
                offer[class_resource(record.name)] = count * 1000
                if record.extended_resource:
                    offer[record.extended_resource] = count * 1000
        for device_class, selectors in self.signatures:
            known = self.classes.get(device_class)
            if known is None:
                continue
            both = (*known.selectors, *selectors)
            count = sum(1 for d in devices if self._passes(d, both))
            if count:
                offer[selector_resource(device_class, selectors)] = count * 1000
        return offer

    def _passes(self, device: Device, selectors: tuple[str, ...]) -> bool:
        for text in selectors:
            result = self._results.get((text, device.content))
            if result is None:
                try:
                    result = self.engine.matches(self.engine.compile(text), device.value)
                except SelectorError as err:
                    self._fallback(text, str(err))
                    result = True  # counted by class alone
                if len(self._results) > _MAX_RESULTS:
                    self._results.clear()
                self._results[(text, device.content)] = result
            if not result:
                return False
        return True

    def _fallback(self, text: str, why: str) -> None:
        if text not in self.fallbacks:
            log.warning("%s; its devices are counted by class alone", why)
            self.fallbacks[text] = why

    def most_on_one_node(self, resource: str) -> int:
        return max((offer.get(resource, 0) for offer in self.offered.values()), default=0)

    def in_cluster(self, resource: str) -> int:
        return sum(offer.get(resource, 0) for offer in self.offered.values())

    # ---- what the pods ask ------------------------------------------------------

    def demand(self, namespace: str, pod_key: str, claims: Iterable[PodClaim]) -> Resources:
        """The device resources a pod asks for through its claims (app/core/devices/records.py)."""
        need: Resources = {}
        for pod_claim in claims:
            claim = self.claims.get(f"{namespace}/{pod_claim.claim}") if pod_claim.claim else None
            if claim is not None:
                if (
                    not pod_claim.template
                    and min(self.users.get(claim.key) or {pod_key}) != pod_key
                ):
                    continue  # a shared claim: its first user counts it
                self._claim_demand(claim, need)
                continue
            if pod_claim.template:
                spec = self.templates.get(f"{namespace}/{pod_claim.template}")
                if spec is None:
                    what = f"ResourceClaimTemplate {namespace}/{pod_claim.template} not found"
                    _add(need, missing_resource(what), 1)
                else:
                    self._spec_demand(spec, need)
            else:
                what = f"ResourceClaim {namespace}/{pod_claim.claim or pod_claim.entry} not found"
                _add(need, missing_resource(what), 1)
        return need

    def _claim_demand(self, claim: ClaimRecord, need: Resources) -> None:
        if not claim.allocated:
            self._spec_demand(claim.spec, need)
            return
        # Allocated: exactly the devices it holds, each under its request's resources and
        # under every other selector set of its class the device passes: a held 80Gi
        # device is no longer free for a request asking at least 40Gi either.
        by_request = {r.name: r for r in claim.spec.requests}
        for request_name, driver, pool, device_name in claim.allocated:
            top, _sep, sub = request_name.partition("/")
            request = by_request.get(top)
            if request is not None and sub:
                request = next((a for a in request.alternatives if a.name == request_name), None)
            if request is not None and not request.alternatives:
                counted = self._resources_of(request)
                for resource in counted:
                    _add(need, resource, 1)
                self._also_held(request.device_class, counted, (driver, pool, device_name), need)

    def _also_held(
        self, device_class: str, counted: list[str], names: tuple[str, str, str], need: Resources
    ) -> None:
        """Count a held device under the other selector sets of its class that it passes."""
        # What is counted depends on the slices and on the selector sets asked for:
        # the book recounts the pod when either changes.
        self.used_offers = True
        known = self.classes.get(device_class)
        device = self.device(*names)
        if known is None or device is None:
            return
        for signature_class, selectors in tuple(self.signatures):
            resource = selector_resource(signature_class, selectors)
            if signature_class != device_class or resource in counted:
                continue
            if self._passes(device, (*known.selectors, *selectors)):
                _add(need, resource, 1)

    def _spec_demand(self, spec: ClaimSpec, need: Resources) -> None:
        for request in spec.requests:
            if request.alternatives or request.mode == ALL_MODE:
                self.used_offers = True
            chosen = self._choose(request) if request.alternatives else request
            resources = self._resources_of(chosen)
            if chosen.mode == ALL_MODE:
                count = max(1, self.most_on_one_node(resources[-1]) // 1000)
            else:
                count = chosen.count
            for resource in resources:
                _add(need, resource, count)

    def _choose(self, request: Request) -> Request:
        """firstAvailable: the first alternative the cluster has enough devices for."""
        for option in request.alternatives:
            resource = self._resources_of(option)[-1]
            if option.device_class in self.classes and (
                self.in_cluster(resource) >= option.count * 1000
            ):
                return option
        return request.alternatives[0]

    def _resources_of(self, request: Request) -> list[str]:
        """The resources one device of the request takes: its class's, then its selectors'."""
        if request.device_class not in self.classes:
            return [missing_resource(f"DeviceClass {request.device_class or '(none)'} not found")]
        resources = [class_resource(request.device_class)]
        selectors = tuple(request.selectors)
        usable = all(self._compiles(text) for text in selectors)
        if selectors and usable:
            self.signatures.add((request.device_class, selectors))
            resources.append(selector_resource(request.device_class, selectors))
        return resources

    def _compiles(self, text: str) -> bool:
        try:
            self.engine.compile(text)
        except SelectorError as err:
            self._fallback(text, str(err))
            return False
        return True

    # ---- who uses a claim -------------------------------------------------------

    def set_users(self, pod_key: str, namespace: str, claims: Iterable[PodClaim]) -> set[str]:
        """Record the pod's named claims; the other users whose count may move to or from it."""
        keys = {f"{namespace}/{c.claim}" for c in claims if c.claim and not c.template}
        touched: set[str] = set()
        for key, users in list(self.users.items()):
            if pod_key in users and key not in keys:
                users.discard(pod_key)
                touched |= users
                if not users:
                    del self.users[key]
        for key in keys:
            users = self.users.setdefault(key, set())
            if pod_key not in users:
                touched |= users
                users.add(pod_key)
        touched.discard(pod_key)
        return touched


def _add(need: Resources, resource: str, count: int) -> None:
    need[resource] = need.get(resource, 0) + count * 1000
