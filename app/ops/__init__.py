"""Operations: metrics, logs, leader election, the Event and status writers, /debug.

What an operator watches and what the cluster is told, kept apart from the
decisions so that a report never changes one.
"""
