"""Bad requests for every verb, from a seeded random generator.

One generator serves two tests: tests/unit/test_bad_input.py drives it from
Hypothesis (which shrinks a failing case to a small one) against the app in
process, and tests/cluster/test_faults.py replays a few thousand seeds
against the live extender. A request starts from a valid one of its verb
(so the mutation reaches the code behind the decoder) and is then damaged:
a field replaced by any JSON value or deleted, the body truncated, replaced
by random bytes or by any JSON value, or sent with a wrong method or path.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from app.core.groups import LIGHT_MIN_AVAILABLE_LABEL, LIGHT_NAME_LABEL, POD_GROUP_LABEL

VERBS = ("filter", "prioritize", "preempt", "bind")
PREFIX = "/scheduler"


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    body: bytes
    # What was done to it, for the failure message.
    what: str

    @property
    def verb(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def _pod(rng: random.Random) -> dict[str, Any]:
    labels: dict[str, str] = {}
    kind = rng.randrange(3)
    if kind == 1:
        labels[POD_GROUP_LABEL] = rng.choice(["g", "missing", ""])
    elif kind == 2:
        labels[LIGHT_NAME_LABEL] = "light"
        labels[LIGHT_MIN_AVAILABLE_LABEL] = rng.choice(["2", "0", "-1", "x", "9" * 30])
    return {
        "metadata": {
            "name": f"fuzz-{rng.randrange(1000)}",
            "namespace": "fuzz",
            "uid": f"uid-{rng.randrange(1000)}",
            "labels": labels,
        },
        "spec": {
            "priority": rng.choice([0, 10, -5]),
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
            ],
        },
    }


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {}},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }


def valid_request(verb: str, rng: random.Random, nodes: list[str]) -> dict[str, Any]:
    """A request as kube-scheduler would send it (for pods that do not exist)."""
    if verb in ("filter", "prioritize"):
        if rng.random() < 0.5:
            return {"Pod": _pod(rng), "NodeNames": list(nodes), "Nodes": None}
        return {"Pod": _pod(rng), "Nodes": {"items": [_node(n) for n in nodes]}}
    if verb == "preempt":
        uids = [f"victim-{i}" for i in range(rng.randrange(3))]
        key = rng.choice(["NodeNameToMetaVictims", "NodeNameToVictims"])
        pods: list[dict[str, Any]] = (
            [{"UID": uid} for uid in uids]
            if key == "NodeNameToMetaVictims"
            else [{"metadata": {"uid": uid}} for uid in uids]
        )
        victims = {"Pods": pods, "NumPDBViolations": 0}
        return {"Pod": _pod(rng), key: {n: victims for n in nodes}}
    return {
        "PodName": f"fuzz-{rng.randrange(1000)}",
        "PodNamespace": "fuzz-absent",
        "PodUID": f"uid-{rng.randrange(1000)}",
        "Node": rng.choice(nodes) if nodes else "n1",
    }


def any_json(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON value, biased toward the shapes that break decoders."""
    choice = rng.randrange(11 if depth < 3 else 8)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**63), 10**400, rng.randrange(-100, 100)])
    if choice == 3:
        return rng.choice([0.5, -1e308, 1e308, float("nan"), float("inf"), 1e-300])
    if choice == 4:
        return rng.choice(["", "x", "1e999999999", "9" * 5000, "\u0000\ud7ff\uffff", "-1", "2Gi"])
    if choice == 5:
        return "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(20)))
    if choice == 6:
        return rng.choice([[], {}, [None], {"": None}])
    if choice == 7:
        return "a" * rng.choice([1, 300, 70000])
    if choice in (8, 9):
        keys = ["metadata", "spec", "items", "Pods", "name", "uid", "labels", "x"]
        return {rng.choice(keys): any_json(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [any_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (keys and list indexes)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, (*prefix, index)))
    return found


def _replace(document: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    if not path:
        return value
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return document


def fuzz_request(rng: random.Random, nodes: list[str] | None = None) -> FuzzRequest:
    """One bad (or occasionally valid) request, fully determined by `rng`."""
    nodes = nodes if nodes is not None else ["n1", "n2"]
    verb = rng.choice(VERBS)
    path = f"{PREFIX}/{verb}"
    document = valid_request(verb, rng, nodes)
    kind = rng.randrange(9)
    if kind <= 2:
        target = rng.choice(_paths(document))
        value = any_json(rng)
        delete = bool(target) and rng.random() < 0.3
        document = _replace(document, target, value, delete)
        what = f"{'deleted' if delete else 'replaced'} {list(target)} in a {verb} request"
        return FuzzRequest("POST", path, _dump(document), what)
    if kind == 3:
        body = _dump(document)
        cut = rng.randrange(len(body))
        return FuzzRequest("POST", path, body[:cut], f"{verb} request cut at byte {cut}")
    if kind == 4:
        size = rng.choice([0, 1, 17, 300])
        return FuzzRequest("POST", path, rng.randbytes(size), f"{size} random bytes to {verb}")
    if kind == 5:
        return FuzzRequest("POST", path, _dump(any_json(rng)), f"any JSON value to {verb}")
    if kind == 6:
        method = rng.choice(["GET", "PUT", "DELETE", "PATCH"])
        return FuzzRequest(method, path, _dump(document), f"{method} {path}")
    if kind == 7:
        wrong = rng.choice([f"{PREFIX}/{verb}s", f"{PREFIX}/", f"/{verb}", f"{PREFIX}/bind/x"])
        return FuzzRequest("POST", wrong, _dump(document), f"POST to unknown path {wrong}")
    return FuzzRequest("POST", path, _dump(document), f"valid {verb} request")


def _dump(document: Any) -> bytes:
    # Python's json writes NaN and Infinity, which Go's encoding/json would never send.
    return json.dumps(document).encode()
