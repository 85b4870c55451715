from app.core.changes import ChangeLog


def test_a_reader_that_kept_up_gets_the_nodes_even_when_group_changes_came_between() -> None:
    log = ChangeLog(remembered_node_changes=2)
    log.node_touched("n0")
    stamp, _ = log.nodes_changed_since(0)
    log.group_touched("default/g")  # stamps are shared with group changes
    log.node_touched("a")
    log.node_touched("b")  # the log lets n0 go, which the reader had seen
    now, changed = log.nodes_changed_since(stamp)
    assert sorted(changed or []) == ["a", "b"]  # named, not "assume all"
    assert log.nodes_changed_since(now) == (now, [])


def test_a_reader_behind_what_the_log_remembers_is_told_to_assume_all() -> None:
    log = ChangeLog(remembered_node_changes=4)
    log.node_touched("n0")
    stamp, changed = log.nodes_changed_since(0)
    assert changed == ["n0"]
    for i in range(1, 6):
        log.node_touched(f"n{i}")
    assert log.nodes_changed_since(stamp)[1] is None  # n1 is no longer remembered
    assert log.nodes_changed_since(-1)[1] is None  # a reader that never looked
    fresh = ChangeLog()
    assert fresh.nodes_changed_since(-1)[1] is None
    fresh.group_touched("default/g")  # no node changed: nothing to redo
    assert fresh.nodes_changed_since(0)[1] == []


def test_groups_changed_since_names_the_groups_or_says_too_many() -> None:
    log = ChangeLog(remembered_group_changes=3)
    stamp, changed = log.groups_changed_since(0)
    assert (stamp, changed) == (0, [])
    log.group_touched("a")
    log.group_object_changed("b")  # a PodGroup changed: no member stamp of its own
    assert log.groups_changed_since(0) == (2, ["b", "a"])
    assert log.group_stamp("a") == 1 and log.group_stamp("b") == 0
    log.node_touched("n1")  # node changes share the stamps, not the log
    assert log.groups_changed_since(2) == (3, [])
    for name in ("c", "d", "e"):
        log.group_touched(name)
    assert log.groups_changed_since(1) == (6, None)  # "b" fell out of the log
    assert log.groups_changed_since(2) == (6, ["e", "d", "c"])


def test_the_stamp_is_what_a_reader_of_either_log_is_told_now() -> None:
    log = ChangeLog()
    assert log.stamp == 0
    log.group_touched("default/g")
    log.node_touched("n0")
    assert log.stamp == 2
    assert log.groups_changed_since(0)[0] == log.nodes_changed_since(0)[0] == log.stamp
