"""The gang rules: pure decisions over an in-memory model of the cluster.

Nothing here does I/O, waits, or reads a clock of its own: every function is
given what it decides on, so all of it is unit-tested without a cluster
(tests/unit/test_layering.py keeps it that way). The model (state.py, over
records.py and pod_index.py) is a plain index of slim records that the
watches in app/kube feed.
"""
