from app.core.timestamps import parse_rfc3339, rfc3339, wakeup_stamp


def test_rfc3339_is_whole_seconds_in_utc() -> None:
    assert rfc3339(1_700_000_000.75) == "2023-11-14T22:13:20Z"
    assert rfc3339(0) == "1970-01-01T00:00:00Z"


def test_parse_reads_back_what_rfc3339_writes() -> None:
    assert parse_rfc3339(rfc3339(1_700_000_000)) == 1_700_000_000


def test_parse_accepts_offsets_and_fractions() -> None:
    assert parse_rfc3339("2023-11-14T23:13:20+01:00") == 1_700_000_000
    assert parse_rfc3339("2023-11-14T22:13:20.500000Z") == 1_700_000_000.5


def test_parse_of_anything_else_is_none() -> None:
    for value in (None, "", "yesterday", 1_700_000_000, "2023-13-45T00:00:00Z"):
        assert parse_rfc3339(value) is None


def test_wakeup_stamps_differ_and_start_with_the_time() -> None:
    first, second = wakeup_stamp(1e9, 1), wakeup_stamp(1e9, 2)
    assert first != second
    assert parse_rfc3339(first.partition("#")[0]) is not None
