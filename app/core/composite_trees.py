"""Kubernetes' CompositePodGroup trees kept as the watches deliver them. Pure.

ClusterState (through app/core/composite_state.py) feeds the book the
CompositePodGroups the watch delivers (when the API server serves them:
app/kube/discovery.py) and the leaf PodGroups, and `kubectl gang` one read of
them; CompositeBook says which root each leaf's pods belong to and what
each root's gang asks for (app/core/composite.py reads the objects and builds
the tree). A pod keeps pointing at its leaf; its GroupRef names the root with
the leaf as its `task`, so the tree's named sub-groups place it the way KAI's
subGroups are placed (app/core/kai.py, app/core/topology/subgroups.py). A
tree that cannot be used (a cycle, a missing parent, a tree deeper than four,
minGroupCount above the children) holds its pods with the message naming the
object: the leaf's own key when no root is reached, else the root's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.composite import (
    CompositeError,
    GroupNode,
    composite_gang,
    composite_spec,
    node_from,
    root_of,
)
from app.core.groups import SOURCE_NATIVE, GroupRef, GroupSpec, group_key
from app.core.records import PodGroupRecord, parse_timestamp


@dataclass(frozen=True, slots=True)
class RootRecord:
    """A tree's gang under its root's key: its spec, or why the tree cannot be used."""

    name: str
    uid: str
    created: float
    spec: GroupSpec | None
    error: str | None


@dataclass(slots=True)
class _Namespace:
    # CompositePodGroups and leaf PodGroups by name; (uid, created) of each composite.
    composites: dict[str, GroupNode] = field(default_factory=dict)
    leaves: dict[str, GroupNode] = field(default_factory=dict)
    meta: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Objects that cannot be read: why, by name (their trees are held with it).
    bad_composites: dict[str, str] = field(default_factory=dict)
    bad_leaves: dict[str, str] = field(default_factory=dict)
    # What resolve() found: leaf -> root, leaf -> why its tree cannot be used, root -> gang.
    roots: dict[str, str] = field(default_factory=dict)
    leaf_errors: dict[str, str] = field(default_factory=dict)
    records: dict[str, RootRecord] = field(default_factory=dict)


def _parent_of(raw: Mapping[str, Any]) -> str:
    spec = raw.get("spec")
    parent = spec.get("parentCompositePodGroupName") if isinstance(spec, Mapping) else None
    return parent if isinstance(parent, str) else ""


def tree_member_ref(namespace: str, root: str, leaf: str) -> GroupRef:
    """The pointer of a leaf's pod at its tree's gang: the root's key, the leaf as task."""
    return GroupRef(namespace, root, source=SOURCE_NATIVE, task=leaf, composite=True)


class CompositeBook:
    """Every namespace's CompositePodGroup trees: which root each leaf's pods join, and the
    gang (or the error) of each root. Pure: ClusterState applies what it answers."""

    def __init__(self) -> None:
        self._spaces: dict[str, _Namespace] = {}

    @classmethod
    def of(
        cls, composites: Iterable[Mapping[str, Any]], podgroups: Iterable[Mapping[str, Any]]
    ) -> CompositeBook:
        """The trees of one read of the objects (`kubectl gang`), resolved."""
        book = cls()
        for raw in composites:
            book.set_composite(namespace_of(raw), raw, created_of(raw))
        for raw in podgroups:
            book.set_leaf(namespace_of(raw), raw)
        for namespace in book.namespaces():
            book.resolve(namespace)
        return book

    def root_record(self, raw: Mapping[str, Any]) -> PodGroupRecord | None:
        """The gang record of a CompositePodGroup that is a tree's root (None: it is not)."""
        name = str((raw.get("metadata") or {}).get("name") or "")
        return self.gang_record(namespace_of(raw), name)

    def gang_record(self, namespace: str, name: str) -> PodGroupRecord | None:
        """The root `name`'s gang as the state keeps group objects (None: no such root)."""
        root = self.records(namespace).get(name)
        return _gang_record(namespace, root) if root is not None else None

    def gang_records(self, namespace: str) -> list[PodGroupRecord]:
        """Every root's gang in the namespace, as the state keeps group objects."""
        return [_gang_record(namespace, root) for root in self.records(namespace).values()]

    def _space(self, namespace: str) -> _Namespace:
        space = self._spaces.get(namespace)
        if space is None:
            space = self._spaces[namespace] = _Namespace()
        return space

    def set_composite(self, namespace: str, raw: Mapping[str, Any], created: float) -> None:
        """A CompositePodGroup as delivered; one that cannot be read is kept (with its
        parent, so its tree is found) and the leaves below it are held with its error."""
        space = self._space(namespace)
        meta = raw.get("metadata") or {}
        name = str(meta.get("name") or "")
        space.meta[name] = (str(meta.get("uid") or ""), created)
        space.bad_composites.pop(name, None)
        try:
            space.composites[name] = node_from(raw, leaf=False)
        except CompositeError as err:
            space.composites[name] = GroupNode(name, _parent_of(raw), False, None, None)
            space.bad_composites[name] = str(err)

    def drop_composite(self, namespace: str, name: str) -> None:
        space = self._space(namespace)
        space.composites.pop(name, None)
        space.meta.pop(name, None)
        space.bad_composites.pop(name, None)

    def set_leaf(self, namespace: str, raw: Mapping[str, Any]) -> bool:
        """A v1beta1 PodGroup: True when it is a leaf of a tree (it names a parent)."""
        name = str((raw.get("metadata") or {}).get("name") or "")
        parent = _parent_of(raw)
        if not parent:
            self.drop_leaf(namespace, name)
            return False
        space = self._space(namespace)
        space.bad_leaves.pop(name, None)
        try:
            space.leaves[name] = node_from(raw, leaf=True)
        except CompositeError as err:
            space.leaves[name] = GroupNode(name, parent, True, None, None)
            space.bad_leaves[name] = str(err)
        return True

    def drop_leaf(self, namespace: str, name: str) -> None:
        space = self._spaces.get(namespace)
        if space is not None:
            space.leaves.pop(name, None)
            space.bad_leaves.pop(name, None)

    def clear(self, leaves: bool) -> None:
        """Forget every leaf (leaves True) or every CompositePodGroup, before a relist."""
        for space in self._spaces.values():
            if leaves:
                space.leaves.clear()
                space.bad_leaves.clear()
            else:
                space.composites.clear()
                space.meta.clear()
                space.bad_composites.clear()

    def namespaces(self) -> list[str]:
        return list(self._spaces)

    def leaf_names(self, namespace: str) -> list[str]:
        space = self._spaces.get(namespace)
        return list(space.leaves) if space is not None else []

    def count(self) -> int:
        """CompositePodGroups known (the reflector's size)."""
        return sum(len(space.composites) for space in self._spaces.values())

    def root_of(self, namespace: str, leaf: str) -> str | None:
        """The root whose gang the leaf's pods join; None: no tree (or an invalid one)."""
        space = self._spaces.get(namespace)
        return space.roots.get(leaf) if space is not None else None

    def leaf_errors(self, namespace: str) -> Mapping[str, str]:
        """Why each leaf whose tree cannot be used is held (its pods keep the leaf's key)."""
        space = self._spaces.get(namespace)
        return space.leaf_errors if space is not None else {}

    def records(self, namespace: str) -> Mapping[str, RootRecord]:
        """Each root's gang (or why it cannot be used) by root name."""
        space = self._spaces.get(namespace)
        return space.records if space is not None else {}

    def rekey(self, ref: GroupRef | None) -> GroupRef | None:
        """A native pointer at a leaf as a pointer at its root's gang (the leaf as task)."""
        if ref is None or ref.source != SOURCE_NATIVE or ref.task:
            return ref
        space = self._spaces.get(ref.namespace)
        root = space.roots.get(ref.name) if space is not None else None
        if root is None:
            return ref
        return tree_member_ref(ref.namespace, root, ref.name)

    def resolve(self, namespace: str) -> dict[str, tuple[str | None, str | None]]:
        """Recompute the namespace's trees; returns the leaves whose root changed:
        leaf -> (old root, new root), None for none."""
        space = self._space(namespace)
        roots: dict[str, str] = {}
        errors: dict[str, str] = {}
        for name, leaf in space.leaves.items():
            if name in space.bad_leaves:
                errors[name] = space.bad_leaves[name]
                continue
            try:
                chain = root_of(name, space.composites, leaf.parent)
            except CompositeError as err:
                errors[name] = str(err)
                continue
            broken = next(
                (space.bad_composites[n] for n in chain if n in space.bad_composites), None
            )
            if broken is not None:
                errors[name] = broken
                continue
            roots[name] = chain[0]
        usable = [n for n in space.leaves.values() if n.name in roots]
        records = {
            root: self._root_record(namespace, space, root, usable)
            for root in sorted(set(roots.values()))
        }
        changed = {
            leaf: (space.roots.get(leaf), roots.get(leaf))
            for leaf in {*space.roots, *roots}
            if space.roots.get(leaf) != roots.get(leaf)
        }
        space.roots, space.leaf_errors, space.records = roots, errors, records
        if not (space.composites or space.leaves):
            del self._spaces[namespace]
        return changed

    @staticmethod
    def _root_record(
        namespace: str, space: _Namespace, root: str, leaves: list[GroupNode]
    ) -> RootRecord:
        uid, created = space.meta.get(root, ("", 0.0))
        key = group_key(SOURCE_NATIVE, namespace, root, composite=True)
        try:
            gang = composite_gang(root, space.composites, leaves, ())
        except CompositeError as err:
            return RootRecord(root, uid, created, None, f"CompositePodGroup tree {key}: {err}")
        return RootRecord(root, uid, created, composite_spec(key, gang), None)


def _gang_record(namespace: str, root: RootRecord) -> PodGroupRecord:
    return PodGroupRecord(
        namespace,
        root.name,
        root.uid,
        root.spec,
        root.error,
        SOURCE_NATIVE,
        root.created,
        composite=True,
    )


def namespace_of(raw: Mapping[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("namespace") or "default")


def created_of(raw: Mapping[str, Any]) -> float:
    return parse_timestamp((raw.get("metadata") or {}).get("creationTimestamp"))
