"""Exports for serving from an online trainer's pass loop (``--export-dir``).

After a pass, trainer 0 writes (``PSClient.export``, read by ``aps-serve``):

* a **base** after the first pass of the run (a delta needs a base the pservers wrote since they
  started or loaded a checkpoint, so a resumed run starts with one too), and after the first pass
  of every ``base_every``-th new day, once every hash table was shrunk (``PSClient.shrink``
  with its defaults: decayed shows and clicks, keys under the score threshold evicted), as the
  reference's users write a base model a day;
* a **delta** every ``delta_every`` passes otherwise: the keys whose delta score passed its
  threshold since the last base or delta, dense tables whole.

A pass's day is its folder's day for pass folders and the UTC date it was read for a stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from ..client import PSClient
from ..errors import ConfigError
from ..specs import HashTable
from .model import Model
from .sources.base import Pass

log = structlog.get_logger("aps.trainer")


@dataclass
class ExportOptions:
    #: the export root (relative: to the pservers' checkpoint root), as ``PSClient.export`` takes it
    root: str
    #: a delta export every N passes
    delta_every: int = 1
    #: shrink and a base export every N days
    base_every: int = 1

    def __post_init__(self) -> None:
        if self.delta_every < 1 or self.base_every < 1:
            raise ConfigError(f"--delta-every and --base-every must be >= 1, got {self.delta_every}, {self.base_every}")


def hash_tables(model: Model) -> list[str]:
    """Names of the model's hash tables: those a day tick shrinks and ``max_keys`` bounds."""
    return [t.name for t in model.tables() if isinstance(t, HashTable)]


class Exporter:
    """Decides after each pass whether to export, and what (see the module)."""

    def __init__(self, options: ExportOptions, model: Model) -> None:
        self.options = options
        self.hash_tables = hash_tables(model)
        self._have_base = False
        self._day: str | None = None
        self._days = 0  # new days since the last base
        self._passes = 0  # passes since the last export

    async def after_pass(self, ps: PSClient, p: Pass) -> dict[str, Any]:
        """Export if one is due after ``p``; returns what the pass's record should say."""
        new_day = self._day is not None and p.day != self._day
        self._day = p.day
        self._days += int(new_day)
        self._passes += 1
        out: dict[str, Any] = {}
        if not self._have_base or (new_day and self._days >= self.options.base_every):
            if self._have_base:  # a day boundary: forget what nobody sees any more, then a base
                out["evicted"] = {name: await ps.shrink(name) for name in self.hash_tables}
            kind = "base"
        elif self._passes >= self.options.delta_every:
            kind = "delta"
        else:
            return out
        info = await ps.export(self.options.root, kind)
        self._have_base = True
        self._passes = 0
        if kind == "base":
            self._days = 0
        log.info("exported", kind=kind, version=info.version, base_version=info.base_version, path=info.path,
                 after_pass=p.name, **{f"evicted_{k}": v for k, v in out.get("evicted", {}).items()})
        return {**out, "export": info.version, "export_kind": kind}
