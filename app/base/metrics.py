"""Prometheus metrics, registered on a registry the caller owns (no global state).

Label values are fixed vocabularies (verb, result, reason, kind): never pod or
group names, so cardinality stays flat however many gangs run.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

# From 100 µs: a filter or prioritize call is answered in a few hundred µs, and a
# first bucket of 0.5 ms made every p50 read as 0.25 ms (interpolated inside it).
_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
)
_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 90, 120)


class Metrics:
    """Every metric of the extender, by area; each component gets this one object."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self._verbs(r)
        self._gate(r)
        self._watches(r)
        self._topology(r)
        self._preemption(r)
        self._lifecycle(r)
        self._queues(r)

    def _verbs(self, r: CollectorRegistry) -> None:
        """The verbs and the webhook: calls, their time, and what they decided."""
        self.request_duration = Histogram(
            "gang_extender_request_duration_seconds",
            "Time to answer one extender call, by verb (bind includes the gate wait).",
            ["verb"],
            buckets=(*_LATENCY_BUCKETS, 10, 30, 60, 90),
            registry=r,
        )
        self.requests = Counter(
            "gang_extender_requests",
            "Extender calls answered, by verb and HTTP status code.",
            ["verb", "code"],
            registry=r,
        )
        self.filter_decisions = Counter(
            "gang_extender_filter_decisions",
            "filter verdicts for gang members, by reason (admitted, permitted, denied, "
            "too-few-siblings, min-resources, no-group, bad-group).",
            ["reason"],
            registry=r,
        )
        self.webhook_reviews = Counter(
            "gang_extender_webhook_reviews",
            "Pod admission reviews answered by the webhook: marked (a gang member), held (a "
            "member marked and given the line's scheduling gate, --hold-waiting-gangs), "
            "unchanged (already marked), skipped, invalid.",
            ["result"],
            registry=r,
        )
        self.unmarked_members = Counter(
            "gang_extender_unmarked_members",
            "Gang members seen without the gang-extender.dev/member mark while the webhook "
            "runs (gang-only mode): kube-scheduler does not call the extender for them.",
            registry=r,
        )
        self.unmarked_preemptors = Counter(
            "gang_extender_unmarked_preemptors",
            "Pending plain pods that may preempt seen without the gang-extender.dev/preemptor "
            "mark (--expect-marked-preemptors): kube-scheduler would preempt for them without "
            "asking the extender.",
            registry=r,
        )
        self.filter_requests = Counter(
            "gang_extender_filter_requests",
            "filter calls by how kube-scheduler sent the nodes: node-names "
            "(nodeCacheCapable: true) or nodes (full Node objects).",
            ["mode"],
            registry=r,
        )
        self.member_node_choices = Counter(
            "gang_extender_member_node_choices",
            "admitted gang members offered more than one node, by who ranks them: extender "
            "(the filter named one node) or scheduler (every node passed: a preference only "
            "kube-scheduler weighs, or --member-node-choice=scheduler).",
            ["by"],
            registry=r,
        )

    def _gate(self, r: CollectorRegistry) -> None:
        """The permit gate: who waits, how long, and how each gang wave ended."""
        self.gate_waiting = Gauge(
            "gang_extender_gate_waiting_pods",
            "Gang members reserved and waiting in the permit gate.",
            registry=r,
        )
        self.held_members = Gauge(
            "gang_extender_held_members",
            "Gang members held out of kube-scheduler's queue by the line's scheduling gate "
            "while their gang waits (--hold-waiting-gangs).",
            registry=r,
        )
        self.gate_wait = Histogram(
            "gang_extender_gate_wait_seconds",
            "How long a gang member waited in the permit gate before it was bound or released.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.admissions = Counter(
            "gang_extender_gang_admissions",
            "Gate outcomes per gang wave: admitted (all bound), timeout, rejected (a binding "
            "failed), rolled-back (a binding failed and the wave's bound members were deleted).",
            ["result"],
            registry=r,
        )
        self.bind_errors = Counter(
            "gang_extender_bind_errors",
            "pods/binding calls that failed, by reason.",
            ["reason"],
            registry=r,
        )
        for result in ("admitted", "timeout", "rejected", "rolled-back"):
            self.admissions.labels(result)

    def _watches(self, r: CollectorRegistry) -> None:
        """The watch caches: what they hold and how current they are."""
        self.cache_objects = Gauge(
            "gang_extender_cache_objects",
            "Objects held in the watch caches, by kind.",
            ["kind"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "gang_extender_watch_restarts",
            "Watches restarted (dropped connection, expired resourceVersion), by kind.",
            ["kind"],
            registry=r,
        )
        self.watch_lag = Gauge(
            "gang_extender_watch_lag_seconds",
            "Seconds since the newest watch event (or bookmark) of a kind was applied.",
            ["kind"],
            registry=r,
        )

    def _topology(self, r: CollectorRegistry) -> None:
        """Topology placement (app/core/topology/domains.py, app/runtime/gang_topology.py)."""
        self.topology_placements = Counter(
            "gang_extender_topology_placements",
            "Gangs with a topology constraint admitted, by the level of the domain they were "
            "placed in (the node label; `anywhere` when a preferred level fell back to the "
            "whole cluster).",
            ["level"],
            registry=r,
        )

    def _preemption(self, r: CollectorRegistry) -> None:
        """Preemption plans (app/runtime/preemption/plans.py)."""
        self.preemption_plan_evictions = Histogram(
            "gang_extender_preemption_plan_evictions",
            "Pods a preempting gang's plan evicts (one observation per plan made).",
            buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
            registry=r,
        )
        self.preemption_plans = Counter(
            "gang_extender_preemption_plans_ended",
            "Preemption plans ended, by phase: done (the gang holds minMember), expired "
            "(victims or members too slow), cancelled (a node gone, a higher-priority gang).",
            ["phase"],
            registry=r,
        )
        for phase in ("done", "expired", "cancelled"):
            self.preemption_plans.labels(phase)

    def _lifecycle(self, r: CollectorRegistry) -> None:
        """Gangs' lifecycle (app/ops/status_reconciler.py, app/ops/event_recorder.py)."""
        self.podgroups = Gauge(
            "gang_extender_podgroups",
            "Gangs by lifecycle phase (Pending, Scheduling, Scheduled, Running, Finished, "
            "Failed): PodGroup objects and label-only groups.",
            ["phase"],
            registry=r,
        )
        self.status_writes = Counter(
            "gang_extender_podgroup_status_writes",
            "PodGroup status patches, by result (written, conflict, failed).",
            ["result"],
            registry=r,
        )
        self.events = Counter(
            "gang_extender_events",
            "Kubernetes Events recorded, by result: created, aggregated (count of an identical "
            "event raised), rate-limited (dropped by the per-object spam filter), failed.",
            ["result"],
            registry=r,
        )

    def _queues(self, r: CollectorRegistry) -> None:
        """Queues (app/runtime/queues/book.py, app/runtime/queues/reclaimer.py).

        The queue label is a Queue object's name: admins create a handful, not
        one per job.
        """
        self.queue_weight = Gauge(
            "gang_extender_queue_weight", "Each queue's spec.weight.", ["queue"], registry=r
        )
        self.queue_deserved = Gauge(
            "gang_extender_queue_deserved",
            "Each queue's deserved share of the cluster, by resource (cores for cpu, bytes "
            "for memory), as of the last filter call of a gang.",
            ["queue", "resource"],
            registry=r,
        )
        self.queue_allocated = Gauge(
            "gang_extender_queue_allocated",
            "What each queue's gangs hold (placed members and admitted gangs' promised room), "
            "by resource.",
            ["queue", "resource"],
            registry=r,
        )
        self.queue_pending_gangs = Gauge(
            "gang_extender_queue_pending_gangs",
            "Gangs waiting in line, by queue.",
            ["queue"],
            registry=r,
        )
        self.queue_reclaimed_gangs = Counter(
            "gang_extender_queue_reclaimed_gangs",
            "Gangs evicted whole to give a queue below its share its room back, by the queue "
            "they were taken from.",
            ["queue"],
            registry=r,
        )
