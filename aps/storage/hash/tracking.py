"""Change tracking (GEO) on a hash table's store: the bitmaps of :class:`ChangeTracking` over
slab rows, and what a hash table adds to them.

Rows are slab rows, so a reply needs each row's key: the store keeps a row -> key array, but
only from the first changed-row read on (8 bytes a row, paid only by tables GEO reads). A row
whose key was evicted is skipped (its key is not held, or holds another row); a key admitted
again takes a fresh row, which the push marks, so GEO readers get it again. A mixin of
:class:`~aps.storage.hash.store.HashSparseStore`, whose index, slab and capacity it reads.
"""

from __future__ import annotations

import numpy as np

from ..tracking import ChangeTracking
from .compact import read_rows
from .index import HashIndex


class HashChangeTracking(ChangeTracking):
    """Change tracking over a hash store's slab rows (see the module's note)."""

    index: HashIndex
    values: np.ndarray
    _row_keys: np.ndarray | None

    @property
    def capacity(self) -> int:
        """Slab rows reserved."""
        return self.index.row_capacity

    def _init_hash_tracking(self, rows: int) -> None:
        self._init_tracking(rows)
        #: slab row -> its key, kept from the first changed-row read on: None before
        self._row_keys = None

    def track(self, client_id: int) -> None:
        """As :meth:`ChangeTracking.track`; the first tracked client makes the store keep each
        slab row's key from now on (8 bytes a row, only for tables GEO reads)."""
        if self._row_keys is None:
            keys, rows = self.index.items()
            self._row_keys = np.zeros(self.capacity, np.int64)
            self._row_keys[rows] = keys
        super().track(client_id)

    def _note_keys(self, keys: np.ndarray, rows: np.ndarray) -> None:
        if self._row_keys is None or not rows.size:
            return
        if self._row_keys.shape[0] < self.capacity:
            wider = np.zeros(self.capacity, np.int64)
            wider[: self._row_keys.shape[0]] = self._row_keys
            self._row_keys = wider
        self._row_keys[rows] = keys

    def changed(self, client_id: int) -> np.ndarray:
        """Rows changed by others since ``client_id``'s last call whose keys are still held
        (an evicted key's row is skipped; admitted again, it is marked again)."""
        return self._held(super().changed(client_id))

    def _held(self, rows: np.ndarray) -> np.ndarray:
        if not rows.size:
            return rows
        assert self._row_keys is not None  # a tracked client exists
        rows = rows[rows < self._row_keys.shape[0]]
        return rows[self.index.lookup(self._row_keys[rows]) == rows]

    def all_rows(self) -> np.ndarray:
        """Every held key's row, ascending: what a client whose tracking was dropped reads next."""
        return np.sort(self.index.items()[1])

    def changed_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys, float32 values) of held ``rows``: what a changed-row read sends."""
        assert self._row_keys is not None
        return self._row_keys[rows], read_rows(self.values, rows)

    def _mark_pushed(self, rows: np.ndarray, new: np.ndarray, client: int | None) -> None:
        """Change tracking: the pushed rows are marked for every tracked client but the pusher,
        and rows just admitted for the pusher too (a key evicted and admitted again starts
        from its initial row, which is not what the pusher holds of it)."""
        if self._dirty:
            self._mark(rows, client)
            if client is not None and new.size and self.is_tracked(client):
                self.mark_for(client, new)
