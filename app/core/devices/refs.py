"""Which pods name each ResourceClaim and ResourceClaimTemplate, and back. Pure.

A change of a claim or template bears only on the pods naming it: the device
book (app/core/devices/book.py) recounts those and no others.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from app.core.devices.records import PodClaim

CLAIMS, TEMPLATES = "resourceclaims", "resourceclaimtemplates"


class PodRefs:
    """ "kind:namespace/name" of a claim or template -> the pods naming it, and back."""

    __slots__ = ("_by_pod", "_by_ref")

    def __init__(self) -> None:
        self._by_ref: dict[str, set[str]] = {}
        self._by_pod: dict[str, set[str]] = {}

    def point(self, key: str, namespace: str, claims: Iterable[PodClaim]) -> None:
        """Point each claim and template the pod `key` names at it; forget what it named
        before (no claims: the pod is forgotten)."""
        now = {f"{CLAIMS}:{namespace}/{c.claim}" for c in claims if c.claim}
        now |= {f"{TEMPLATES}:{namespace}/{c.template}" for c in claims if c.template}
        old = self._by_pod.pop(key, set())
        for ref in old - now:
            pods = self._by_ref.get(ref)
            if pods is not None:
                pods.discard(key)
                if not pods:
                    del self._by_ref[ref]
        for ref in now - old:
            self._by_ref.setdefault(ref, set()).add(key)
        if now:
            self._by_pod[key] = now

    def pods(self, kind: str, key: str) -> Set[str]:
        """The pods naming the claim or template `key` ("namespace/name") of `kind`."""
        return self._by_ref.get(f"{kind}:{key}", frozenset())
