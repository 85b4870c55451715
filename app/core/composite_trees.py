"""Kubernetes' CompositePodGroup trees kept as the watches deliver them. Pure.

ClusterState feeds CompositeTrees the CompositePodGroups the watch delivers
(when the API server serves them: app/kube/discovery.py) and the leaf
PodGroups; CompositeBook says which root each leaf's pods belong to and what
each root's gang asks for (app/core/composite.py reads the objects and builds
the tree). A pod keeps pointing at its leaf; its GroupRef names the root with
the leaf as its `task`, so the tree's named sub-groups place it the way KAI's
subGroups are placed (app/core/kai.py, app/core/topology/subgroups.py). A
tree that cannot be used (a cycle, a missing parent, a tree deeper than four,
minGroupCount above the children) holds its pods with the message naming the
object: the leaf's own key when no root is reached, else the root's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.changes import ChangeLog
from app.core.composite import (
    CompositeError,
    GroupNode,
    composite_gang,
    composite_spec,
    node_from,
    root_of,
)
from app.core.groups import SOURCE_NATIVE, GroupRef, GroupSpec, PodGroupSpecError, group_key
from app.core.pod_index import PodIndex
from app.core.records import PodGroupRecord, PodRecord, parse_timestamp, pod_record_from


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


class CompositeBook:
    """Every namespace's CompositePodGroup trees: which root each leaf's pods join, and the
    gang (or the error) of each root. Pure: ClusterState applies what it answers."""

    def __init__(self) -> None:
        self._spaces: dict[str, _Namespace] = {}

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
        return GroupRef(ref.namespace, root, source=SOURCE_NATIVE, task=ref.name)

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
        key = group_key(SOURCE_NATIVE, namespace, root)
        try:
            gang = composite_gang(root, space.composites, leaves, ())
        except CompositeError as err:
            return RootRecord(root, uid, created, None, f"CompositePodGroup tree {key}: {err}")
        return RootRecord(root, uid, created, composite_spec(key, gang), None)


class CompositeTrees:
    """The trees ClusterState keeps: each root's record in its `podgroups` and each leaf's
    pods keyed under their root's gang, as CompositePodGroups and leaves come and go.

    Off (`watched` False) until start-up finds the API served (app/kube/discovery.py):
    a PodGroup naming a parent is then a flat native PodGroup, as before.
    """

    def __init__(
        self,
        changes: ChangeLog,
        pods: PodIndex,
        store: Callable[[PodRecord], None],
        podgroups: Callable[[], dict[str, PodGroupRecord]],
    ) -> None:
        self.book = CompositeBook()
        self.watched = False
        self._changes = changes
        self._pods = pods
        self._store = store
        self._podgroups = podgroups
        # The root keys of the records the trees put in `podgroups`.
        self._keys: set[str] = set()
        self._listeners: list[Callable[[str], None]] = []

    def rekey(self, ref: GroupRef | None) -> GroupRef | None:
        """A pod's pointer as the state keys it (a leaf's pod: its tree's root)."""
        return self.book.rekey(ref) if self.watched else ref

    def check_leaf(self, ref: GroupRef) -> None:
        """PodGroupSpecError when `ref` names a leaf whose tree cannot be used."""
        if not self.watched or ref.source != SOURCE_NATIVE or ref.task:
            return
        error = self.book.leaf_errors(ref.namespace).get(ref.name)
        if error is not None:
            raise PodGroupSpecError(f"PodGroup {ref.key} cannot be scheduled: {error}")

    def problem(self, ref: GroupRef) -> str | None:
        """Why the tree a member's pointer leads to cannot be used (None: it can, or the
        pointer is no tree's): the leaf's error, else its root's."""
        if not self.watched or ref.source != SOURCE_NATIVE:
            return None
        try:
            self.check_leaf(ref)
        except PodGroupSpecError as err:
            return str(err)
        if not ref.task:
            return None
        root = self.book.records(ref.namespace).get(ref.name)
        return root.error if root is not None else None

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """`listener(group key)` whenever the tree behind a leaf's or root's key changed."""
        self._listeners.append(listener)

    def pod_record(self, raw: Mapping[str, Any], sources: frozenset[str]) -> PodRecord:
        """A pod's record, its group as the state keys it: a leaf PodGroup's pod joins its
        tree's gang."""
        record = pod_record_from(raw, sources)
        record.group = self.rekey(record.group)
        return record

    def leaf_changed(self, source: str, namespace: str, raw: Mapping[str, Any]) -> list[str]:
        """A group object stored: returns the root keys whose gang appeared."""
        if not self.watched or source != SOURCE_NATIVE:
            return []
        self.book.set_leaf(namespace, raw)
        return self.resolve(namespace)

    def leaf_gone(self, source: str, namespace: str, name: str) -> None:
        if self.watched and source == SOURCE_NATIVE:
            self.book.drop_leaf(namespace, name)
            self.resolve(namespace)

    def relist_leaves(self, source: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of one source's group objects (their records already replaced)."""
        if not self.watched or source != SOURCE_NATIVE:
            return
        self.book.clear(leaves=True)
        for raw in objects:
            self.book.set_leaf(_namespace(raw), raw)
        self.resolve_all()

    def apply(self, raw: Mapping[str, Any]) -> list[str]:
        """A CompositePodGroup as the watch delivers it; returns the roots whose gang appeared."""
        self.book.set_composite(_namespace(raw), raw, _created(raw))
        return self.resolve(_namespace(raw))

    def delete(self, namespace: str, name: str) -> None:
        self.book.drop_composite(namespace, name)
        self.resolve(namespace)

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> list[str]:
        """Adopt a fresh list of CompositePodGroups; returns the roots whose gang appeared."""
        self.book.clear(leaves=False)
        for raw in objects:
            self.book.set_composite(_namespace(raw), raw, _created(raw))
        return self.resolve_all()

    def count(self) -> int:
        return self.book.count()

    def resolve_all(self) -> list[str]:
        namespaces = {*self.book.namespaces()}
        namespaces |= {k.partition(":")[2].partition("/")[0] for k in self._keys}
        return [key for ns in sorted(namespaces) for key in self.resolve(ns)]

    def resolve(self, namespace: str) -> list[str]:
        """Recompute the namespace's trees: each root's record in `podgroups`, each moved
        leaf's pods re-keyed to their new gang. Returns the root keys that appeared."""
        podgroups = self._podgroups()
        old_errors = dict(self.book.leaf_errors(namespace))
        moved = self.book.resolve(namespace)
        prefix = group_key(SOURCE_NATIVE, namespace, "")
        stale = {k for k in self._keys if k.startswith(prefix)}
        appeared: list[str] = []
        for name, root in self.book.records(namespace).items():
            key = group_key(SOURCE_NATIVE, namespace, name)
            record = PodGroupRecord(
                namespace,
                name,
                root.uid,
                root.spec,
                root.error,
                SOURCE_NATIVE,
                root.created,
                composite=True,
            )
            stale.discard(key)
            if key not in self._keys:
                appeared.append(key)
                self._keys.add(key)
            if podgroups.get(key) != record:
                podgroups[key] = record
                self._changed(key)
        for key in stale:
            self._keys.discard(key)
            if podgroups.pop(key, None) is not None:
                self._changed(key)
        for leaf, (old, new) in moved.items():
            self._rekey_pods(namespace, leaf, old, new)
        errors = self.book.leaf_errors(namespace)
        for leaf in {*old_errors, *errors}:
            if old_errors.get(leaf) != errors.get(leaf):
                self._changed(group_key(SOURCE_NATIVE, namespace, leaf))
        return appeared

    def _changed(self, key: str) -> None:
        self._changes.group_object_changed(key)
        for listener in self._listeners:
            listener(key)

    def _rekey_pods(self, namespace: str, leaf: str, old: str | None, new: str | None) -> None:
        """The leaf's pods, keyed under `old`'s gang (None: the leaf's own), move to `new`'s."""
        old_key = group_key(SOURCE_NATIVE, namespace, old or leaf)
        flat = GroupRef(namespace, leaf, source=SOURCE_NATIVE)
        ref = GroupRef(namespace, new, source=SOURCE_NATIVE, task=leaf) if new else flat
        for pod in list(self._pods.labelled(old_key)):
            group = pod.group
            if group is None or group.source != SOURCE_NATIVE:
                continue
            if (group.task == leaf) if old else (group.name == leaf and not group.task):
                self._store(dataclasses.replace(pod, group=ref))


def _namespace(raw: Mapping[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("namespace") or "default")


def _created(raw: Mapping[str, Any]) -> float:
    return parse_timestamp((raw.get("metadata") or {}).get("creationTimestamp"))
