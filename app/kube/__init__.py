"""Kubernetes I/O: every call to the API server, and nothing else.

One job per module: `client` (the HTTP request on the official client's
pool, and building that client), `errors` (what a failed call raises),
`discovery` (which PodGroup APIs are served), `pods` (the verbs' pod calls:
bind, read, wake up, evict), `reflector` (list-then-watch into the cluster
state), `events` (the Events writer) and `status` (the PodGroup status
writer). The decisions (admission, packing, contention, scoring,
preemption, groups, resources) import nothing from here; the runners that
use these writers are app/ops/event_recorder.py and app/ops/status_reconciler.py.
"""
