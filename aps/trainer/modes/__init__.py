"""The training modes, one class each (docs/modes.md has one section per module):

* ``sync`` and ``half_async``: :mod:`.step_group` (:class:`SyncStepGroup`, :class:`HalfAsyncStepGroup`);
* ``async``: :mod:`.async_sender` (:class:`AsyncSender`);
* ``geo``: :mod:`.geo` (:class:`GeoExchange`);
* ``hybrid``: :mod:`.hybrid` (:class:`HybridRounds`).

:func:`mode_class` is the one place where a mode's name is read; everything else asks the class
(its flags) or the object built from it.
"""

from __future__ import annotations

from ...errors import ConfigError
from .async_sender import AsyncSender
from .base import Link, Mode
from .geo import GeoExchange
from .hybrid import HybridRounds
from .step_group import HalfAsyncStepGroup, StepGroup, SyncStepGroup

_CLASSES: dict[str, type[Mode]] = {
    kind.name: kind for kind in (SyncStepGroup, HalfAsyncStepGroup, AsyncSender, GeoExchange, HybridRounds)
}


def mode_class(name: str) -> type[Mode]:
    """The class implementing mode ``name`` (as in ``Strategy.mode``)."""
    try:
        return _CLASSES[name]
    except KeyError:
        raise ConfigError(f"mode must be one of {', '.join(_CLASSES)}, got {name!r}") from None


__all__ = [
    "AsyncSender",
    "GeoExchange",
    "HalfAsyncStepGroup",
    "HybridRounds",
    "Link",
    "Mode",
    "StepGroup",
    "SyncStepGroup",
    "mode_class",
]
