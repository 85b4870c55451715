"""The Kubernetes API's int32 fields (counts and minimums in group objects and annotations).

One reading of "a whole number the API could hold": each source names its
own field and error in its message, the range is checked here.
"""

from __future__ import annotations

from typing import Any, TypeGuard

INT32_MAX = 2**31 - 1


def is_int32(value: Any, minimum: int) -> TypeGuard[int]:
    """An int (a bool is none) from `minimum` to int32's largest."""
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= INT32_MAX
