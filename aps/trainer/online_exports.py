"""Exports for serving from an online trainer's pass loop (``--export-dir``).

After a pass, trainer 0 writes (``PSClient.export``, read by ``aps-serve``):

* the **day tick**: before the first pass of a new day is trained, every hash table's day
  advances by one (``PSClient.shrink(days=1)``: keys unseen for more than the table's
  ``ttl_days`` go), and on a day a base is due its keys are also shrunk by score (the defaults:
  decayed shows and clicks, keys under the score threshold evicted); every trainer waits for it
  at a barrier, so the new day's pushes are marked seen on the new day;
* a **base** after the first pass of the run (a delta needs a base the pservers wrote since they
  started or loaded a checkpoint, so a resumed run starts with one too), and after the first pass
  of every ``base_every``-th new day, after its tick, as the reference's users write a base
  model a day;
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
from ..storage.hash.accessor import check_export_rows
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
    #: what the exports write hash tables' rows as (``PSClient.export``'s ``rows``)
    rows: str = "stored"

    def __post_init__(self) -> None:
        if self.delta_every < 1 or self.base_every < 1:
            raise ConfigError(f"--delta-every and --base-every must be >= 1, got {self.delta_every}, {self.base_every}")
        check_export_rows(self.rows, "--export-rows")


def hash_tables(model: Model) -> list[str]:
    """Names of the model's hash tables: those a day tick shrinks and ``max_keys`` bounds."""
    return [t.name for t in model.tables() if t.keyed]


class Exporter:
    """Decides after each pass whether to export, and what (see the module)."""

    def __init__(self, options: ExportOptions, model: Model) -> None:
        self.options = options
        self.hash_tables = hash_tables(model)
        self._have_base = False
        self._day: str | None = None
        self._days = 0  # new days since the last base
        self._passes = 0  # passes since the last export
        self._base_due = False  # a base after the pass being trained

    async def before_training(self, ps: PSClient, p: Pass) -> dict[str, Any]:
        """The day tick, when ``p`` is the first pass of a new day (trainer 0, before any trainer
        trains it, so the new day's keys are marked seen on the new day): every hash table's day
        advances by one, and its keys are shrunk by score when a base is due after this pass,
        else only aged (``ttl_days``). Returns what the pass's record should say."""
        new_day = self._day is not None and p.day != self._day
        self._day = p.day
        if not self._have_base:
            self._base_due = True
            return {}
        if not new_day:
            return {}
        self._days += 1
        self._base_due = self._days >= self.options.base_every
        # by score on a base's day; otherwise no score is under 0: only the days unseen count
        rule = {} if self._base_due else {"decay": 1.0, "threshold": 0.0}
        evicted = {name: await ps.shrink(name, days=1, **rule) for name in self.hash_tables}
        log.info("day tick", day=p.day, before_pass=p.name, shrunk_by_score=self._base_due,
                 **{f"evicted_{k}": v for k, v in evicted.items()})
        return {"evicted": evicted}

    async def after_pass(self, ps: PSClient, p: Pass) -> dict[str, Any]:
        """Export if one is due after ``p``; returns what the pass's record should say."""
        self._passes += 1
        if self._base_due:
            kind = "base"
        elif self._passes >= self.options.delta_every:
            kind = "delta"
        else:
            return {}
        info = await ps.export(self.options.root, kind, rows=self.options.rows)
        self._have_base = True
        self._passes = 0
        if kind == "base":
            self._days, self._base_due = 0, False
        log.info("exported", kind=kind, version=info.version, base_version=info.base_version, path=info.path, after_pass=p.name)
        return {"export": info.version, "export_kind": kind}
