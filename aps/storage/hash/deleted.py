"""The keys a hash table's shard deleted since its last base or delta save, which the next delta
save writes (``deleted_keys``, aps/checkpoints/hash_files.py): so aps-serve, and a pserver
loading a base and its deltas, stop holding a key that a shrink, a ``max_keys`` eviction or a
TTL deleted at the next delta, not at the next base.

Memory: one int64 per key deleted, until the next base or delta save forgets them. There is no
bound, on purpose: a log that dropped keys past a bound would make a delta miss deletions, and
aps-serve would go on serving those keys with nothing to tell it; refusing the delta instead
would stop an online trainer's export loop. What keeps it small:

* nothing is recorded before the shard's first base or delta save (a pserver refuses a delta
  until it wrote a base, and a loaded shard starts anew), so a table that is never exported,
  or only saved ``full``, pays nothing;
* every base or delta save forgets what it covered (a base holds only live keys);
* once the log has doubled since it was last compacted, it is compacted to each key once. So
  it holds at most about twice the distinct keys deleted since the last base or delta save,
  8 bytes each.

A shard that wrote a base and then no delta for a long while keeps the keys it deletes in the
meantime: export deltas, or bases, regularly.
"""

from __future__ import annotations

import numpy as np

#: entries below which the log is never compacted (a compaction sorts it all)
_MIN_COMPACT = 1 << 16
_NO_KEYS = np.empty(0, np.int64)


class DeletedKeys:
    """The log of keys a shard deleted since its last base or delta save (the module's note)."""

    def __init__(self) -> None:
        #: False until the first base or delta save: no delta can follow before one
        self.recording = False
        self._parts: list[np.ndarray] = []
        self._entries = 0  # keys in _parts, repeats counted
        self._compacted = 0  # entries right after the last compaction

    @property
    def nbytes(self) -> int:
        """Bytes the log holds."""
        return self._entries * 8

    def note(self, keys: np.ndarray) -> None:
        """``keys`` (int64) were deleted just now."""
        if not self.recording or not keys.size:
            return
        self._parts.append(np.array(keys, np.int64))
        self._entries += keys.shape[0]
        if self._entries >= max(_MIN_COMPACT, 2 * self._compacted):
            self._keep(self.keys())

    def keys(self) -> np.ndarray:
        """The keys deleted since the last base or delta save, sorted, each once; some may be held
        again (deleted, then admitted again): the delta save decides what to list of those."""
        return np.unique(np.concatenate(self._parts)) if self._parts else _NO_KEYS

    def forget(self, keys: np.ndarray) -> None:
        """A base or delta save that covered ``keys`` (what :meth:`keys` gave it) is in place:
        drop them, and record from now on (a delta may follow)."""
        self.recording = True
        if self._parts:
            logged = np.concatenate(self._parts)
            self._keep(logged[~np.isin(logged, keys)])

    def _keep(self, keys: np.ndarray) -> None:
        self._parts = [keys] if keys.size else []
        self._entries = self._compacted = int(keys.shape[0])
