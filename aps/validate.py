"""Checks of the two kinds of setting every part of aps has: durations and counts.

A duration (a timeout, a deadline, a delay) is a finite number of seconds >= 0; a count (bytes,
connections, retries) is a whole number >= 0 that is not a bool (``True`` is an int in Python,
and ``max_connections=True`` is a slip, not a limit of one). For most limits 0 means "no limit";
each caller says what 0 (and, where allowed, None) means for its own setting, and the error names
the setting, so a wrong value fails loudly where it is given rather than later, deep in a loop.

Only the standard library is used: the client imports this, and ``import aps`` stays light.
"""

from __future__ import annotations

import math
import numbers

from .errors import ConfigError

__all__ = ["count", "seconds"]


def _meaning(zero: str | None, none: str | None) -> str:
    notes = [f"{label}: {text}" for label, text in (("0", zero), ("None", none)) if text]
    return f" ({'; '.join(notes)})" if notes else ""


def seconds(name: str, value: object, zero: str | None = "no limit", *, none: str | None = None) -> float | None:
    """``value`` as float seconds, after checking it is finite and >= 0.

    ``zero``: what 0 means for this setting (shown in the error); None when 0 is refused too, so
    the setting must be > 0. ``none``: what None means when None is allowed (then None is
    returned); by default None is refused. Raises :class:`ConfigError` naming ``name``.
    """
    if value is None and none is not None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if not ok or value < 0 or (zero is None and value == 0):  # type: ignore[operator]
        sign = ">= 0" if zero is not None else "> 0"
        raise ConfigError(f"{name} must be a number of seconds {sign}{_meaning(zero, none)}, got {value!r}")
    return float(value)


def count(name: str, value: object, unit: str = "", zero: str | None = "no limit", *, least: int = 0) -> int:
    """``value`` as int, after checking it is a whole number (not a bool) >= ``least``.

    ``unit``: what is counted (bytes, connections), shown in the error; ``zero``: what 0 means
    when ``least`` is 0. Raises :class:`ConfigError` naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        what = f"a number of {unit}" if unit else "an integer"
        raise ConfigError(f"{name} must be {what} >= {least}{_meaning(zero if least == 0 else None, None)}, got {value!r}")
    return int(value)
