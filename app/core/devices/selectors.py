"""CEL device selectors evaluated for counting: each selector once per kind of device.

The engine (app/runtime/device_cel.py, wired in app/server.py) compiles and
evaluates. A selector it cannot compile (CompileError), one that fails on a
device (EvaluationError), or any when no engine is wired, counts by class
alone: a warning in the log, the selector in `fallbacks` (/debug/caches, the
metric gang_extender_device_selectors_by_class), never a crash. A selector
that does not compile is not a user's error that reaches us: the API server
compiles each one when a DeviceClass, claim or template is created and
refuses it ("compilation failed", tests/cluster/test_dra.py), so one our
library cannot compile uses a CEL feature it lacks, and kube-scheduler still
applies it when it allocates.
"""

from __future__ import annotations

import logging

from app.core.devices.records import (
    Device,
    EvaluationError,
    SelectorEngine,
    SelectorError,
)

log = logging.getLogger(__name__)

# Distinct (selector, device) pairs remembered: a cluster's devices are mostly
# alike (8 GPUs of one model a node), so this holds every pair many times over.
_MAX_RESULTS = 100_000


class Selectors:
    def __init__(self, engine: SelectorEngine) -> None:
        self.engine = engine
        # Selector text -> why it is counted by class alone.
        self.fallbacks: dict[str, str] = {}
        # (selector, device content) -> whether it passes: identical devices are evaluated once.
        self._results: dict[tuple[str, bytes], bool] = {}

    def passes(self, device: Device, selectors: tuple[str, ...]) -> bool:
        """Whether the device passes every one of `selectors`."""
        for text in selectors:
            result = self._results.get((text, device.content))
            if result is None:
                try:
                    result = self.engine.matches(self.engine.compile(text), device.value)
                except EvaluationError as err:
                    self._fallback(text, f"CEL selector {text!r:.120} fails on a device ({err})")
                    result = True  # counted by class alone
                except SelectorError as err:
                    self._fallback(text, str(err))
                    result = True  # counted by class alone
                if len(self._results) > _MAX_RESULTS:
                    self._results.clear()
                self._results[(text, device.content)] = result
            if not result:
                return False
        return True

    def compiles(self, text: str) -> bool:
        """Whether the engine can evaluate it; if not, it counts by class (and says so)."""
        try:
            self.engine.compile(text)
        except SelectorError as err:
            self._fallback(text, str(err))
            return False
        return True

    def _fallback(self, text: str, why: str) -> None:
        if text not in self.fallbacks:
            log.warning("%s; its devices are counted by class alone", why)
            self.fallbacks[text] = why
