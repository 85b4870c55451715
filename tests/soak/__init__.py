"""The soak harness (issue 49): a seeded stream of gangs, pods and faults on the real cluster.

Gangs of every source, some required to keep to one rack (the soak's nodes
are in racks; stream.py).

`relay` slows the API server down for chosen clients (a TCP relay that
delays the bytes it carries), `load` adds CPU-burning loops and API-server
load, the rest drive the stream and check the invariants. `make soak` runs
it for a set duration; tests/cluster/test_soak.py is the short version (in
`make test`; alone: `make soak-ci`).
"""
