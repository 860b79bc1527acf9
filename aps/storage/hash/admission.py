"""Which new keys a hash table admits (DeepRec's feature filters, Paddle's entry rules): every
occurrence of a key not held yet is counted in one bounded pending counter, and the key is
admitted once it has been seen ``admit_count`` times and passes its ``admit_probability`` draw.

The counter is a second open-addressing index (:class:`~aps.storage.hash.index.HashIndex`) of
``pending_keys`` rows; when a push brings more unseen keys than it has free rows it starts over
(:attr:`KeyAdmission.resets` counts that), so its memory never grows. A checkpoint keeps what it
counts (:meth:`items`, :meth:`restore`), so a load does not start the counts over. The draws
are counter-based (the key, the table's seed and the push count), so they repeat exactly.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...specs import HashTable
from ..init_kernels import key_uniform, mix64
from .index import HashIndex

_ADMIT_SALT = np.uint64(0x5851F42D4C957F2D)


@njit(cache=True, nogil=True)
def _admit_draws(seed: np.uint64, keys: np.ndarray, counts: np.ndarray, counter: np.uint64, p: float, out: np.ndarray) -> None:
    """``out[i]``: key i wins its draw, with probability ``1 - (1 - p)^counts[i]``."""
    miss = 1.0 - p
    for i in range(keys.shape[0]):
        out[i] = key_uniform(seed, keys[i], counter) < 1.0 - miss ** counts[i]


class KeyAdmission:
    """The admission rules of one hash table's shard; ``seed``: the table's."""

    def __init__(self, spec: HashTable, seed: int) -> None:
        self.spec = spec
        self._seed = np.uint64(mix64(np.uint64(seed) ^ _ADMIT_SALT))
        self._pending = HashIndex(spec.pending_keys) if spec.admit_count > 1 else None
        self._counts = np.zeros(spec.pending_keys if self._pending is not None else 0, np.int64)
        #: times the pending counter was full and started over
        self.resets = 0

    def passes(self, keys: np.ndarray, counts: np.ndarray, push: int) -> np.ndarray:
        """Which of the unique unseen ``keys`` (occurring ``counts`` times in push number
        ``push``) may be admitted now: a mask."""
        ok = np.ones(keys.shape[0], np.bool_)
        if self._pending is not None:
            ok &= self._count(keys, counts) >= self.spec.admit_count
        if self.spec.admit_probability < 1.0:
            draws = np.empty(keys.shape[0], np.bool_)
            _admit_draws(self._seed, keys, counts, np.uint64(push), self.spec.admit_probability, draws)
            ok &= draws
        return ok

    def admitted(self, keys: np.ndarray) -> None:
        """``keys`` were admitted: they are counted no more."""
        if self._pending is not None and keys.size:
            self._counts[self._pending.delete(keys)] = 0

    def _count(self, keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Add this push's occurrences to each pending key's counter; the counts so far."""
        pending = self._pending
        assert pending is not None
        if int((pending.lookup(keys) < 0).sum()) > pending.free_rows:
            self._pending = pending = HashIndex(pending.row_capacity)
            self._counts[:] = 0
            self.resets += 1
        fit = min(keys.shape[0], pending.free_rows)  # more new keys than the bound: count a prefix
        totals = counts.astype(np.int64)
        at = pending.insert(keys[:fit])
        np.add.at(self._counts, at, counts[:fit])
        totals[:fit] = self._counts[at]
        return totals

    @property
    def nbytes(self) -> int:
        return self._pending.nbytes + self._counts.nbytes if self._pending is not None else 0

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys being counted and their counts (empty without ``admit_count``)."""
        if self._pending is None:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        keys, at = self._pending.items()
        return keys, self._counts[at]

    def replace(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Count exactly these keys (a delta's counters replace a base's)."""
        if self._pending is not None:
            self._pending = HashIndex(self._pending.row_capacity)
            self._counts[:] = 0
            self.restore(keys, counts)

    def restore(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add saved counters (a checkpoint load); what does not fit the bound starts over."""
        if self._pending is not None:
            fit = min(keys.shape[0], self._pending.free_rows)
            self._counts[self._pending.insert(keys[:fit])] = counts[:fit]
