"""Kubernetes I/O: every call to the API server, and nothing else.

One job per module: `client` (loading the kubeconfig or in-cluster
configuration), `http` (the one asyncio client every call goes through:
requests and watches), `errors` (what a failed call raises), `discovery`
(which PodGroup APIs are served), `pods` (the verbs' pod calls: bind, read,
wake up, evict), `reflector` (list-then-watch into the cluster state),
`events` (the Events writer), `status` (the PodGroup and Queue status
writers) and `webhook` (the webhook's caBundle and certificate Secret). The
decisions (admission, packing, contention, scoring, preemption, groups,
resources) import nothing from here; the runners that use these writers are
app/ops/event_recorder.py, app/ops/status_reconciler.py and app/ops/queue_status.py.
"""
