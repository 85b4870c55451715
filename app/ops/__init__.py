"""Operations: logs, the Event and status writers, Queue status, /debug, the device gauges.

What an operator watches and what the cluster is told, kept apart from the
decisions so that a report never changes one.
"""
