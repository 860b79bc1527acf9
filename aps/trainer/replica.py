"""GEO's replicas of sparse tables: what the exchange asks of a fixed table's replica and of a
hash table's cache alike (:class:`GeoReplica`), so that one exchange loop serves both.

A fixed table's replica (:class:`FixedReplica`) is the whole table in the trainer's shared
memory, rows addressed by id, with an ``old`` copy as of the last exchange; a hash table's is a
bounded cache of rows by key (:class:`~aps.trainer.local_cache.LocalCache`), which carries shows
and clicks too. Both give the rows written since the last exchange as ``(ids or keys, deltas,
counts)`` (``delta = (local - old) * scale``, ``old += delta``) and take the rows other trainers
changed as ``local += server - old; old = server``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .kernels import geo_apply, geo_delta


class GeoReplica(Protocol):
    def take_changes(self, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The rows written since the last call: (ids or keys, unique and ascending for a fixed
        table, deltas, shows and clicks per row or None when the table keeps none)."""

    def apply_server(self, keys: np.ndarray, values: np.ndarray) -> int:
        """The rows other trainers changed on the pservers; returns how many it applied."""


class FixedReplica:
    """A fixed table's replica: ``local`` (the shared parameters the workers write), ``dirty``
    (the flags they set after writing a row) and ``old`` (the rows as of the last exchange)."""

    def __init__(self, local: np.ndarray, dirty: np.ndarray) -> None:
        self.local = local
        self.dirty = dirty
        self.old = local.copy()

    def take_changes(self, scale: float) -> tuple[np.ndarray, np.ndarray, None]:
        # workers keep setting flags meanwhile: scan a snapshot. A row written after the
        # snapshot keeps (or gets again) its flag, because workers write rows first and set
        # flags after, and deltas are read only after the clear below.
        ids = np.flatnonzero(self.dirty.copy()).astype(np.int64)
        self.dirty[ids] = 0
        delta = np.empty((len(ids), self.local.shape[1]), dtype=np.float32)
        if len(ids):
            geo_delta(self.local, self.old, ids, scale, delta)
        return ids, delta, None

    def apply_server(self, keys: np.ndarray, values: np.ndarray) -> int:
        if len(keys):
            geo_apply(self.local, self.old, keys, values)
        return len(keys)
