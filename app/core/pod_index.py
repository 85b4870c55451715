"""The pods as the watch and the gate report them, indexed the ways the verbs look them up.

Every index (members per group, requests and pods per node, pods on their
way out or nominated, keys per uid) is kept up to date on each change, so a
verb's lookup costs what it returns, not a pass over every pod.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.changes import ChangeLog
from app.core.records import PodRecord, same_but_version
from app.core.resources import DEVICE_PREFIX, Resources, add, subtract

# How many deleted pods' uids are remembered: far more than the pod reads the
# bind verb can have in flight, a few hundred kB at most.
GONE_KEPT = 10_000


class Gone:
    """The pods lately deleted, for a pod read from the API server while our watch lagged.

    The read's answer may land after the watch's DELETED event, or after a
    relist that left the pod out: stored then, the pod would stay in the cache
    for good (no event would ever remove it again). So the uids of the latest
    GONE_KEPT deletions are kept (also of pods never seen: created and deleted
    while the watch was cut, only the DELETED event arrives), and the relists
    are counted: a read in flight across one cannot tell a pod deleted before
    the list from one created after it.
    """

    def __init__(self) -> None:
        self._uids: dict[str, None] = {}  # oldest first
        self.relists = 0

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        if len(self._uids) > GONE_KEPT:
            del self._uids[next(iter(self._uids))]


class PodIndex:
    def __init__(self, changes: ChangeLog) -> None:
        self._changes = changes
        self.pods: dict[str, PodRecord] = {}
        # group key -> keys of pods labelled into it (any phase).
        self._members: dict[str, set[str]] = {}
        # node name -> requests of the non-terminal pods placed there (bound or reserved).
        self._requested: dict[str, Resources] = {}
        # node name -> keys of the non-terminal pods placed there (preemption plans
        # look at the pods of a few nodes, not at every pod).
        self._on_node: dict[str, set[str]] = {}
        # uid -> pod key: preemption victims arrive as UIDs.
        self._by_uid: dict[str, str] = {}
        # Placed pods on their way out (being deleted, or marked as preemption
        # victims), by key: their room is as good as free for a gang, as
        # kube-scheduler counts it for the preemptors it nominated.
        self.leaving: dict[str, PodRecord] = {}
        # Unplaced pods kube-scheduler nominated for a node (status.nominatedNodeName), by key.
        self.nominated: dict[str, PodRecord] = {}
        # The DRA device resources (devices/...) the non-terminal placed pods' claims take,
        # cluster-wide: what app/core/devices/distinct.py takes from the cluster's devices.
        self.placed_devices: Resources = {}
        self.gone = Gone()
        # group key -> keys of its members the API has bound (counts_as_member, nodeName
        # set): the gate counts them at each member's arrival, so in what they number.
        self._bound: dict[str, set[str]] = {}

    # ---- changes ---------------------------------------------------------------

    def apply(self, new: PodRecord) -> None:
        """Insert or replace a pod (ADDED/MODIFIED event, list item, or an API read)."""
        old = self.pods.get(new.key)
        if old is not None and old.uid == new.uid:
            # nodeName never goes back to empty; an older event arriving after
            # assume_bound() must not unbind the pod in our view.
            new.node_name = new.node_name or old.node_name
            # The gate's reservation outlives the watch's copy of the pod.
            new.reserved_node = "" if new.node_name else old.reserved_node
            new.bind_refused = old.bind_refused and not new.node_name
            if same_but_version(old, new):
                # Nothing the verbs read changed (a status update of the kubelet,
                # the echo of our own binding): no listener has anything to do,
                # and the node's remembered scores stay valid.
                old.resource_version = new.resource_version
                return
        self._store(old, new)

    def delete(self, key: str, uid: str | None = None) -> None:
        # Remembered even when the pod was never seen (created and deleted while the
        # watch was cut, only the DELETED event arrives): a read of it may be on its way.
        if uid:
            self.gone.add(uid)
        old = self.pods.get(key)
        if old is None or (uid and old.uid != uid):
            return
        self.gone.add(old.uid)
        self._store(old, None)

    def reserve(self, pod_key: str, node: str) -> None:
        """The gate holds the pod on `node`: count its requests there from now on."""
        pod = self.pods.get(pod_key)
        if pod is None or pod.node_name:
            return
        self._move(pod, node, reserved=True)
        pod.bind_refused = False

    def unreserve(self, pod_key: str) -> None:
        """The gate answered the pod's bind call with an error: its node is free again."""
        pod = self.pods.get(pod_key)
        if pod is None or not pod.reserved_node:
            return
        self._move(pod, "", reserved=True)
        pod.bind_refused = True

    def assume_bound(self, pod_key: str, node: str) -> None:
        """We created the binding; record it before the watch echoes it back."""
        pod = self.pods.get(pod_key)
        if pod is None:
            return
        self._move(pod, node, reserved=False)

    def _move(self, pod: PodRecord, node: str, *, reserved: bool) -> None:
        """Place the pod on `node` (reserved by the gate, or bound), or nowhere ("")."""
        self._account(pod, -1)
        if reserved:
            pod.reserved_node = node
        else:
            pod.node_name = node
            pod.reserved_node = ""
        self._account(pod, +1)
        self._group_touched(pod)
        self._changes.pod_placed(pod)

    def _store(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if old is not None:
            self._account(old, -1)
            self._group_touched(old)
            if old.group is not None:
                members = self._members.get(old.group.key)
                if members is not None:
                    members.discard(old.key)
                    if not members:
                        del self._members[old.group.key]
                        self._changes.group_emptied(old.group.key)
            del self.pods[old.key]
            if self._by_uid.get(old.uid) == old.key:
                del self._by_uid[old.uid]
        if new is not None:
            self.pods[new.key] = new
            self._by_uid[new.uid] = new.key
            self._account(new, +1)
            self._group_touched(new)
            if new.group is not None:
                self._members.setdefault(new.group.key, set()).add(new.key)
        self._changes.pod_changed(old, new)

    def _group_touched(self, pod: PodRecord) -> None:
        if pod.group is not None:
            self._changes.group_touched(pod.group.key)

    def _account(self, pod: PodRecord, sign: int) -> None:
        """Count (+1) or uncount (-1) the pod where it is placed, and in `leaving`/`nominated`."""
        self._index(pod, sign)
        node = pod.placed_node
        if not node or pod.terminal:
            return
        self._changes.node_touched(node)
        if pod.claims:
            devices = self.placed_devices
            for name, amount in pod.requests.items():
                if name.startswith(DEVICE_PREFIX):
                    devices[name] = devices.get(name, 0) + sign * amount
        requested = self._requested.setdefault(node, {})
        if sign > 0:
            add(requested, pod.requests)
            self._on_node.setdefault(node, set()).add(pod.key)
        else:
            subtract(requested, pod.requests)
            keys = self._on_node.get(node)
            if keys is not None:
                keys.discard(pod.key)
                if not keys:
                    del self._on_node[node]
            if not requested:
                del self._requested[node]

    def _index(self, pod: PodRecord, sign: int) -> None:
        group = pod.group
        if sign < 0:
            self.leaving.pop(pod.key, None)
            self.nominated.pop(pod.key, None)
            if group is not None and (bound := self._bound.get(group.key)) is not None:
                bound.discard(pod.key)
                if not bound:
                    del self._bound[group.key]
            return
        if group is not None and pod.node_name and pod.counts_as_member:
            self._bound.setdefault(group.key, set()).add(pod.key)
        if pod.terminal:
            return
        if pod.placed_node:
            if pod.deleting or pod.preempted:
                self.leaving[pod.key] = pod
        elif pod.nominated_node:
            self.nominated[pod.key] = pod

    # ---- lookups ---------------------------------------------------------------

    def members(self, group_key: str) -> list[PodRecord]:
        """Siblings that can still take part (not finished, not being deleted)."""
        keys = self._members.get(group_key, ())
        return [p for k in keys if (p := self.pods[k]).counts_as_member]

    def labelled(self, group_key: str) -> list[PodRecord]:
        """Every pod labelled into the group, in any phase."""
        return [self.pods[k] for k in self._members.get(group_key, ())]

    def group_keys(self) -> list[str]:
        """The groups that have pods."""
        return list(self._members)

    def bound_members(self, group_key: str) -> list[PodRecord]:
        """Members the API has bound (not those only reserved in the gate)."""
        return [self.pods[k] for k in self._bound.get(group_key, ())]

    def placed_members(self, group_key: str) -> list[PodRecord]:
        """Members holding a node now: bound by the API or reserved in the gate."""
        return [p for p in self.members(group_key) if p.placed_node]

    def pod_by_uid(self, uid: str) -> PodRecord | None:
        key = self._by_uid.get(uid)
        return self.pods.get(key) if key is not None else None

    def known(self, pod_key: str, uid: str) -> PodRecord | None:
        """The pod kube-scheduler names, if our watch delivered it (that very pod, when `uid`)."""
        pod = self.pods.get(pod_key)
        if pod is None or (uid and pod.uid != uid):
            return None
        return pod

    @property
    def requested(self) -> Mapping[str, Resources]:
        """Node name -> what the non-terminal pods placed there request."""
        return self._requested

    def pods_on(self, node: str) -> list[PodRecord]:
        """The non-terminal pods placed on `node` (bound, or reserved in the gate)."""
        return [self.pods[key] for key in self._on_node.get(node, ())]
