"""The bind verb: plain pods are bound at once, gang members go through the permit gate.

kube-scheduler may ask to bind a pod our watch has not delivered yet (its
watch can be ahead of ours): the pod is then read from the API server, and
adopted into the cluster state, before anything is decided about it; unless
our watch saw it deleted (or relisted) while the read's answer was on its way
(a slow API server, a watch cut): adopted then, it would stay in the cache for
good, no event ever removing it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from app.core.groups import GroupRef, GroupSpec, PodGroupSpecError
from app.core.observer import MemberRef
from app.core.records import GroupNotFound, PodRecord
from app.kube.errors import ApiError
from app.runtime.gate import PermitGate
from app.runtime.waiting_room import GateError
from app.web.verb_context import VerbCore, VerbLinks
from app.web.wire import BindingArgs, binding_result

log = logging.getLogger(__name__)


class PodBinder(Protocol):
    """Binds pods, and reads the one pod our watch has not delivered yet."""

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class BindVerb:
    def __init__(self, core: VerbCore, gate: PermitGate, api: PodBinder, links: VerbLinks) -> None:
        self._core = core
        self._gate = gate
        self._api = api
        self._links = links

    async def bind(self, args: BindingArgs) -> dict[str, Any]:
        # One coroutine from the answer to the gate: a gang member's bind call
        # stays in it for as long as the member waits, and each frame is memory.
        try:
            pod = await self._lookup(args)
            if pod.node_name:
                raise GateError(f"pod {pod.key} is already bound to {pod.node_name}")
            if pod.group_error:
                raise GateError(pod.group_error)
            if pod.group is None or self._core.admission.soft.is_plain(pod.group.key):
                await self._bind_plain(pod, args.node)
            else:
                await self._gate.admit(pod, args.node, *self._spec_and_wait(pod.group))
        except (GateError, ApiError) as err:
            return binding_result(str(err))
        return binding_result()

    def _spec_and_wait(self, group: GroupRef) -> tuple[GroupSpec, float]:
        try:
            spec = self._core.state.group_spec(group)
        except (GroupNotFound, PodGroupSpecError) as err:
            raise GateError(str(err)) from None
        return spec, self._core.wait.for_group(spec)

    async def _bind_plain(self, pod: PodRecord, node: str) -> None:
        try:
            await self._api.bind(pod.namespace, pod.name, pod.uid, node)
        except ApiError as err:
            self._core.metrics.bind_errors.labels(err.reason).inc()
            self._links.observer.bind_failed(
                MemberRef(pod.namespace, pod.name, pod.uid, node), None, str(err)
            )
            raise
        self._core.state.assume_bound(pod.key, node)

    async def _lookup(self, args: BindingArgs) -> PodRecord:
        state = self._core.state
        pod = state.known_pod(args.pod_key, args.pod_uid)
        if pod is not None:
            return pod
        # Our watch may lag behind kube-scheduler's: ask the API server.
        log.info("pod %s not in the cache yet: read from the API server", args.pod_key)
        relists = state.gone.relists
        raw = await self._api.read_pod(args.pod_namespace, args.pod_name)
        if raw is None:
            raise GateError(f"pod {args.pod_key} not found: it was deleted before binding")
        fresh = state.trees.pod_record(raw, state.sources)
        if args.pod_uid and fresh.uid != args.pod_uid:
            raise GateError(
                f"pod {args.pod_key} was recreated (uid {fresh.uid}, scheduler asked to "
                f"bind {args.pod_uid}); the new pod is scheduled on its own"
            )
        # The answer may land after our watch caught up: what the watch says wins, and a
        # pod it saw deleted (or a relist left out) must not come back into the cache,
        # where no event would ever remove it again.
        pod = state.known_pod(args.pod_key, fresh.uid)
        if pod is not None:
            return pod
        if fresh.uid in state.gone:
            raise GateError(f"pod {args.pod_key} was deleted before binding")
        if state.gone.relists != relists:
            raise GateError(
                f"pod {args.pod_key}: the pod cache was relisted while the pod was read; "
                "kube-scheduler retries it"
            )
        state.apply_pod(raw)
        return state.pods[args.pod_key]
