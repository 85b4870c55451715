"""/debug/caches: the cached pods, nodes and PodGroups, as compared with a fresh list."""

from app.core.state import ClusterState
from app.ops.cachedump import cache_snapshot
from tests.unit.builders import node, pod, podgroup


def test_snapshot_holds_identity_version_and_placement_of_every_object() -> None:
    state = ClusterState()
    state.replace_nodes([node("n2"), node("n1")])
    state.replace_podgroups([podgroup("g", 2)])
    state.replace_pods([pod("a", group="g", node="n1", phase="Running"), pod("b")])
    assert cache_snapshot(state) == {
        "pods": {
            "default/a": {
                "uid": "uid-default-a",
                "resourceVersion": "1",
                "nodeName": "n1",
                "phase": "Running",
            },
            "default/b": {
                "uid": "uid-default-b",
                "resourceVersion": "1",
                "nodeName": "",
                "phase": "Pending",
            },
        },
        "nodes": ["n1", "n2"],
        "podgroups": {"default/g": "pg-g"},
        "hypernodes": {},
        "hypernode_errors": {},
        "devices": {
            "pools": {},
            "classes": {},
            "claims": 0,
            "errors": [],
            "selectors_counted_by_class": {},
        },
    }
