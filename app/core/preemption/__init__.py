"""Preemption's rules: who may be evicted, the cheapest victims per node, one plan per gang."""
