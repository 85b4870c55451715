"""Topology-aware gangs: levels, the one domain a gang fits in, and how each source declares it."""
