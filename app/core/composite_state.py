"""The CompositePodGroup trees ClusterState keeps, and the pods it keys under them. Pure.

The state's side of app/core/composite_trees.py: CompositeTrees feeds the book
what the watches deliver, puts each root's gang among the state's group
records, and moves a leaf's pods to their root's gang (or back) when the tree
above the leaf changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from app.core.changes import ChangeLog
from app.core.composite_trees import CompositeBook, created_of, namespace_of, tree_member_ref
from app.core.groups import SOURCE_NATIVE, GroupRef, PodGroupSpecError, group_key
from app.core.pod_index import PodIndex
from app.core.records import PodGroupRecord, PodRecord, pod_record_from


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
        # The records of leaves a tree holds, out of `podgroups` meanwhile: a leaf is no
        # gang of its own (/debug/gangs, the podgroups gauge) while its root's gang is.
        self._leaves: dict[str, PodGroupRecord] = {}

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
            self._leaves.pop(group_key(SOURCE_NATIVE, namespace, name), None)
            self.book.drop_leaf(namespace, name)
            self.resolve(namespace)

    def relist_leaves(self, source: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of one source's group objects (their records already replaced)."""
        if not self.watched or source != SOURCE_NATIVE:
            return
        self.book.clear(leaves=True)
        self._leaves.clear()
        for raw in objects:
            self.book.set_leaf(namespace_of(raw), raw)
        self.resolve_all()

    def apply(self, raw: Mapping[str, Any]) -> list[str]:
        """A CompositePodGroup as the watch delivers it; returns the roots whose gang appeared."""
        self.book.set_composite(namespace_of(raw), raw, created_of(raw))
        return self.resolve(namespace_of(raw))

    def delete(self, namespace: str, name: str) -> None:
        self.book.drop_composite(namespace, name)
        self.resolve(namespace)

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> list[str]:
        """Adopt a fresh list of CompositePodGroups; returns the roots whose gang appeared."""
        self.book.clear(leaves=False)
        for raw in objects:
            self.book.set_composite(namespace_of(raw), raw, created_of(raw))
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
        prefix = group_key(SOURCE_NATIVE, namespace, "", composite=True)
        stale = {k for k in self._keys if k.startswith(prefix)}
        appeared: list[str] = []
        for record in self.book.gang_records(namespace):
            key = record.key
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
        self._hide_leaves(namespace, podgroups)
        errors = self.book.leaf_errors(namespace)
        for leaf in {*old_errors, *errors}:
            if old_errors.get(leaf) != errors.get(leaf):
                self._changed(group_key(SOURCE_NATIVE, namespace, leaf))
        return appeared

    def _hide_leaves(self, namespace: str, podgroups: dict[str, PodGroupRecord]) -> None:
        """Each leaf a tree holds out of `podgroups`; one no tree holds (any more) back in."""
        for name in self.book.leaf_names(namespace):
            key = group_key(SOURCE_NATIVE, namespace, name)
            if self.book.root_of(namespace, name) is None:
                if key in self._leaves:
                    podgroups.setdefault(key, self._leaves.pop(key))
            elif (record := podgroups.get(key)) is not None and not record.composite:
                self._leaves[key] = podgroups.pop(key)

    def _changed(self, key: str) -> None:
        self._changes.group_object_changed(key)
        for listener in self._listeners:
            listener(key)

    def _rekey_pods(self, namespace: str, leaf: str, old: str | None, new: str | None) -> None:
        """The leaf's pods, keyed under `old`'s gang (None: the leaf's own), move to `new`'s."""
        old_key = group_key(SOURCE_NATIVE, namespace, old or leaf, composite=old is not None)
        flat = GroupRef(namespace, leaf, source=SOURCE_NATIVE)
        ref = tree_member_ref(namespace, new, leaf) if new else flat
        for pod in list(self._pods.labelled(old_key)):
            group = pod.group
            if group is None or group.source != SOURCE_NATIVE:
                continue
            if (group.task == leaf) if old else (group.name == leaf and not group.task):
                self._store(dataclasses.replace(pod, group=ref))
