"""Cold rows that pulls read from disk without giving them a row in RAM: a disk table's first-touch buffer.

A disk table's pull of a key on disk reads its record and answers from it; the key takes a hot
row (and sends another row out, written to disk if it was pushed) only when it is asked for a
second time while its record is still staged here, or pushed. Why: the keys a request reads once
and never again (a trainer's long tail, a scan of many ids by an evaluation or an export check)
would otherwise push out rows that are asked for all the time, and each of them costs a hot row's
eviction and often a write; a trainer's pull followed by the push of the same keys finds the
records here and reads the disk once, as before. It is the first queue of the 2Q policy (Johnson
and Shasha, VLDB 1994) in front of the CLOCK rule of :mod:`.disk_store`, holding records rather
than keys only, so that a second touch soon after costs no second read.

Records are kept per request that staged them (a generation), newest last, until the generations
hold more than ``capacity`` records; then the oldest go. A record here is a clean copy of the
key's record on disk, for a key not in RAM: the owner clears the buffer whenever it changes the
records on disk other than by sending hot rows out (a shrink, a save's delta scores, deletions,
a load).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass
class _Generation:
    keys: np.ndarray  # int64, ascending, distinct
    records: np.ndarray  # uint8[n, record bytes]
    live: np.ndarray  # bool[n]: not taken since


class StagedRows:
    """At most about ``capacity`` records of ``record_nbytes`` bytes by key, oldest out first."""

    #: bytes a record costs besides its own: its key and its live flag
    EXTRA_NBYTES = 8 + 1

    def __init__(self, capacity: int, record_nbytes: int) -> None:
        self.capacity = capacity
        self.record_nbytes = record_nbytes
        self._generations: deque[_Generation] = deque()
        self._held = 0  # records in every generation, taken ones included (their bytes are still held)

    @classmethod
    def within(cls, nbytes: int, record_nbytes: int) -> StagedRows:
        """A buffer of as many records as ``nbytes`` of RAM hold."""
        return cls(nbytes // (record_nbytes + cls.EXTRA_NBYTES), record_nbytes)

    def __len__(self) -> int:
        return self._held

    @property
    def nbytes(self) -> int:
        """Bytes of the records held and their keys."""
        return self._held * (self.record_nbytes + self.EXTRA_NBYTES)

    def add(self, keys: np.ndarray, records: np.ndarray) -> None:
        """Stage the records of ``keys`` (ascending, distinct, none staged already); the oldest
        generations go while more than ``capacity`` are held. A request's records beyond the
        capacity are not staged."""
        if not keys.shape[0] or self.capacity <= 0:
            return
        keys, records = keys[: self.capacity], records[: self.capacity]
        self._generations.append(_Generation(keys, records, np.ones(keys.shape[0], np.bool_)))
        self._held += keys.shape[0]
        while self._held > self.capacity:
            self._held -= self._generations.popleft().keys.shape[0]

    def take(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The staged records of ``keys`` (distinct), which leave the buffer: (a boolean mask of
        the keys found, uint8[found, record_nbytes] in the order of the keys found), each the
        newest staged for its key."""
        found = np.zeros(keys.shape[0], np.bool_)
        source = np.full(keys.shape[0], -1, np.int64)
        parts: list[np.ndarray] = []
        at = 0
        for generation in reversed(self._generations):
            if not generation.live.any():
                continue
            place = np.minimum(np.searchsorted(generation.keys, keys), generation.keys.shape[0] - 1)
            match = (generation.keys[place] == keys) & generation.live[place]
            if not match.any():
                continue
            generation.live[place[match]] = False  # an older copy goes too: it would be stale
            hit = match & ~found
            rows = place[hit]
            parts.append(generation.records[rows])
            source[hit] = np.arange(at, at + rows.shape[0])
            at += rows.shape[0]
            found |= hit
        if not parts:
            return found, np.empty((0, self.record_nbytes), np.uint8)
        records = np.concatenate(parts)
        return found, records[source[found]]

    def clear(self) -> None:
        """Forget every staged record (the records on disk changed)."""
        self._generations.clear()
        self._held = 0
