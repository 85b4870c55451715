"""`kubectl gang`: a kubectl plugin that shows gangs, queues and the extender's live view.

A client tool, not part of the extender: it runs on a user's machine with the
user's kubeconfig, reads the group objects and pods through the official
Kubernetes Python client, and the extender leader's live state
(/debug/gangs) through the API server's service proxy. It reuses the pure
rules of app/core (which pod belongs to which gang, minMember per source,
the phase) and never loads the runtime, the HTTP face or operations
(tests/unit/test_layering.py). docs/kubectl-gang.md is its manual.

Modules, one job each: `args` (the command line), `api` (kubeconfig and
GET requests), `objects` (reading pods, group objects, nodes, queues,
events), `live` (the extender's snapshot through the service proxy), `gangs`
(one row per gang), `queues` (one row per queue), `table` (aligned columns,
colour, ages), `describe` (one gang in full), `output` (json/yaml/table per
command), `main` (the entry point and --watch).
"""
