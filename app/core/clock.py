"""The one clock: monotonic seconds for durations and deadlines, wall time only for the API.

Every component that measures time takes a `Clock` (tests pass a fake one)
and defaults to `monotonic`: a wall clock stepped by NTP must not time out a
gang or expire a cache. Wall time (`wall`) is read only where the API wants
a timestamp or compares with one (Events, PodGroup status, Lease renewals,
pod ages from creationTimestamp). asyncio's timers are armed with relative
delays computed from this clock, never with `loop.time()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]

monotonic: Clock = time.monotonic
wall: Clock = time.time
