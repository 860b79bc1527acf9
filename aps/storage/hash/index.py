"""An open-addressing hash index from int64 keys to rows of a slab, in numba arrays.

Why not a dict: a hash table shard holds tens of millions of keys, and a push looks up thousands
per request; a Python dict costs ~100 bytes and a bytecode round trip per key. Here a slot is
16 bytes, and every bulk operation is one compiled loop.

Layout. A slot array is int64[slots, 2]: (key, state) side by side, so a probe that finds its key
reads one cache line, not two. ``state == 0`` is an empty slot, ``-1`` a tombstone, ``r + 1`` a
slot holding slab row ``r``. The state is never in the key, so every int64 bit pattern (0, -1,
the extremes) is a valid key; and empty is 0 so a fresh slot array is ``np.zeros``, which the OS
maps lazily: creating a large table touches no memory. The probe starts at splitmix64(key)
masked to the power-of-two slot count and goes on linearly; a delete shifts the rest of its run
back over the hole (Knuth's algorithm R), so the current slot array never holds a tombstone and
a table kept full by evictions (a ``max_keys`` cap) never resizes to drop them; only an old
array being drained (below) marks deletes with tombstones, as its probes must cross them. Slab
rows come from a free list (rows deleted) and then from a high-water mark (rows never used), so
the slab itself never moves when keys come and go.

Resizing in pieces. When keys pass 70% of the slots, a new slot array is made (sized for 2x the
live keys) and the old one is drained into it *incrementally*, as Redis does: every key lives
in exactly one of the two, a lookup tries the new one then the old, an insert goes to the new
one, and each call moves ``RESIZE_PACE`` old slots per key it inserts, which ends the drain long
before the new array fills. A caller that wants the drain done sooner or at a quiet time calls
:meth:`rehash_step` with a slot budget (each call is O(budget), e.g. 1 M slots in a few ms)
between requests, or runs it in an executor thread (the kernels release the GIL) while no other
call uses the index: the index has one writer at a time, like every table on a pserver. The old
array is drained in slot order; a probe of it skips the slots below the drain's cursor (as if
tombstones: :func:`_find`), so the pages behind the cursor go back to the OS as the drain passes
them (:mod:`.pages`). The new slot array is written at random places from the resize's first
insert, so its pages would all be faulted in by that one call (0.4 s for 16 M slots on a 2-core
VM); an owner that must stay responsive makes it ahead with :meth:`prepare_resize` (in a thread,
once keys pass :data:`PREPARE_LOAD` of the slots), and the resize then starts on mapped memory.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...mixer import mix64
from ..pages import fault_in_zeros, release_pages
from ..prefetch import LINE, prefetch

_EMPTY = 0
_TOMB = -1
#: keys may fill at most this share of the slots before a resize starts
MAX_LOAD = 0.7
#: once keys fill this share of the slots, :meth:`HashIndex.resize_ahead_due` says to make the
#: next resize's slot array (the resize itself starts at :data:`MAX_LOAD`): late, as until the
#: resize drains the current array both are held (a push of new keys 5% of the slots is needed
#: to pass from here to the resize in one go; the owner makes it before the next insert)
PREPARE_LOAD = 0.65
#: old slots moved per inserted key while a resize drains (>= 4 ends the drain in time)
RESIZE_PACE = 8
#: rows are int32 on the free list
MAX_ROWS = (1 << 31) - 2
_KEY = 0  # slot columns
_ROW = 1
_MIN_SLOTS = 1024
#: a bulk call asks for key i + _AHEAD's slot while it probes key i, so a batch's cache misses
#: overlap instead of coming one after another (measured at 10 M keys: 10k lookups 170 us at 64,
#: 440 us probing one key at a time)
_AHEAD = 64
#: a gather asks for the slab lines of row i + _ROWS_AHEAD while it copies row i
_ROWS_AHEAD = 8

# meta: counters the kernels update in place
_LIVE = 0  # keys held (both slot arrays)
_USED = 1  # slots in use in the new slot array (its keys)
_NFREE = 2  # rows on the free list
_HIGH = 3  # rows [high, capacity) were never used
_OLD_LIVE = 4  # keys still in the old slot array
_CURSOR = 5  # old slots below it are drained: never read again, their pages given back


@njit(cache=True, nogil=True, inline="always")
def _start(key: np.int64, mask: int) -> int:
    return np.int64(mix64(np.uint64(key)) & np.uint64(mask))


@njit(cache=True, nogil=True)
def _find(t: np.ndarray, key: np.int64, lo: int) -> int:
    """The slot of ``t`` holding ``key``, or -1. ``lo``: 0, or for an old slot array being
    drained the drain's cursor: slots below it hold nothing live and may read as anything
    (their pages went back to the OS: zeros), so a probe skips them as if they were tombstones."""
    size = t.shape[0]
    if size == 0:
        return -1
    mask = size - 1
    s = _start(key, mask)
    for _ in range(size - lo):
        if s < lo:
            s = lo
        r = t[s, _ROW]
        if r == _EMPTY:
            return -1
        if r > 0 and t[s, _KEY] == key:
            return s
        s = (s + 1) & mask
    return -1


@njit(cache=True, nogil=True)
def _place(t: np.ndarray, key: np.int64, row: int) -> int:
    """Put ``key`` (known to be absent) in its first free slot; returns 1 if that slot was empty
    (one more slot in use), 0 if it was a tombstone."""
    mask = t.shape[0] - 1
    s = _start(key, mask)
    while t[s, _ROW] > 0:
        s = (s + 1) & mask
    fresh = 1 if t[s, _ROW] == _EMPTY else 0
    t[s, _KEY] = key
    t[s, _ROW] = row + 1
    return fresh


@njit(cache=True, nogil=True, inline="always")
def _ask(t, old, key):
    """Prefetch ``key``'s first slot in both slot arrays."""
    prefetch(t, _start(key, t.shape[0] - 1), 0)
    if old.shape[0]:
        prefetch(old, _start(key, old.shape[0] - 1), 0)


@njit(cache=True, nogil=True, inline="always")
def _row_of(t, old, lo, key):
    s = _find(t, key, 0)
    if s >= 0:
        return t[s, _ROW] - 1
    s = _find(old, key, lo)
    return old[s, _ROW] - 1 if s >= 0 else -1


@njit(cache=True, nogil=True)
def _lookup(t, old, lo, keys, out):
    n = keys.shape[0]
    for i in range(min(n, _AHEAD)):
        _ask(t, old, keys[i])
    for i in range(n):
        if i + _AHEAD < n:
            _ask(t, old, keys[i + _AHEAD])
        out[i] = _row_of(t, old, lo, keys[i])


@njit(cache=True, nogil=True)
def _gather(t, old, lo, keys, values, rows, out):
    """``rows[i]``: key i's row or -1; ``out[i] = values[rows[i]]`` for held keys, each row's
    lines asked for :data:`_ROWS_AHEAD` rows ahead. Returns how many keys are unknown."""
    _lookup(t, old, lo, keys, rows)
    n = keys.shape[0]
    dim = values.shape[1]
    row_bytes = dim * values.itemsize
    unknown = 0
    for i in range(n):
        j = i + _ROWS_AHEAD
        if j < n and rows[j] >= 0:
            for b in range(0, row_bytes, LINE):
                prefetch(values, rows[j], b)
        r = rows[i]
        if r < 0:
            unknown += 1
            continue
        for c in range(dim):
            out[i, c] = values[r, c]
    return unknown


@njit(cache=True, nogil=True)
def _insert(t, old, free, meta, max_used, keys, start, out):
    """Insert ``keys[start:]`` until done or the new slot array is full; returns where it stopped.
    The caller made sure there are enough free rows."""
    for i in range(start, keys.shape[0]):
        if i == start:
            for j in range(i, min(keys.shape[0], i + _AHEAD)):
                _ask(t, old, keys[j])
        elif i + _AHEAD < keys.shape[0]:
            _ask(t, old, keys[i + _AHEAD])
        key = keys[i]
        held = _row_of(t, old, meta[_CURSOR], key)
        if held >= 0:
            out[i] = held
            continue
        if meta[_USED] >= max_used:
            return i
        if meta[_NFREE] > 0:
            meta[_NFREE] -= 1
            row = np.int64(free[meta[_NFREE]])
        else:
            row = meta[_HIGH]
            meta[_HIGH] += 1
        meta[_USED] += _place(t, key, row)
        meta[_LIVE] += 1
        out[i] = row
    return keys.shape[0]


@njit(cache=True, nogil=True, inline="always")
def _remove(t, i):
    """Empty slot ``i`` of the current slot array, which holds no tombstones: the rest of its
    run moves back over the hole where a key's probe start allows (Knuth's algorithm R), so
    every key stays reachable and the run only ever shrinks."""
    mask = t.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if t[j, _ROW] == _EMPTY:
            break
        home = _start(t[j, _KEY], mask)
        # the key at j may fill the hole at i unless its home lies cyclically in (i, j]
        stays = (i < home <= j) if i <= j else (home > i or home <= j)
        if not stays:
            t[i, _KEY] = t[j, _KEY]
            t[i, _ROW] = t[j, _ROW]
            i = j
    t[i, _KEY] = 0
    t[i, _ROW] = _EMPTY


@njit(cache=True, nogil=True)
def _delete(t, old, free, meta, keys, out):
    for i in range(keys.shape[0]):
        key = keys[i]
        s = _find(t, key, 0)
        if s >= 0:
            row = t[s, _ROW] - 1
            _remove(t, s)
            meta[_USED] -= 1
        else:
            s = _find(old, key, meta[_CURSOR])
            if s < 0:
                out[i] = -1
                continue
            row = old[s, _ROW] - 1
            old[s, _ROW] = _TOMB
            meta[_OLD_LIVE] -= 1
        free[meta[_NFREE]] = row
        meta[_NFREE] += 1
        meta[_LIVE] -= 1
        out[i] = row


@njit(cache=True, nogil=True)
def _migrate(t, old, meta, budget):
    """Move the keys of old slots ``[cursor, cursor + budget)`` into ``t`` and advance the
    cursor past them (probes of the old array skip what is below it: :func:`_find`)."""
    cursor = meta[_CURSOR]
    stop = min(old.shape[0], cursor + budget)
    for s in range(cursor, stop):
        r = old[s, _ROW]
        if r > 0:
            meta[_USED] += _place(t, old[s, _KEY], r - 1)
            meta[_OLD_LIVE] -= 1
    meta[_CURSOR] = stop


@njit(cache=True, nogil=True)
def _collect(t, lo, keys, rows, n):
    """Append the (key, row) pairs of slots ``[lo, end)`` of one slot array to ``keys``/``rows``
    from ``n``; new n."""
    for s in range(lo, t.shape[0]):
        if t[s, _ROW] > 0:
            keys[n] = t[s, _KEY]
            rows[n] = t[s, _ROW] - 1
            n += 1
    return n


@njit(cache=True, nogil=True)
def _keys_of(t, lo, marked, keys, n):
    """Append the keys of held slots ``[lo, end)`` of ``t`` whose row is marked to ``keys`` from
    ``n``; new n."""
    for s in range(lo, t.shape[0]):
        r = t[s, _ROW]
        if r > 0 and marked[r - 1]:
            keys[n] = t[s, _KEY]
            n += 1
    return n


def _keys_array(keys: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(keys, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"keys must be 1-D, got shape {arr.shape}")
    return arr


def _slot_count(live: int) -> int:
    """Slots for ``live`` keys: a power of two with load <= 1/2 right after a resize."""
    return max(_MIN_SLOTS, 1 << max(0, (2 * live - 1).bit_length()))


def index_nbytes(keys: int) -> int:
    """Bytes of an index holding ``keys`` keys right after a resize to them: its slot array and
    its free list of ``keys`` rows. Between resizes the slots are up to twice that; a size
    budget (a pserver's --max-table-bytes) counts this figure per key."""
    return _slot_count(keys) * 16 + 4 * keys


#: a HashIndex's counters (int64[6]) beside its arrays
_META_NBYTES = 48


def index_claim_nbytes(keys: int) -> int:
    """The most bytes a :class:`HashIndex` for up to ``keys`` keys holds: its free list, and its
    slot array beside the one it drains (half its size) or the one made ahead for the next
    resize (made only while keys may pass the current array's load: then it is this array).
    A resize is sized for the keys held, so the last array is at most :func:`index_nbytes`'s."""
    slots = index_nbytes(keys) - 4 * keys
    return index_nbytes(keys) + slots // 2 + _META_NBYTES


def _slots(size: int) -> np.ndarray:
    """An empty slot array: ``np.zeros``, so the OS maps its pages only as keys land in them."""
    return np.zeros((size, 2), np.int64)


class HashIndex:
    """Key -> slab row for up to ``row_capacity`` keys (grown with :meth:`grow_rows`).

    Rows are int64 in every result: a row in ``[0, row_capacity)``, or -1 for "absent".
    """

    def __init__(self, row_capacity: int, slots: int = _MIN_SLOTS) -> None:
        if not 0 <= row_capacity <= MAX_ROWS:
            raise ValueError(f"row capacity {row_capacity} is outside [0, {MAX_ROWS}]")
        size = _slot_count(0)
        while size < slots:
            size *= 2
        self._t = _slots(size)
        self._old = _slots(0)
        self._spare = _slots(0)  # the next resize's slot array, made ahead (prepare_resize)
        self._free = np.zeros(row_capacity, np.int32)
        self._meta = np.zeros(6, np.int64)

    # ------------------------------------------------------------ sizes

    def __len__(self) -> int:
        return int(self._meta[_LIVE])

    @property
    def row_capacity(self) -> int:
        return int(self._free.shape[0])

    @property
    def free_rows(self) -> int:
        """Rows an insert can still take without :meth:`grow_rows`."""
        return int(self._meta[_NFREE] + self.row_capacity - self._meta[_HIGH])

    @property
    def rows_used(self) -> int:
        """The high-water mark: every row a key ever held is below it."""
        return int(self._meta[_HIGH])

    @property
    def slots(self) -> int:
        return int(self._t.shape[0] + self._old.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held: the slot arrays (current, draining, made ahead) and the free list."""
        return int(self._t.nbytes + self._old.nbytes + self._spare.nbytes + self._free.nbytes + self._meta.nbytes)

    @property
    def resizing(self) -> bool:
        """True while an old slot array is still being drained (see :meth:`rehash_step`)."""
        return self._old.shape[0] > 0

    # ------------------------------------------------------------ bulk operations

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key, -1 where absent."""
        keys = _keys_array(keys)
        out = np.empty(keys.shape[0], np.int64)
        _lookup(self._t, self._old, self._meta[_CURSOR], keys, out)
        return out

    def gather(self, keys: np.ndarray, values: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, int]:
        """``out[i] = values[row of keys[i]]`` for held keys (rows of unknown keys are left as
        they were); returns the rows (-1 where absent) and how many keys are unknown. ``values``: a C-contiguous 2-d slab this
        index's rows point into; ``out``: float rows of the same width. One compiled pass that
        overlaps the probes' and the rows' cache misses (a pull's whole work)."""
        keys = _keys_array(keys)
        rows = np.empty(keys.shape[0], np.int64)
        return rows, int(_gather(self._t, self._old, self._meta[_CURSOR], keys, values, rows, out))

    def insert(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key, allocating rows for absent keys (repeats get one row).

        Raises ``ValueError`` before changing anything when fewer rows are free than keys are
        given (the caller grows the slab first; :attr:`free_rows` says how many it may insert)."""
        keys = _keys_array(keys)
        n = keys.shape[0]
        if n > self.free_rows:
            raise ValueError(f"{n} keys to insert but only {self.free_rows} free rows: grow_rows first")
        out = np.empty(n, np.int64)
        if self.resizing:
            self.rehash_step(RESIZE_PACE * n)
        done = 0
        while True:
            done = _insert(self._t, self._old, self._free, self._meta, self._max_used(), keys, done, out)
            if done == n:
                return out
            if self.resizing:  # a drain that did not keep pace: finish it (bounded by the old array)
                self.rehash_step(self._old.shape[0])
            self._start_resize(len(self) + (n - done))

    def delete(self, keys: np.ndarray) -> np.ndarray:
        """Remove keys; returns the row each held (now free), -1 where absent. Repeats are fine."""
        keys = _keys_array(keys)
        out = np.empty(keys.shape[0], np.int64)
        _delete(self._t, self._old, self._free, self._meta, keys, out)
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every held key and its row (int64 arrays, slot order): what a save or shrink walks."""
        n = len(self)
        keys = np.empty(n, np.int64)
        rows = np.empty(n, np.int64)
        got = _collect(self._old, self._meta[_CURSOR], keys, rows, _collect(self._t, 0, keys, rows, 0))
        assert got == n, (got, n)
        return keys, rows

    def held_rows(self) -> np.ndarray:
        """bool[:attr:`rows_used`]: which rows a key holds (all but the free list's). One byte a
        row, so a whole-table walk by row (eviction) needs no copy of the keys."""
        held = np.ones(self.rows_used, np.bool_)
        held[self._free[: self._meta[_NFREE]]] = False
        return held

    def keys_of(self, marked: np.ndarray, count: int) -> np.ndarray:
        """The keys whose rows are marked in ``marked`` (bool, one per row below
        :attr:`rows_used`, ``count`` of them True and held), in slot order."""
        keys = np.empty(count, np.int64)
        got = _keys_of(self._old, self._meta[_CURSOR], marked, keys, _keys_of(self._t, 0, marked, keys, 0))
        assert got == count, (got, count)
        return keys

    def grow_rows(self, row_capacity: int) -> None:
        """Allow rows up to ``row_capacity`` (never shrinks; the slab's owner grows it alongside)."""
        if row_capacity > MAX_ROWS:
            raise ValueError(f"row capacity {row_capacity} exceeds {MAX_ROWS}")
        if row_capacity > self.row_capacity:
            free = np.zeros(row_capacity, np.int32)
            free[: self._meta[_NFREE]] = self._free[: self._meta[_NFREE]]
            self._free = free

    # ------------------------------------------------------------ resizing

    def _max_used(self) -> int:
        return int(self._t.shape[0] * MAX_LOAD)

    def _next_slots(self) -> int:
        """Slots of the resize an insert starts at the load limit (:data:`MAX_LOAD`)."""
        return _slot_count(self._max_used() + 1)

    def resize_ahead_due(self, key_limit: int) -> bool:
        """True when :meth:`prepare_resize` has work: keys fill :data:`PREPARE_LOAD` of the
        slots, no resize is draining, none was made ahead, and ``key_limit`` (the most keys the
        owner will insert) lets keys reach the load that starts a resize."""
        return (
            not self.resizing
            and self._spare.shape[0] != self._next_slots()
            and self._meta[_USED] >= PREPARE_LOAD * self._t.shape[0]
            and key_limit > self._max_used()
        )

    def prepare_resize(self) -> None:
        """Make the slot array the next resize drains into and fault its pages in (see the
        module's note). Reads no slot: it may run in a thread while lookups run, but not while
        inserts or deletes do (they may start the resize meanwhile)."""
        spare = _slots(self._next_slots())
        fault_in_zeros(spare)
        self._spare = spare

    def _start_resize(self, live: int) -> None:
        """Begin draining into a slot array sized for ``live`` keys: the one made ahead if it is
        that size, else a fresh one (allocated lazily: zeros)."""
        self._old = self._t
        self._meta[_OLD_LIVE] = len(self)
        self._meta[_CURSOR] = 0
        size = _slot_count(live)
        self._t = self._spare if self._spare.shape[0] == size else _slots(size)
        self._spare = _slots(0)
        self._meta[_USED] = 0

    def rehash(self, slots: int | None = None) -> None:
        """Start a resize now (to hold ``slots`` keys at load 1/4; default: the keys held), e.g.
        to drop tombstones after a large delete. Finish it with :meth:`rehash_step`."""
        if self.resizing:
            self.rehash_step(self._old.shape[0])
        self._start_resize(len(self) if slots is None else int(slots))

    def rehash_step(self, budget: int) -> bool:
        """Drain at most ``budget`` old slots into the new array; True when no resize is left.

        O(budget) work, so a caller can spread a resize over many short calls."""
        if not self.resizing:
            return True
        before = int(self._meta[_CURSOR])
        _migrate(self._t, self._old, self._meta, max(0, int(budget)))
        cursor = int(self._meta[_CURSOR])
        if cursor >= self._old.shape[0]:
            assert self._meta[_OLD_LIVE] == 0
            self._old = _slots(0)
            self._meta[_CURSOR] = 0
            return True
        release_pages(self._old, before, cursor)
        return False
