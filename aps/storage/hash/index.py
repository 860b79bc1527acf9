"""An open-addressing hash index from int64 keys to rows of a slab, in numba arrays.

Why not a dict: a hash table shard holds tens of millions of keys, and a push looks up thousands
per request; a Python dict costs ~100 bytes and a bytecode round trip per key. Here a slot is
12 bytes, and every bulk operation is one compiled loop.

Layout. A slot array is int32[slots, 3]: the key's low and high halves and the state, side by
side, so a probe that finds its key reads one cache line (two for the one slot in eight that
straddles a line), not two. ``state == 0`` is an empty slot, ``-1`` a tombstone, ``r + 1`` a slot
holding slab row ``r``: rows are below :data:`MAX_ROWS`, so the state fits 32 bits, and a slot
is 12 bytes where (int64 key, int64 state) was 16, a quarter of the index's memory. The state is
never in the key, so every int64 bit pattern (0, -1, the extremes) is a valid key; and empty is
0 so a fresh slot array is ``np.zeros``, which the OS maps lazily: creating a large table
touches no memory. The probe starts at splitmix64(key) scaled to the slot count (its low 32 bits
times the count, over 2^32: any count works, not only powers of two) and goes on linearly; a
delete shifts the rest of its run back over the hole (Knuth's algorithm R), so the current slot
array never holds a tombstone and a table kept full by evictions (a ``max_keys`` cap) never
resizes to drop them; only an old array being drained (below) marks deletes with tombstones, as
its probes must cross them. Slab rows come from a free list (rows deleted) and then from a
high-water mark (rows never used), so the slab itself never moves when keys come and go.

Growth by 1.4, not 2. When keys pass :data:`MAX_LOAD` (70%) of the slots, the new slot array is
sized for the keys at load 1/2, so the load stays within [0.5, 0.7] and a key costs 17-24 bytes
of slots; doubling a power of two let it fall to 0.35 (34 bytes a key at 12-byte slots, 46 at
16). The price is more resizes: they move 3.5 keys per key inserted, not 2 (about 18 ns a slot
drained), in pieces beside the inserts.

Resizing in pieces. A new slot array is made and the old one is drained into it
*incrementally*, as Redis does: every key lives in exactly one of the two, a lookup tries the
new one then the old, an insert goes to the new one, and each call moves ``RESIZE_PACE`` old
slots per key it inserts, which ends the drain long before the new array fills. A caller that
wants the drain done sooner or at a quiet time calls :meth:`rehash_step` with a slot budget
(each call is O(budget), e.g. 1 M slots in a few ms) between requests, or runs it in an
executor thread (the kernels release the GIL) while no other call uses the index: the index has
one writer at a time, like every table on a pserver. The old array is drained in slot order; a
probe of it skips the slots below the drain's cursor (as if tombstones: :func:`_find`), so the
pages behind the cursor go back to the OS as the drain passes them (:mod:`.pages`). The new slot
array is written at random places from the resize's first insert, so its pages would all be
faulted in by that one call (0.4 s for 16 M slots on a 2-core VM); an owner that must stay
responsive makes it ahead with :meth:`prepare_resize` (in a thread, once keys pass
:data:`PREPARE_LOAD` of the slots), and the resize then starts on mapped memory.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...mixer import mix64
from ..pages import fault_in_zeros, lazy_zeros, release_pages
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
#: a resize drains into the slot array made ahead if the keys fill at most this share of it: the
#: drain (the old slots / RESIZE_PACE inserts) then ends before the keys reach MAX_LOAD
_SPARE_LOAD = 0.6
#: old slots moved per inserted key while a resize drains: >= 4 ends the drain before the new
#: array fills; 32 ends it within a ninth of the inserts until the next resize, as the old array
#: is held until then (its drained pages given back as it goes: half of it on average; 8 held it
#: through 45% of them, 15 bytes a key at 50M keys), for 0.6 us more per key inserted meanwhile
RESIZE_PACE = 32
#: rows are int32 in the slots' state and on the free list
MAX_ROWS = (1 << 31) - 2
_LO = 0  # slot columns: the key's low 32 bits, its high 32 bits, the state
_HI = 1
_ROW = 2
#: bytes of one slot
SLOT_NBYTES = 12
_MIN_SLOTS = 1024
_MAX_SLOTS = 1 << 32
#: slot counts are multiples of it (192 bytes, three cache lines)
_SLOT_ROUND = 16
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
def _start(key: np.int64, size: int) -> int:
    """The probe's first slot: the low 32 bits of the key's hash scaled to ``size`` (< 2^32).
    Never the top bits: they name the key's logical shard (aps/sharding.py), so a pserver's
    keys share them, and scaled they would crowd a few stretches of the slots."""
    low = mix64(np.uint64(key)) & np.uint64(0xFFFFFFFF)
    return np.int64((low * np.uint64(size)) >> np.uint64(32))


@njit(cache=True, nogil=True, inline="always")
def _next(s: int, size: int) -> int:
    s += 1
    return 0 if s == size else s


@njit(cache=True, nogil=True, inline="always")
def _halves(key: np.int64) -> tuple[np.int32, np.int32]:
    """The key's low and high 32 bits, as the slot's int32 columns hold them."""
    k = np.int64(key)
    return np.int32((k << 32) >> 32), np.int32(k >> 32)


@njit(cache=True, nogil=True, inline="always")
def _key_at(t: np.ndarray, s: int) -> np.int64:
    return (np.int64(t[s, _HI]) << 32) | (np.int64(t[s, _LO]) & 0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _find(t: np.ndarray, key: np.int64, lo: int) -> int:
    """The slot of ``t`` holding ``key``, or -1. ``lo``: 0, or for an old slot array being
    drained the drain's cursor: slots below it hold nothing live and may read as anything
    (their pages went back to the OS: zeros), so a probe skips them as if they were tombstones."""
    size = t.shape[0]
    if size == 0:
        return -1
    klo, khi = _halves(key)
    s = _start(key, size)
    for _ in range(size - lo):
        if s < lo:
            s = lo
        r = t[s, _ROW]
        if r == _EMPTY:
            return -1
        if r > 0 and t[s, _LO] == klo and t[s, _HI] == khi:
            return s
        s = _next(s, size)
    return -1


@njit(cache=True, nogil=True)
def _place(t: np.ndarray, key: np.int64, row: int) -> int:
    """Put ``key`` (known to be absent) in its first free slot; returns 1 if that slot was empty
    (one more slot in use), 0 if it was a tombstone."""
    size = t.shape[0]
    s = _start(key, size)
    while t[s, _ROW] > 0:
        s = _next(s, size)
    fresh = 1 if t[s, _ROW] == _EMPTY else 0
    klo, khi = _halves(key)
    t[s, _LO] = klo
    t[s, _HI] = khi
    t[s, _ROW] = row + 1
    return fresh


@njit(cache=True, nogil=True, inline="always")
def _ask_one(t, key):
    """Prefetch ``key``'s first slot of ``t``: both ends, as one slot in eight straddles a line."""
    s = _start(key, t.shape[0])
    prefetch(t, s, 0)
    prefetch(t, s, SLOT_NBYTES - 1)


@njit(cache=True, nogil=True, inline="always")
def _ask(t, old, key):
    """Prefetch ``key``'s first slot in both slot arrays."""
    _ask_one(t, key)
    if old.shape[0]:
        _ask_one(old, key)


@njit(cache=True, nogil=True, inline="always")
def _row_of(t, old, lo, key):
    s = _find(t, key, 0)
    if s >= 0:
        return np.int64(t[s, _ROW]) - 1
    s = _find(old, key, lo)
    return np.int64(old[s, _ROW]) - 1 if s >= 0 else -1


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
    size = t.shape[0]
    j = i
    while True:
        j = _next(j, size)
        if t[j, _ROW] == _EMPTY:
            break
        home = _start(_key_at(t, j), size)
        # the key at j may fill the hole at i unless its home lies cyclically in (i, j]
        stays = (i < home <= j) if i <= j else (home > i or home <= j)
        if not stays:
            t[i, _LO] = t[j, _LO]
            t[i, _HI] = t[j, _HI]
            t[i, _ROW] = t[j, _ROW]
            i = j
    t[i, _LO] = 0
    t[i, _HI] = 0
    t[i, _ROW] = _EMPTY


@njit(cache=True, nogil=True)
def _delete(t, old, free, meta, keys, out):
    for i in range(keys.shape[0]):
        key = keys[i]
        s = _find(t, key, 0)
        if s >= 0:
            row = np.int64(t[s, _ROW]) - 1
            _remove(t, s)
            meta[_USED] -= 1
        else:
            s = _find(old, key, meta[_CURSOR])
            if s < 0:
                out[i] = -1
                continue
            row = np.int64(old[s, _ROW]) - 1
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
            meta[_USED] += _place(t, _key_at(old, s), np.int64(r) - 1)
            meta[_OLD_LIVE] -= 1
    meta[_CURSOR] = stop


@njit(cache=True, nogil=True)
def _collect(t, lo, keys, rows, n):
    """Append the (key, row) pairs of slots ``[lo, end)`` of one slot array to ``keys``/``rows``
    from ``n``; new n."""
    for s in range(lo, t.shape[0]):
        if t[s, _ROW] > 0:
            keys[n] = _key_at(t, s)
            rows[n] = np.int64(t[s, _ROW]) - 1
            n += 1
    return n


@njit(cache=True, nogil=True)
def _keys_of(t, lo, marked, keys, n):
    """Append the keys of held slots ``[lo, end)`` of ``t`` whose row is marked to ``keys`` from
    ``n``; new n."""
    for s in range(lo, t.shape[0]):
        r = t[s, _ROW]
        if r > 0 and marked[r - 1]:
            keys[n] = _key_at(t, s)
            n += 1
    return n


def _keys_array(keys: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(keys, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"keys must be 1-D, got shape {arr.shape}")
    return arr


def _slot_count(live: int) -> int:
    """Slots for ``live`` keys: load 1/2 right after a resize (rounded up to :data:`_SLOT_ROUND`
    slots, at least :data:`_MIN_SLOTS`), at most 2^32 as :func:`_start` needs (MAX_ROWS keys fit)."""
    return min(_MAX_SLOTS, max(_MIN_SLOTS, -(-2 * live // _SLOT_ROUND) * _SLOT_ROUND))


def index_nbytes(keys: int) -> int:
    """Bytes of an index holding ``keys`` keys right after a resize to them: its slot array and
    its free list at its longest (``keys`` rows, deleted). Between resizes the slots are up to
    1.4 times that; a size budget (a pserver's --max-table-bytes) counts this figure per key."""
    return _slot_count(keys) * SLOT_NBYTES + 4 * keys


#: a HashIndex's counters (int64[6]) beside its arrays
_META_NBYTES = 48


def index_claim_nbytes(keys: int) -> int:
    """The most bytes a :class:`HashIndex` for up to ``keys`` keys holds: its free list, and its
    slot array beside the one it drains or the one made ahead for the next resize (made only
    while keys may pass the current array's load: then it is this array). A growth sizes the
    new array for more than MAX_LOAD of the old one's slots at load 1/2, so the smaller of two
    arrays held is under 5/7 of the larger; and a resize is sized for the keys held, so the
    larger is at most :func:`index_nbytes`'s."""
    slots = _slot_count(keys)
    return index_nbytes(keys) + (slots * 5 // 7) * SLOT_NBYTES + _META_NBYTES


def _slots(size: int) -> np.ndarray:
    """An empty slot array, whose pages the OS maps only as keys land in them (:func:`lazy_zeros`)."""
    return lazy_zeros((size, 3), np.int32)


class HashIndex:
    """Key -> slab row for up to ``row_capacity`` keys (grown with :meth:`grow_rows`), in a slot
    array of at least ``slots`` slots to start with.

    Rows are int64 in every result: a row in ``[0, row_capacity)``, or -1 for "absent".

    The free list holds the rows deletes gave back, and grows with them (by doubling, before a
    delete that may need it), not with the row capacity: a table that never deletes keeps none,
    and a zeroed array sized to the capacity was not free either, as an allocation that glibc
    serves from memory a process freed before is cleared, every page made resident, where a
    fresh mapping costs nothing until written.
    """

    def __init__(self, row_capacity: int, slots: int = 0) -> None:
        if not 0 <= row_capacity <= MAX_ROWS:
            raise ValueError(f"row capacity {row_capacity} is outside [0, {MAX_ROWS}]")
        self._t = _slots(min(_MAX_SLOTS, max(_MIN_SLOTS, -(-slots // _SLOT_ROUND) * _SLOT_ROUND)))
        self._old = _slots(0)
        self._spare = _slots(0)  # the next resize's slot array, made ahead (prepare_resize)
        self._capacity = int(row_capacity)
        self._free = np.zeros(0, np.int32)
        self._meta = np.zeros(6, np.int64)

    # ------------------------------------------------------------ sizes

    def __len__(self) -> int:
        return int(self._meta[_LIVE])

    @property
    def row_capacity(self) -> int:
        return self._capacity

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
            self._start_resize(len(self) + (n - done), growth=True)

    def delete(self, keys: np.ndarray) -> np.ndarray:
        """Remove keys; returns the row each held (now free), -1 where absent. Repeats are fine."""
        keys = _keys_array(keys)
        out = np.empty(keys.shape[0], np.int64)
        self._free_room(keys.shape[0])
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
        self._capacity = max(self._capacity, int(row_capacity))

    def _free_room(self, more: int) -> None:
        """Make the free list able to take ``more`` rows (a delete of ``more`` keys): double it,
        at most to the rows held."""
        nfree = int(self._meta[_NFREE])
        need = nfree + min(more, len(self))
        if need > self._free.shape[0]:
            free = np.empty(min(self._capacity, max(need, 2 * self._free.shape[0], 1024)), np.int32)
            free[:nfree] = self._free[:nfree]
            self._free = free

    # ------------------------------------------------------------ resizing

    def _max_used(self) -> int:
        return int(self._t.shape[0] * MAX_LOAD)

    def _next_slots(self) -> int:
        """Slots of the resize an insert starts at the load limit (:data:`MAX_LOAD`)."""
        return _slot_count(self._max_used() + 1)

    def resize_ahead_due(self, key_limit: int, coming: int | None = None) -> bool:
        """True when :meth:`prepare_resize` has work: keys fill :data:`PREPARE_LOAD` of the
        slots, no resize is draining, none was made ahead, and ``key_limit`` (the most keys the
        owner will insert) lets keys reach the load that starts a resize. ``coming``: the most
        new keys the owner's next inserts are likely to bring (its pushes' size), if it knows;
        then not before they could reach that load, as the array made ahead is held beside the
        current one from then on (1.4 times its slots: 25 bytes a key more at 12-byte slots),
        which for small pushes is well after PREPARE_LOAD."""
        due_at = PREPARE_LOAD * self._t.shape[0]
        if coming is not None:
            due_at = max(due_at, self._max_used() - coming)
        return (
            not self.resizing
            and self._spare.shape[0] != self._next_slots()
            and self._meta[_USED] >= due_at
            and key_limit > self._max_used()
        )

    def prepare_resize(self) -> None:
        """Make the slot array the next resize drains into and fault its pages in (see the
        module's note). Reads no slot: it may run in a thread while lookups run, but not while
        inserts or deletes do (they may start the resize meanwhile)."""
        spare = _slots(self._next_slots())
        fault_in_zeros(spare)
        self._spare = spare

    def _start_resize(self, live: int, *, growth: bool) -> None:
        """Begin draining into a slot array sized for ``live`` keys, allocated lazily (zeros);
        or into the one made ahead: for a ``growth`` (an insert past the load limit) if ``live``
        keys fill at most :data:`_SPARE_LOAD` of it (it was sized for the keys at the limit, and
        an insert may bring more), else if it is that size."""
        self._old = self._t
        self._meta[_OLD_LIVE] = len(self)
        self._meta[_CURSOR] = 0
        size = _slot_count(live)
        spare = self._spare.shape[0]
        fits = live <= _SPARE_LOAD * spare if growth else spare == size
        self._t = self._spare if fits else _slots(size)
        self._spare = _slots(0)
        self._meta[_USED] = 0

    def rehash(self, slots: int | None = None) -> None:
        """Start a resize now (to hold ``slots`` keys at load 1/2; default: the keys held), e.g.
        to drop tombstones after a large delete. Finish it with :meth:`rehash_step`."""
        if self.resizing:
            self.rehash_step(self._old.shape[0])
        self._start_resize(len(self) if slots is None else int(slots), growth=False)

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
