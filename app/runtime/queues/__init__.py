"""Volcano queues over time: the Queues we watch, the tally of what each holds, and reclaim.

The shares themselves are computed by the pure rules in app/core/queues.py."""
