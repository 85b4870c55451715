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
