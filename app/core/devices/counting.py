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
  the node advertises the name itself (a device plugin), and a claim of the
  class asks that name too, so a device is taken once whichever way a pod
  asks for it;
- a pod asks what its claims ask: per request `count` devices (`All`: as
  many as the node with most matching devices has), `firstAvailable` the
  first alternative the cluster has enough devices for; a claim that several
  pods share counts once, on the first of them by name; an allocated claim
  counts exactly what it was given.

Selector sets of one class that overlap (some device passes both) are also
counted together: per group of overlapping sets, the devices that pass any of
them are offered (`union_resource`), and every request of a set of the group
asks its count of it. A node's devices can be shared out among the requests
exactly when every such count fits (Hall's condition: each group of requests
fits in the devices any of them may take; sets that overlap with none need no
group), so two requests cannot both count the same free device.

A pool published for several nodes (nodeSelector, allNodes) is offered in full
to each node it selects, as a pod on any of them may take all of it;
app/core/devices/distinct.py counts it once for the cluster, which the
whole-gang check holds a gang's devices to (app/core/devices/shortfall.py),
and a packing draws on it once for all of a gang's members
(app/core/devices/shared.py, app/core/shared_pools.py).

Not checked (say so in docs/dra.md): constraints (matchAttribute), device
taints; kube-scheduler's DynamicResources plugin still decides the exact devices.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping

from app.core.devices.overlaps import Groups, Signature, find_groups
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
    SliceRecord,
    class_resource,
    missing_resource,
    selector_resource,
    union_resource,
)
from app.core.devices.selectors import Selectors
from app.core.resources import Resources

log = logging.getLogger(__name__)


class DeviceModel:
    def __init__(self, engine: SelectorEngine | None = None) -> None:
        # Evaluates selectors, each (selector, kind of device) once.
        self.selectors = Selectors(engine or NoSelectorEngine())
        self.classes: dict[str, ClassRecord] = {}
        self.slices: dict[str, SliceRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self.templates: dict[str, ClaimSpec] = {}
        # (class, selectors) some request uses: counted per node as a resource of its own.
        self.signatures: set[Signature] = set()
        # Selector text -> why our CEL library cannot evaluate it (counted by class instead).
        self.fallbacks: dict[str, str] = self.selectors.fallbacks
        # Class -> the groups of its selector sets that overlap (None: find anew).
        self._groups: Groups | None = None
        # Node -> the device resources it offers (devices/... and extended names).
        self.offered: dict[str, Resources] = {}
        # Claim key -> pods using it (a shared claim counts on the first, by name).
        self.users: dict[str, set[str]] = {}
        # Set by demand() when the count depended on the nodes' offers (All, firstAvailable).
        self.used_offers = False
        # Bumped by slices_changed (app/core/devices/shared.py reads the pools anew).
        self.slices_version = 0
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
        """The slices (or classes) changed: the device an allocation names is looked up
        anew, and which selector sets overlap is found anew."""
        self._index = None
        self._groups = None
        self.slices_version += 1

    def groups(self, device_class: str) -> list[tuple[tuple[str, ...], ...]]:
        """The class's groups of selector sets to count together (each of 2 sets or more).

        Two sets overlap when some published device passes both; each connected
        group of overlapping sets gives every subset of two or more of its sets
        (a subset whose sets do not overlap is implied by its parts, and is
        counted all the same: harmless). Found once per change of the slices,
        classes or selector sets; devices alike share one evaluation.
        """
        if self._groups is None:
            devices = {d.content: d for s in self.newest_slices() for d in s.devices}.values()
            self._groups = find_groups(
                self.signatures, self.classes, devices, self.selectors.passes
            )
        return self._groups.get(device_class, [])

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

        def serves(s: SliceRecord) -> bool:
            if s.node:
                return s.node == node
            return s.all_nodes or bool(s.node_selector and s.node_selector.allows(node, labels, ()))

        return unique_devices(slices, serves)

    def offer_of(self, devices: Iterable[Device]) -> Resources:
        """The device resources a node with these devices offers."""
        devices = list(devices)
        offer: Resources = {}
        for record in self.classes.values():
            count = sum(1 for d in devices if self.selectors.passes(d, record.selectors))
            if count:
                offer[class_resource(record.name)] = count * 1000
                if record.extended_resource:
                    offer[record.extended_resource] = count * 1000
        for device_class, selectors in self.signatures:
            known = self.classes.get(device_class)
            if known is None:
                continue
            both = (*known.selectors, *selectors)
            count = sum(1 for d in devices if self.selectors.passes(d, both))
            if count:
                offer[selector_resource(device_class, selectors)] = count * 1000
        for record in self.classes.values():
            groups = self.groups(record.name)
            if not groups:
                continue
            of_class = [d for d in devices if self.selectors.passes(d, record.selectors)]
            for group in groups:
                count = sum(
                    1 for d in of_class if any(self.selectors.passes(d, sel) for sel in group)
                )
                if count:
                    offer[union_resource(record.name, group)] = count * 1000
        return offer

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
        passed: set[tuple[str, ...]] = set()
        for signature_class, selectors in tuple(self.signatures):
            if signature_class != device_class:
                continue
            if self.selectors.passes(device, (*known.selectors, *selectors)):
                passed.add(selectors)
                resource = selector_resource(signature_class, selectors)
                if resource not in counted:
                    _add(need, resource, 1)
        for group in self.groups(device_class):
            resource = union_resource(device_class, group)
            if resource not in counted and passed.intersection(group):
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
        """The resources one device of the request takes: its class's, then its selectors'
        (and those of the groups of overlapping selector sets it is in).

        A selector our library cannot compile counts by class alone (Selectors says
        why): the API server compiles every selector when the object is created and
        refuses one that does not compile, so such a one is a CEL feature we lack.
        """
        known = self.classes.get(request.device_class)
        if known is None:
            return [missing_resource(f"DeviceClass {request.device_class or '(none)'} not found")]
        selectors = tuple(request.selectors)
        # A class backing an extended resource: its nodes offer the same devices under
        # that name too, so a claim takes them there as well (first: [-1] stays the
        # narrowest), and a pod asking the name cannot count them again.
        extended = [known.extended_resource] if known.extended_resource else []
        resources = [*extended, class_resource(request.device_class)]
        if selectors and all(self.selectors.compiles(text) for text in selectors):
            # Which groups it is in depends on the devices published: recounted with them.
            self.used_offers = True
            signature = (request.device_class, selectors)
            if signature not in self.signatures:
                self.signatures.add(signature)
                self._groups = None
            resources.append(selector_resource(request.device_class, selectors))
            resources.extend(
                union_resource(request.device_class, group)
                for group in self.groups(request.device_class)
                if selectors in group
            )
        return resources


def held_of(
    model: DeviceModel, claim: ClaimRecord, pool: tuple[str, str] | None = None
) -> Resources:
    """What the claim's allocated devices (of one pool, or all) hold, counted as its
    users ask (app/core/devices/shared.py, report.py): selector sets first met here
    are not kept."""
    results = tuple(r for r in claim.allocated if pool is None or (r[1], r[2]) == pool)
    if not results:
        return {}
    signatures, groups = set(model.signatures), model._groups
    need: Resources = {}
    model._claim_demand(dataclasses.replace(claim, allocated=results), need)
    if len(model.signatures) != len(signatures):
        model.signatures, model._groups = signatures, groups
    return need


def unique_devices(
    slices: Iterable[SliceRecord], serves: Callable[[SliceRecord], bool]
) -> list[Device]:
    """The devices of the slices `serves` keeps, each (driver, pool, name) once."""
    seen: set[tuple[str, str, str]] = set()
    out: list[Device] = []
    for s in slices:
        if not serves(s):
            continue
        for device in s.devices:
            key = (s.driver, s.pool, device.name)
            if key not in seen:
                seen.add(key)
                out.append(device)
    return out


def set_users(
    users: dict[str, set[str]], pod_key: str, namespace: str, claims: Iterable[PodClaim]
) -> set[str]:
    """Record the pod's named claims in `users` (DeviceModel.users); the other users
    whose count may move to or from it (a shared claim counts on its first user)."""
    keys = {f"{namespace}/{c.claim}" for c in claims if c.claim and not c.template}
    touched: set[str] = set()
    for key, pods in list(users.items()):
        if pod_key in pods and key not in keys:
            pods.discard(pod_key)
            touched |= pods
            if not pods:
                del users[key]
    for key in keys:
        pods = users.setdefault(key, set())
        if pod_key not in pods:
            touched |= pods
            pods.add(pod_key)
    touched.discard(pod_key)
    return touched


def _add(need: Resources, resource: str, count: int) -> None:
    need[resource] = need.get(resource, 0) + count * 1000
