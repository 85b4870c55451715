"""The checks Volcano's spec.subGroupPolicy and KAI's spec.subGroups share (named_entries,
int32_count): each source's own words, the same order of checks."""

from typing import Any

import pytest

from app.core.kai import kai_spec
from app.core.topology.domains import TopologyError
from app.core.topology.subgroup_sources import (
    ListWords,
    int32_count,
    named_entries,
    policies_from_volcano,
)


def entries(spec: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return list(
        named_entries(
            spec,
            "parts",
            ListWords(
                "spec.parts must be a list of parts",
                "{where} must be an object",
                "{where}.name must name the part",
            ),
        )
    )


def test_named_entries_yields_each_entry_with_its_field_path_in_order() -> None:
    a, b = {"name": "a", "size": 1}, {"name": "b"}
    assert entries({"parts": [a, b]}) == [("spec.parts[0]", "a", a), ("spec.parts[1]", "b", b)]
    assert entries({}) == [] and entries({"parts": []}) == [] and entries({"parts": None}) == []


@pytest.mark.parametrize(
    ("parts", "words"),
    [
        ({"name": "a"}, "spec.parts must be a list of parts"),
        (["a"], "spec.parts[0] must be an object"),
        ([{"name": ""}], "spec.parts[0].name must name the part"),
        ([{"size": 1}], "spec.parts[0].name must name the part"),
        ([{"name": "a"}, {"name": "b"}, {"name": "a"}], "spec.parts names a twice"),
    ],
)
def test_named_entries_names_the_field_of_the_first_mistake(parts: Any, words: str) -> None:
    with pytest.raises(TopologyError) as err:
        entries({"parts": parts})
    assert str(err.value) == words


def test_an_entry_is_checked_by_its_caller_before_the_next_entry_is_read() -> None:
    """The caller's check of entry 0 comes before the shape check of entry 1."""
    seen: list[str] = []
    with pytest.raises(TopologyError, match=r"spec.parts\[1\] must be an object"):
        for _, name, _ in named_entries(
            {"parts": [{"name": "a"}, 7]}, "parts", ListWords("", "{where} must be an object", "")
        ):
            seen.append(name)
    assert seen == ["a"]


@pytest.mark.parametrize("value", [-1, True, 2**31, "3", 1.5])
def test_int32_count_refuses_what_is_no_int32_count(value: Any) -> None:
    with pytest.raises(TopologyError) as err:
        int32_count(value, "spec.x", 0)
    assert str(err.value) == f"spec.x must be an integer between 0 and {2**31 - 1}, got {value!r}"


def test_int32_count_takes_the_bounds_themselves() -> None:
    assert int32_count(1, "spec.x", 1) == 1 and int32_count(2**31 - 1, "spec.x", 0) == 2**31 - 1


@pytest.mark.parametrize(
    ("entries_given", "volcano", "kai"),
    [
        (
            {"name": "a"},
            "spec.subGroupPolicy must be a list of policies",
            "spec.subGroups must be a list of sub-groups",
        ),
        (
            ["a"],
            "spec.subGroupPolicy[0] must be an object",
            "spec.subGroups[0] must be an object (name, minMember, parent)",
        ),
        (
            [{}],
            "spec.subGroupPolicy[0].name must name the policy (its sub-groups are named so)",
            "spec.subGroups[0].name must name the sub-group (its pods' label value)",
        ),
        (
            [{"name": "a"}, {"name": "a"}],
            "spec.subGroupPolicy names a twice",
            "spec.subGroups names a twice",
        ),
    ],
)
def test_both_sources_say_the_shared_mistakes_in_their_own_words(
    entries_given: Any, volcano: str, kai: str
) -> None:
    with pytest.raises(TopologyError) as from_volcano:
        policies_from_volcano({"subGroupPolicy": entries_given})
    with pytest.raises(TopologyError) as from_kai:
        kai_spec({"subGroups": entries_given})
    assert (str(from_volcano.value), str(from_kai.value)) == (volcano, kai)
