"""DRA devices in the gang rules: the objects as slim records, devices counted as resources.

See docs/dra.md. The CEL engine that evaluates selectors lives in app/runtime/device_cel.py
(its package loads asyncio, which the rules must not)."""
