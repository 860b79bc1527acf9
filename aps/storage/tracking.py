"""Change tracking for GEO clients, bounded over the whole server.

A client that asks a sparse table for its changed rows gets a bitmap on that table's shard: one
*bit* per local row (tables.py), set when another client changes the row, cleared when the client
reads it. Those bitmaps live on after the client disconnects (for ``client_linger`` seconds), so
that a client that comes back gets exactly what changed meanwhile. Left alone, that memory grows
with the number of client ids that ever asked, and every push marks every bitmap.

So all of it is charged to one server-wide budget (:class:`TrackingBudget`, ``max_tracking_bytes``):
each bitmap plus a fixed overhead per (client, table). Changed rows a reply had no room for are
marked again in the reader's own bitmap, so they cost nothing more. When a client starts tracking a table and the total passes the budget, tracking is
dropped: gone clients first (the one gone longest first), then connected ones, least recently
read first; never the entry just read. Nothing is lost by it: a (client, table) whose tracking
was dropped is remembered in :class:`DroppedFilter`, and its next read returns *every* row of the
shard, as after a server restart (more data, never a missed change).

:class:`DroppedFilter` is a Bloom filter of fixed size: it never says "not dropped" for a pair
that was dropped; it may, rarely, say "dropped" for a new client, which then also gets every row
once. Its false positive rate is about 1e-3 after 100 000 drops.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
from numba import njit

#: bytes charged per tracked (client, table) on top of its arrays: the dict entries that hold it
ENTRY_OVERHEAD = 256


@njit(cache=True, nogil=True)
def mark_rows(bits: np.ndarray, ids: np.ndarray) -> None:  # pragma: no cover - compiled
    """Set bit ``id`` of the packed bitmap ``bits`` (uint8, little bit order) for every id."""
    for i in range(ids.shape[0]):
        row = ids[i]
        bits[row >> 3] |= np.uint8(1 << (row & 7))


@njit(cache=True, nogil=True)
def take_marked(bits: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """The ids whose bit is set, ascending int64, and clear them."""
    count = 0
    for i in range(bits.shape[0]):
        byte = bits[i]
        while byte:
            byte &= byte - np.uint8(1)
            count += 1
    out = np.empty(count, dtype=np.int64)
    k = 0
    for i in range(bits.shape[0]):
        byte = bits[i]
        if byte:
            for j in range(8):
                if (byte >> j) & 1:
                    out[k] = i * 8 + j
                    k += 1
            bits[i] = 0
    return out


def bitmap_bytes(rows: int) -> int:
    """Bytes of a packed bitmap of ``rows`` rows."""
    return (rows + 7) // 8


class ChangeTracking:
    """Per-client change bitmaps over a shard's rows (GEO): what a fixed table's shard and a hash
    table's store share. Each tracked client has one bit per row, set when another client changes
    the row and cleared when the client reads it. The shard says how many rows it has
    (:meth:`_init_tracking`, and :attr:`_tracked_rows` may grow later: a hash table's slab doubles);
    bitmaps are widened on the event loop when next used, never under a reader."""

    _dirty: dict[int, np.ndarray]
    _tracked_rows: int

    def _init_tracking(self, rows: int) -> None:
        self._dirty = {}
        self._tracked_rows = rows

    def _bitmap(self, client_id: int) -> np.ndarray:
        """``client_id``'s bitmap, widened to the rows the shard has now."""
        bitmap = self._dirty[client_id]
        size = bitmap_bytes(self._tracked_rows)
        if bitmap.shape[0] < size:
            wider = np.zeros(size, dtype=np.uint8)
            wider[: bitmap.shape[0]] = bitmap
            bitmap = self._dirty[client_id] = wider
        return bitmap

    def track(self, client_id: int) -> None:
        """Start recording, for ``client_id``, rows that other clients change (idempotent)."""
        client_id = int(client_id)
        if client_id not in self._dirty:
            self._dirty[client_id] = np.zeros(bitmap_bytes(self._tracked_rows), dtype=np.uint8)

    @property
    def tracking_bytes(self) -> int:
        """Bytes of one client's change-tracking bitmap on this shard."""
        return bitmap_bytes(self._tracked_rows)

    @property
    def tracking_nbytes(self) -> int:
        """Bytes of every client's bitmap on this shard."""
        return sum(b.nbytes for b in self._dirty.values())

    def changed(self, client_id: int) -> np.ndarray:
        """Rows changed by others since the last call, int64 ascending; clears them.

        The first call registers the client and returns nothing: a new client pulls full rows
        anyway, so it only needs changes from now on.
        """
        client_id = int(client_id)
        if client_id not in self._dirty:
            self.track(client_id)
            return np.empty(0, dtype=np.int64)
        return take_marked(self._bitmap(client_id))

    def mark_for(self, client_id: int, rows: np.ndarray) -> None:
        """Mark ``rows`` (valid int64 rows) changed for ``client_id`` alone: rows a read could
        not fit in its reply, sent by its next read. The client must be tracked."""
        mark_rows(self._bitmap(int(client_id)), rows)

    def take_marks(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """For each tracked client, which of ``rows`` (valid int64 rows) are marked changed for
        it (a boolean mask), clearing those marks: rows whose keys leave the shard's rows (a disk
        table sending them to disk) take their marks along."""
        byte, bit = rows >> 3, (rows & 7).astype(np.uint8)
        taken = {}
        for client in list(self._dirty):
            bitmap = self._bitmap(client)
            marked = (bitmap[byte] >> bit) & 1 == 1
            if marked.any():
                np.bitwise_and.at(bitmap, byte[marked], ~(np.uint8(1) << bit[marked]))
                taken[client] = marked
        return taken

    def is_tracked(self, client_id: int) -> bool:
        return int(client_id) in self._dirty

    def untrack(self, client_id: int) -> bool:
        """Stop recording changes for ``client_id`` (it went away); True if it was tracked."""
        return self._dirty.pop(int(client_id), None) is not None

    def _mark(self, rows: np.ndarray, client: int | None) -> None:
        """Mark ``rows`` dirty for every tracked client except the one that pushed them.

        A push without a client id is a change nobody has seen, so every tracked client gets it.
        """
        if not rows.size or not self._dirty:
            return
        for other in list(self._dirty):
            if client is None or other != client:
                mark_rows(self._bitmap(other), rows)


class DroppedFilter:
    """The (client, table) pairs whose change tracking was dropped: a Bloom filter of ``bits``
    bits and ``hashes`` probes (no false "not dropped"; rare false "dropped")."""

    def __init__(self, bits: int = 1 << 21, hashes: int = 4) -> None:
        if bits < 8 or bits & (bits - 1) or not 1 <= hashes <= 8:
            raise ValueError(f"need a power-of-two number of bits >= 8 and 1..8 hashes, got {bits}, {hashes}")
        self._bits = np.zeros(bits // 8, dtype=np.uint8)
        self._mask = bits - 1
        self._hashes = hashes
        self.added = 0

    def _probes(self, client_id: int, table: str) -> list[int]:
        digest = hashlib.blake2b(f"{client_id:x}/{table}".encode(), digest_size=4 * self._hashes).digest()
        return [int.from_bytes(digest[4 * i : 4 * i + 4], "little") & self._mask for i in range(self._hashes)]

    def add(self, client_id: int, table: str) -> None:
        for bit in self._probes(client_id, table):
            self._bits[bit >> 3] |= np.uint8(1 << (bit & 7))
        self.added += 1

    def __contains__(self, key: tuple[int, str]) -> bool:
        return all(self._bits[bit >> 3] >> (bit & 7) & 1 for bit in self._probes(*key))

    @property
    def nbytes(self) -> int:
        return int(self._bits.nbytes)


class TrackingBudget:
    """Which (client, table) pairs are tracked, their bytes, and which to drop over the budget.

    The ledger only decides; the caller (the server core) drops what it is told to drop from the
    shards and calls :meth:`dropped` for each. ``max_bytes`` 0: no budget.
    """

    def __init__(self, max_bytes: int, dropped: DroppedFilter | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        #: (client, table) -> bytes charged, least recently read first
        self._entries: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._tables_of: dict[int, set[str]] = {}
        #: clients with no connection open, the one gone longest first
        self._gone: OrderedDict[int, None] = OrderedDict()
        self.dropped_pairs = dropped if dropped is not None else DroppedFilter()
        self.dropped_over_budget = 0

    def __len__(self) -> int:
        return len(self._entries)

    def charged(self, client_id: int, table: str) -> int:
        """Bytes charged for ``(client_id, table)`` (0: not tracked)."""
        return self._entries.get((client_id, table), 0)

    def read(self, client_id: int, table: str, nbytes: int) -> list[tuple[int, str]]:
        """``client_id`` read ``table``'s changes and holds an ``nbytes`` bitmap for it. Returns
        the pairs to drop to get back under the budget."""
        key = (client_id, table)
        self.bytes += nbytes + ENTRY_OVERHEAD - self._entries.get(key, 0)
        self._entries[key] = nbytes + ENTRY_OVERHEAD
        self._entries.move_to_end(key)
        self._tables_of.setdefault(client_id, set()).add(table)
        return self._over_budget(key)

    def _over_budget(self, keep: tuple[int, str]) -> list[tuple[int, str]]:
        if not self.max_bytes or self.bytes <= self.max_bytes:
            return []
        victims: list[tuple[int, str]] = []
        excess = self.bytes - self.max_bytes
        for client_id in self._gone:  # gone clients first, the one gone longest first
            for table in sorted(self._tables_of.get(client_id, ())):
                if excess <= 0:
                    return victims
                if (client_id, table) == keep:
                    continue
                victims.append((client_id, table))
                excess -= self._entries[(client_id, table)]
        for key, nbytes in self._entries.items():  # then connected ones, least recently read first
            if excess <= 0:
                break
            if key != keep and key[0] not in self._gone:
                victims.append(key)
                excess -= nbytes
        return victims

    def dropped(self, client_id: int, table: str, *, over_budget: bool) -> None:
        """The shard no longer tracks ``(client_id, table)``: forget its bytes, remember the drop
        (its next read must return every row)."""
        nbytes = self._entries.pop((client_id, table), None)
        if nbytes is None:
            return
        self.bytes -= nbytes
        tables = self._tables_of[client_id]
        tables.discard(table)
        if not tables:
            del self._tables_of[client_id]
            self._gone.pop(client_id, None)
        self.dropped_pairs.add(client_id, table)
        self.dropped_over_budget += int(over_budget)

    def drop_all(self) -> None:
        """The tables were replaced (a LOAD): any row may differ from what any client has, and
        the new shards track nobody, so every tracked pair counts as dropped."""
        for client_id, table in self._entries:
            self.dropped_pairs.add(client_id, table)
        self._entries.clear()
        self._tables_of.clear()
        self._gone.clear()
        self.bytes = 0

    def was_dropped(self, client_id: int, table: str) -> bool:
        return (client_id, table) in self.dropped_pairs

    def tables_of(self, client_id: int) -> list[str]:
        """The tables ``client_id`` is tracked on."""
        return sorted(self._tables_of.get(client_id, ()))

    def gone(self, client_id: int) -> None:
        """``client_id`` closed its last connection (its tracking is dropped first from now)."""
        if client_id in self._tables_of:
            self._gone[client_id] = None
            self._gone.move_to_end(client_id)

    def back(self, client_id: int) -> None:
        """``client_id`` connected again."""
        self._gone.pop(client_id, None)
