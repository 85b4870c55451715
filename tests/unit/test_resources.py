import pytest

from app.core.resources import (
    QuantityError,
    fits,
    format_resources,
    parse_quantity,
    pod_requests,
    shortfall,
)


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("500m", 500),
        ("1", 1000),
        ("0.5", 500),
        ("2Gi", 2 * 2**30 * 1000),
        ("1.5Ki", 1536 * 1000),
        ("1k", 1_000_000),
        ("1e3", 1_000_000),
        ("2E3", 2_000_000),
        ("1E", 10**21),
        ("100n", 1),  # fractions of a milli-unit round up, as the API server does
        (3, 3000),
    ],
)
def test_parse_quantity(text: str | int, milli: int) -> None:
    assert parse_quantity(text) == milli


@pytest.mark.parametrize("text", ["", "abc", "1Gb", "1.2.3", "--1", "1 Gi"])
def test_parse_quantity_rejects_garbage_with_a_hint(text: str) -> None:
    with pytest.raises(QuantityError, match="invalid quantity"):
        parse_quantity(text)


def test_pod_requests_follow_kube_scheduler_rules() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"resources": {"limits": {"cpu": "1"}}},  # requests default to limits
        ],
        "initContainers": [
            {"resources": {"requests": {"cpu": "3"}}},  # regular: max with the app sum
            {"restartPolicy": "Always", "resources": {"requests": {"memory": "1Gi"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(spec) == {
        "cpu": 3100,
        "memory": 2 * 2**30 * 1000,
        "pods": 1000,
    }


def test_shortfall_and_formatting_name_the_gap() -> None:
    need = {"cpu": 8000, "memory": 4 * 2**30 * 1000, "pods": 3000}
    free = {"cpu": 6500, "memory": 8 * 2**30 * 1000, "pods": 100_000}
    gap = shortfall(need, free)
    assert gap == {"cpu": 1500}
    assert format_resources(gap) == "cpu 1500m"
    assert format_resources(need) == "cpu 8, memory 4Gi, pods 3"


@pytest.mark.parametrize(
    ("need", "free"),
    [
        ({}, {}),
        ({"cpu": 1000}, {"cpu": 1000}),
        ({"cpu": 1001}, {"cpu": 1000}),
        ({"cpu": 500, "memory": 10}, {"cpu": 500}),
        ({"cpu": 500}, {"cpu": 800, "memory": 10}),
        ({"nvidia.com/gpu": 0}, {}),
        ({"cpu": -5}, {}),
    ],
)
def test_fits_is_no_shortfall(need: dict[str, int], free: dict[str, int]) -> None:
    assert fits(need, free) == (not shortfall(need, free))
