"""The runtime: what holds gangs over time and acts on the rules' answers.

The permit gate, the arbiter of competing gangs, the preemption plans, wake-ups,
evictions and queue shares live here. They run on the event loop, keep state
between verb calls, and reach Kubernetes only through the clients they are
given (app/kube).
"""
