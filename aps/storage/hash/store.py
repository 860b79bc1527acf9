"""One pserver's shard of a hash-keyed sparse table: any int64 key, admitted on push, evicted by
score (Paddle's CtrCommonAccessor), rows in a slab behind a :class:`HashIndex`.

Why this shape:

* Rows live in slab arrays (values, each optimizer state, statistics) indexed by the row the
  index gives a key, so the optimizer is :func:`optim.apply_sparse` over slab rows: the very
  kernels of fixed tables, never a copy of them. A slab row is reset when a key takes it
  (initial value from (table seed, key), optimizer state from :func:`optim.new_sparse_state`'s
  fill, statistics zero), so arrays are made with ``np.zeros`` and the OS maps them lazily: a
  table reserved for ``max_keys`` rows costs memory only for rows keys have used.
* A pull never creates a key: an unknown key reads its initial row, computed again each time
  (the same row it gets when a push admits it, on any pserver).
* Admission is decided per push for the keys not held yet: with probability ``p`` per occurrence
  (a stateless draw from (seed, key, push counter) against ``1 - (1 - p)^count``: Monolith's
  rule) and/or once a key was pushed ``admit_count`` times (an exact counter per pending key, in
  a second bounded index; when it is full it starts over, and :attr:`pending_resets` counts
  that). A gradient for a key not admitted is dropped, as Monolith and Paddle drop it.
* Statistics per key follow Paddle's CTR accessor: ``show``, ``click`` (pushed with the
  gradient; one show and no click per occurrence when not given), ``delta_score`` (the pushed
  score since the last delta save) and ``last_step`` (the shard's step at the key's last push).
  The score is ``0.1 (show - click) + click``. :meth:`shrink` decays show and click, then deletes
  keys whose score is under a threshold or that were not pushed for ``ttl`` steps. A table with
  ``stats="compact"`` keeps them in 16 bytes instead of 24: no last step (no TTL in steps) and
  days in 16 bits (:mod:`.stats`).
* Days, as the reference's ``unseen_days``: the shard keeps a day counter that only a shrink's
  ``days`` advances (a daily job's shrink passes 1), and each key the day of its last push
  (``last_day``); a key is unseen for ``day - last_day`` days, and a shrink deletes the keys
  unseen for more than the table's ``ttl_days``. A counter the client advances, not the wall
  clock: every pserver counts the same days, so a reshard keeps them, and a replayed stream of
  old data ages keys by its own days.
* Every key deleted (a shrink, a ``max_keys`` eviction, a TTL) since the last base or delta
  save is kept for the next delta save (:mod:`.deleted`: 8 bytes a key until that save), so
  aps-serve stops serving it at that delta rather than at the next base.
* ``max_keys`` is a hard cap per shard: admitting past it first evicts the lowest-score keys
  (never a key in the push being applied), 1/16 of the cap at a time so the walk that finds them
  is paid once per many admissions; new keys that still do not fit are rejected.
* ``key_limit`` (from a pserver's size budget, :func:`budget_keys`) bounds an unbounded table:
  new keys past it are rejected, never evicted (the table asked for no eviction).
* A pserver's budget for all its tables (:class:`~aps.storage.tables.TablesBudget`,
  ``--max-tables-bytes``) is shared by its shards: before the slab grows, the shard claims what
  the bigger slab and its index may take at most (:func:`claim_nbytes`), and a slab grows only
  as far as the budget has room (never doubling past it). Keys that do not fit are rejected and
  counted in :attr:`over_budget` as well as :attr:`rejected`; held keys keep training. A
  ``max_keys`` table claims its whole cap when created, so the budget never makes it evict: it
  evicts by score at its cap, as it says.

The rows live in a :class:`~.slab.RowSlab` (slab.py), which grows by doubling (one copy per
doubling, like a list) within ``key_limit`` and the tables budget; the index resizes in pieces
(see :mod:`.index`); how many keys a cap evicts and which keys a shrink deletes are
:mod:`.evict`'s. Nothing here touches sockets or the event loop; what walks the whole table
comes in two halves for a server that must keep answering meanwhile: a plan that only reads the
index (:meth:`shrink_plan`, :meth:`evict_plan`, and :meth:`reserve`, which copies the slab) and
may run in a thread while pulls read, and :meth:`delete_keys`, which a caller runs in slices
between requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import njit

from ...errors import ErrorCode
from ...specs import MAX_COMPACT_DAYS, MAX_DAYS, HashTable
from .. import optim
from ..init_kernels import init_key_rows, table_seed
from ..prefetch import prefetch
from ..tables import TablesBudget, _bad, _check_scale, _check_values
from .accessor import CtrAccessor
from .admission import KeyAdmission
from .compact import (
    as_stored,
    gather_decoded,
    storage_dtype,
    stored_state,
    update_rows,
    value_row_nbytes,
    write_rounded,
)
from .deleted import DeletedKeys
from .evict import decay_and_judge, evictions_ahead, evictions_now, mark_victims
from .index import MAX_ROWS, HashIndex, index_claim_nbytes, index_nbytes
from .slab import MIN_ROWS, RowSlab, most_that_fit
from .stats import compact, stamp, stats_dtype
from .tracking import HashChangeTracking

#: rows ahead whose statistics :func:`_add_stats` asks for (aps/storage/prefetch.py). A row's
#: statistics are one record (stats.py): a push writes all five fields, and in five arrays of
#: millions of rows that was five misses to memory a row where one record costs one
_STATS_AHEAD = 16


@njit(cache=True, nogil=True)
def _add_stats(show, click, delta, last, last_day, rows, shows, clicks, step, day, nonclk, clk):
    """Add each pushed occurrence's show and click (1 and 0 when not given) to its row, and mark
    the row seen at ``step`` and ``day``."""
    for i in range(rows.shape[0]):
        if i + _STATS_AHEAD < rows.shape[0]:  # one record (stats.py), which may cross a line
            ahead = rows[i + _STATS_AHEAD]
            prefetch(show, ahead, 0)
            prefetch(last, ahead, 0)
        r = rows[i]
        s = shows[i] if shows.shape[0] else 1.0
        c = clicks[i] if clicks.shape[0] else 0.0
        show[r] += s
        click[r] += c
        delta[r] += nonclk * (s - c) + clk * c
        last[r] = step
        last_day[r] = day


def _stat_view(field: str, doc: str) -> property:
    """A store attribute reading one field of its statistics records (a strided view)."""
    return property(lambda store: store.stats[field], doc=f"{doc} A view of ``stats``.")


def _check_keys(table: str, keys: object) -> np.ndarray:
    if not isinstance(keys, np.ndarray) or keys.dtype != np.int64:
        kind = keys.dtype if isinstance(keys, np.ndarray) else type(keys).__name__
        raise _bad(ErrorCode.BAD_REQUEST, table, f"keys must be an int64 array, got {kind}")
    if keys.ndim != 1:
        raise _bad(ErrorCode.SHAPE_MISMATCH, table, f"keys must be 1-D, got shape {keys.shape}")
    return np.ascontiguousarray(keys)


_NONE = np.empty(0, np.float32)
#: what a push runs on its held rows: (values, state, rows, pushed grads or deltas, ordered)
PushKernel = Callable[[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray, bool], None]
_NO_ROWS = np.empty(0, np.int64)


def _state_template(spec: HashTable) -> dict[str, np.ndarray]:
    """One fresh row of the optimizer state, as the table stores it (``state_dtype``)."""
    return stored_state(optim.new_sparse_state(spec.optimizer, 1, spec.dim), spec.state_dtype)


def row_nbytes(spec: HashTable) -> int:
    """Bytes of one key's slab row: value, optimizer state and statistics."""
    template = _state_template(spec)
    state = sum(a.itemsize * math.prod(a.shape[1:]) for a in template.values())
    return value_row_nbytes(spec.dtype, spec.dim) + state + stats_dtype(spec).itemsize


def planned_nbytes(spec: HashTable, keys: int) -> int:
    """Bytes a shard holding ``keys`` keys takes by the size rule of ``--max-table-bytes``: the
    slab rows, the index right after a resize, and the admission counters when ``admit_count``
    needs them (``pending_keys`` of them, with their own index)."""
    pending = spec.pending_keys * 8 + index_nbytes(spec.pending_keys) if spec.admit_count > 1 else 0
    return keys * row_nbytes(spec) + index_nbytes(keys) + pending


def _pending_claim(spec: HashTable) -> int:
    """The most bytes ``admit_count``'s counters take (none without it)."""
    return spec.pending_keys * 8 + index_claim_nbytes(spec.pending_keys) if spec.admit_count > 1 else 0


def claim_nbytes(spec: HashTable, rows: int) -> int:
    """The most bytes a shard whose slab has ``rows`` rows takes while keys fill it: what it
    claims of a pserver's tables budget (``--max-tables-bytes``) before its slab grows to
    ``rows``. Slab rows (value, optimizer state, statistics), the index at its peak
    (:func:`~.index.index_claim_nbytes`) and the admission counters; not change tracking, which
    has a budget of its own (``--max-tracking-bytes``)."""
    return rows * row_nbytes(spec) + index_claim_nbytes(rows) + _pending_claim(spec)


def budget_keys(spec: HashTable, budget: int) -> int:
    """The most keys whose :func:`planned_nbytes` fits in ``budget`` bytes (0 if none)."""
    return most_that_fit(0, MAX_ROWS, lambda keys: planned_nbytes(spec, keys) <= budget)


class HashSparseStore(HashChangeTracking):
    """The keys one pserver holds of a :class:`~aps.specs.HashTable`, with their rows, optimizer
    state and statistics. ``rows``: slab rows to reserve (default ``max_keys``, else 1024);
    ``key_limit``: keys past it are rejected (a size budget; None: only ``max_keys`` bounds)."""

    def __init__(self, spec: HashTable, rows: int | None = None, *, key_limit: int | None = None) -> None:
        self.spec = spec
        #: what shows and clicks mean: scores, save selection, shrink defaults (accessor.py)
        self.accessor = CtrAccessor.of(spec)
        self.key_limit = min(MAX_ROWS, spec.max_keys or MAX_ROWS, MAX_ROWS if key_limit is None else key_limit)
        capacity = min(int(rows or spec.max_keys or MIN_ROWS), self.key_limit)
        self.index = HashIndex(capacity)
        #: the rows (values, optimizer state, statistics) and their growth (slab.py)
        self.slab = RowSlab(self.index, spec.dim, _state_template(spec), stats_dtype(spec),
                            name=spec.name, max_rows=self.key_limit, extra_claim=_pending_claim(spec),
                            value_dtype=storage_dtype(spec.dtype))
        #: values or optimizer state stored in fewer bits than float32: computed on float32
        #: copies (compact.py); ``compact_values``: the values are
        self.compact_values = spec.dtype != "float32"
        self.compact = self.compact_values or spec.state_dtype != "float32"
        self.day = 0  # days counted by shrinks (the module's note)
        self.step = 0  # completed optimizer applications (lr decay, last_step)
        self.pushes = 0  # push calls: the admission draws' counter
        self.admitted = self.rejected = self.evicted = 0
        self.over_budget = 0  # occurrences of new keys rejected for lack of room (also in rejected)
        self._wanted = 0  # keys the last push wanted admitted (eviction_due keeps room for as many)
        self._seed = table_seed(spec.name, spec.seed)
        #: which unseen keys are admitted: counts and draws (admission.py)
        self.admission = KeyAdmission(spec, self._seed)
        #: the keys deleted since the last base or delta save, for the next delta (deleted.py)
        self.deleted = DeletedKeys()
        self._init_hash_tracking(capacity)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def values(self) -> np.ndarray:
        """Each slab row's value, [capacity, dim] of the spec's ``dtype`` (the slab's array, live)."""
        return self.slab.values

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Each slab row's optimizer state by name (the slab's arrays, live)."""
        return self.slab.state

    @property
    def stats(self) -> np.ndarray:
        """Each slab row's statistics (records of :func:`.stats.stats_dtype`); its fields are
        views (show, click, ...)."""
        stats = self.slab.stats
        assert stats is not None  # this store's slab is made with statistics
        return stats

    show = _stat_view("show", "Shows per slab row (decayed by shrinks).")
    click = _stat_view("click", "Clicks per slab row (decayed by shrinks).")
    delta_score = _stat_view("delta_score", "Score gained since the last base or delta save.")
    last_step = _stat_view("last_step", "The shard step of each row's last push.")
    last_day = _stat_view("last_day", "The day of each row's last push.")

    def __len__(self) -> int:
        """Keys held."""
        return len(self.index)

    # ------------------------------------------------------------ data path

    def pull(self, keys: np.ndarray, *, rows: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``keys``, float32[n, dim]; an unknown key reads its initial row and stays
        unknown. ``rows``: each key's row as the index gives it (-1: unknown), when the caller
        has just looked them up (a disk table bringing keys in)."""
        keys = _check_keys(self.name, keys)
        out = np.empty((keys.shape[0], self.spec.dim), np.float32)
        if self.compact_values or rows is not None:
            rows = self.index.lookup(keys) if rows is None else rows
            if self.compact_values:
                gather_decoded(self.slab.values, rows, out)
            else:
                held = rows >= 0
                out[held] = self.slab.values[rows[held]]
            unknown = int(np.count_nonzero(rows < 0))
        else:
            rows, unknown = self.index.gather(keys, self.slab.values, out)
        if unknown:
            at = np.flatnonzero(rows < 0)
            init_key_rows(self.spec.init, self._seed, keys[at], at, out)
            if self.compact_values:  # the row a push admitting the key would store
                out[at] = as_stored(out[at], self.spec.dtype)
        return out

    def push_grad(
        self,
        keys: np.ndarray,
        grads: np.ndarray,
        *,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
        scale: float = 1.0,
        advance_step: bool = True,
        client: int | None = None,
        distinct: bool = False,
    ) -> int:
        """Admit what the table's rules admit of the unknown keys, then apply the optimizer to
        ``grads * scale`` on the held ones (repeats summed) and add their statistics.

        Returns how many keys were admitted. Occurrences of keys not admitted are dropped and
        counted in :attr:`rejected`. ``advance_step`` as for fixed tables (chunked pushes);
        ``client``: the pusher, for change tracking (see :meth:`_mark_pushed`); ``distinct``:
        the caller checked that no key repeats, so no two occurrences share a slab row and the
        kernel walks them as pushed instead of sorting rows to find repeats (also known, and
        used, when every key of the push was new and admitted: a fill)."""
        scale = _check_scale(self.name, scale)

        def kernel(values: np.ndarray, state: dict[str, np.ndarray], rows: np.ndarray, g: np.ndarray, ordered: bool) -> None:
            optim.apply_sparse(self.spec.optimizer, values, state, rows, g, scale, self.step, ordered=ordered)

        return self._push(keys, grads, "grads", shows, clicks, distinct, advance_step, client, kernel)

    def push_delta(
        self, keys: np.ndarray, deltas: np.ndarray, *, shows: np.ndarray | None = None, clicks: np.ndarray | None = None,
        advance_step: bool = True, client: int | None = None, distinct: bool = False,
    ) -> int:
        """GEO's ``param += delta`` per held key (repeats summed), after admitting unknown keys
        as a gradient push does (an admitted key starts from its initial row), and their
        statistics as for :meth:`push_grad` (one show and no click per occurrence when not
        given). Returns how many keys were admitted. ``distinct`` as for :meth:`push_grad`."""

        def kernel(values: np.ndarray, state: dict[str, np.ndarray], rows: np.ndarray, d: np.ndarray, ordered: bool) -> None:
            optim.add_rows(values, rows, d, ordered=ordered)

        return self._push(keys, deltas, "deltas", shows, clicks, distinct, advance_step, client, kernel)

    def _push(
        self, keys: np.ndarray, values: np.ndarray, what: str, shows: np.ndarray | None, clicks: np.ndarray | None,
        distinct: bool, advance_step: bool, client: int | None, kernel: PushKernel,
    ) -> int:
        """What both pushes do around their kernel: check every array (before anything
        changes), admit, drop the occurrences not admitted, run ``kernel(values, state, rows,
        pushed, ordered)`` on the held rows (float32 copies of them in a compact table), add the
        statistics. Returns how many keys were admitted."""
        keys = _check_keys(self.name, keys)
        n = keys.shape[0]
        values = _check_values(self.name, values, (n, self.spec.dim), what)
        shows = _NONE if shows is None else _check_values(self.name, shows, (n,), "shows")
        clicks = _NONE if clicks is None else _check_values(self.name, clicks, (n,), "clicks")
        rows, new, held = self._admitted_rows(keys)
        ordered = distinct or new.size == n  # every key was new, and each took a row of its own
        if held is not None:
            values = values[held]
            shows = shows[held] if shows.size else shows
            clicks = clicks[held] if clicks.size else clicks
        slab = self.slab
        if self.compact:
            update_rows(slab.values, slab.state, rows, ordered, lambda v, st, local, o: kernel(v, st, local, values, o))
        else:
            kernel(slab.values, slab.state, rows, values, ordered)
        self._pushed(rows, new, shows, clicks, advance_step, client)
        return int(new.size)

    def _admitted_rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """A push's rows after admission: (rows of the held occurrences, rows just admitted,
        which occurrences are held, or None for all)."""
        n = keys.shape[0]
        rows = self.index.lookup(keys)
        absent = np.flatnonzero(rows < 0)
        new = self._admit(keys, rows, absent) if absent.size else _NO_ROWS
        self.pushes += 1
        if absent.size and (rows[absent] < 0).any():
            held = np.flatnonzero(rows >= 0)
            self.rejected += n - held.size
            return rows[held], new, held
        return rows, new, None

    def _pushed(self, rows: np.ndarray, new: np.ndarray, shows: np.ndarray, clicks: np.ndarray, advance_step: bool, client: int | None) -> None:
        """After a push's update: add the statistics, mark the rows changed, advance the step."""
        rules, stats = self.accessor, self.stats
        step, day = stamp(stats.dtype, self.step, self.day)
        _add_stats(stats["show"], stats["click"], stats["delta_score"], stats["last_step"], stats["last_day"], rows, shows,
                   clicks, step, day, rules.nonclk_coeff, rules.click_coeff)
        self.slab.note_admitted(int(new.size))
        self._mark_pushed(rows, new, client)
        if advance_step:
            self.step += 1

    # ------------------------------------------------------------ admission and capacity

    def _admit(self, keys: np.ndarray, rows: np.ndarray, absent: np.ndarray) -> np.ndarray:
        """Insert the unknown keys that pass admission and write their rows into ``rows``;
        returns the rows they took."""
        cand, inverse, counts = np.unique(keys[absent], return_inverse=True, return_counts=True)
        chosen = np.flatnonzero(self.admission.passes(cand, counts, self.pushes))
        self._wanted = int(chosen.size)
        under_cap, fit = self._make_room(chosen.size, rows[rows >= 0])
        if fit < under_cap:
            self._over_budget(int(counts[chosen[fit:under_cap]].sum()))
        chosen = chosen[:fit]
        self.admission.admitted(cand[chosen])
        if not chosen.size:
            return _NO_ROWS
        cand_rows = np.full(cand.shape[0], -1, np.int64)
        new = cand_rows[chosen] = self._allocate(cand[chosen])
        rows[absent] = cand_rows[inverse]
        self.admitted += chosen.size
        return new

    def _make_room(self, wanted: int, protected_rows: np.ndarray) -> tuple[int, int]:
        """Evict low-score keys so ``wanted`` new keys fit under ``max_keys`` (never a row in
        ``protected_rows``), and grow the slab for them as far as the size budgets let it.
        Returns (how many fit under ``max_keys``, how many of those fit the size budgets too)."""
        cap = self.spec.max_keys
        evict = evictions_now(cap, len(self), wanted)
        if evict:
            self.delete_keys(self.evict_plan(evict, protected_rows))
        under_cap = max(0, min(wanted, (cap or MAX_ROWS) - len(self)))
        fit = max(0, min(under_cap, self.key_limit - len(self)))
        if fit > self.index.free_rows:
            self._grow(len(self) + fit, partial=True)
            fit = min(fit, self.index.free_rows)
        return under_cap, fit

    def _over_budget(self, occurrences: int) -> None:
        """Count (and have the pserver's budget log, rate-limited) new keys' occurrences
        rejected because a size budget has no room for them."""
        self.over_budget += occurrences
        if self.slab.budget is not None:
            self.slab.budget.refused(self.name, occurrences, len(self), self.key_limit)

    def _allocate(self, keys: np.ndarray) -> np.ndarray:
        """Rows for new ``keys``, reset to their initial value, state and statistics."""
        if self.index.free_rows < keys.shape[0]:
            self._grow(len(self) + keys.shape[0])
        rows = self.index.insert(keys)
        self._note_keys(keys, rows)
        if self.compact_values:
            fresh = np.empty((keys.shape[0], self.spec.dim), np.float32)
            init_key_rows(self.spec.init, self._seed, keys, np.arange(keys.shape[0], dtype=np.int64), fresh)
            write_rounded(self.slab.values, rows, fresh)
        else:
            init_key_rows(self.spec.init, self._seed, keys, rows, self.slab.values)
        self.slab.reset_state(rows)
        for arr in (self.show, self.click, self.delta_score):
            arr[rows] = 0.0
        self.last_step[rows], self.last_day[rows] = stamp(self.stats.dtype, self.step, self.day)
        return rows

    # ------------------------------------------------------------ growth and the tables budget

    def share_budget(self, budget: TablesBudget) -> None:
        """Count this shard against ``budget`` (a pserver's, for all its tables) from now on:
        claim what its slab and index may take (:func:`claim_nbytes`); it may grow only into
        what the budget has free."""
        self.slab.share_budget(budget)

    def _grow(self, needed: int, *, partial: bool = False) -> None:
        """Grow the slab to at least ``needed`` rows (:meth:`RowSlab.grow`, ``partial`` as there)."""
        self.slab.grow(needed, partial=partial)
        self._tracked_rows = self.capacity  # change tracking's bitmaps widen when next used (tracking.py)

    @property
    def growth_due(self) -> bool:
        """True when :meth:`reserve` has work (:attr:`RowSlab.growth_due`)."""
        return self.slab.growth_due

    def reserve(self) -> None:
        """Grow and map the slab and the index ahead of the next keys (:meth:`RowSlab.reserve`):
        a server runs it in a thread while pushes wait (pulls may read meanwhile)."""
        self.slab.reserve()
        self._tracked_rows = self.capacity

    @property
    def resize_draining(self) -> bool:
        """True while the index drains an old slot array into a new one (both held)."""
        return self.index.resizing

    def drain_resize(self, slots: int) -> bool:
        """Move at most ``slots`` old slots of a draining resize (:meth:`HashIndex.rehash_step`,
        O(slots), on the caller's thread: a write, as a push is); True when none are left. A
        server runs it when the table is idle, so that the old array's memory goes back without
        waiting for the inserts whose pace drains it."""
        return self.index.rehash_step(slots)

    # ------------------------------------------------------------ eviction

    def evict_plan(self, count: int, protected_rows: np.ndarray | None = None) -> np.ndarray:
        """The ``count`` (at most) held keys of lowest score, never one whose row is in
        ``protected_rows``. Reads the index and statistics only (see the module's note)."""
        # by row, never a copy of every key: a cap's eviction runs while the table is at its
        # cap, and its temporaries (one byte and at most 8 bytes a key) count against it
        marked = self.index.held_rows()
        guard = np.zeros(marked.shape[0] if protected_rows is not None and protected_rows.size else 0, np.bool_)
        if guard.size:
            guard[protected_rows] = True
        k = mark_victims(marked, guard, self.show, self.click, int(count), np.uint64(self._seed),
                          np.uint64(self.evicted), self.accessor.nonclk_coeff, self.accessor.click_coeff)
        return self.index.keys_of(marked, k)

    @property
    def eviction_due(self) -> int:
        """Keys a server should evict ahead of pushes (off its event loop) so that admissions
        under ``max_keys`` seldom evict inline (:func:`~.evict.evictions_ahead`)."""
        return evictions_ahead(self.spec.max_keys, len(self), self._wanted)

    def delete_keys(self, keys: np.ndarray) -> int:
        """Delete held ``keys`` (unknown ones are skipped); returns how many went, counted as
        evicted and noted for the next delta save (:attr:`deleted`). O(len(keys)): a caller
        that must stay responsive passes slices."""
        keys = _check_keys(self.name, keys)
        gone = keys[self.index.delete(keys) >= 0]
        self.deleted.note(gone)
        self.evicted += int(gone.shape[0])
        return int(gone.shape[0])

    def shrink(
        self, decay: float | None = None, threshold: float | None = None, ttl: int | None = None, days: int = 0
    ) -> int:
        """Advance the day by ``days``, decay every key's show and click by ``decay``, then
        delete the keys whose score is under ``threshold`` (None: the accessor's
        ``show_click_decay`` and ``delete_threshold``), that no push reached in more than
        ``ttl`` steps (None: no TTL), or unseen for more than the table's ``ttl_days`` days.

        Returns how many keys were deleted. O(keys held): :meth:`shrink_plan` then
        :meth:`delete_keys`, which a server runs apart (the module's note)."""
        return self.delete_keys(self.shrink_plan(decay, threshold, ttl, days))

    def shrink_plan(
        self, decay: float | None = None, threshold: float | None = None, ttl: int | None = None, days: int = 0
    ) -> np.ndarray:
        """Advance the day, decay every key's show and click, and return the keys :meth:`shrink`
        deletes. Writes only the statistics and the day (which pulls never read), so it may run
        while pulls are served."""
        most = MAX_COMPACT_DAYS if compact(self.stats.dtype) else MAX_DAYS
        if not 0 <= days <= most or self.day + days > np.iinfo(np.int32).max:
            raise _bad(ErrorCode.BAD_REQUEST, self.name, f"a shrink advances the day by 0 to {most} days, got {days}")
        if ttl is not None and compact(self.stats.dtype):
            raise _bad(ErrorCode.BAD_REQUEST, self.name,
                       "a table with compact statistics keeps no last step: shrink it by days (ttl_days), not ttl")
        self.day += days
        rules = self.accessor
        decay = rules.show_click_decay if decay is None else decay
        threshold = rules.delete_threshold if threshold is None else threshold
        keys, rows = self.index.items()
        dead = np.empty(keys.shape[0], np.bool_)
        decay_and_judge(self.show, self.click, self.last_step, self.last_day, self.index.rows_used, rows, float(decay),
                        float(threshold), -1 if ttl is None else int(ttl), self.step,
                        -1 if self.spec.ttl_days is None else int(self.spec.ttl_days), self.day, rules.nonclk_coeff,
                        rules.click_coeff, dead)
        return keys[dead]

    # ------------------------------------------------------------ bookkeeping

    @property
    def nbytes(self) -> int:
        """Bytes reserved: the slab (values, optimizer state, statistics), both indexes, change
        tracking and the keys deleted since the last base or delta save."""
        pending = self.admission.nbytes
        tracking = self.tracking_nbytes + (self._row_keys.nbytes if self._row_keys is not None else 0)
        return int(self.slab.nbytes + self.index.nbytes + pending + tracking + self.deleted.nbytes)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one key's row: value, optimizer state and statistics."""
        return self.slab.row_nbytes

    def counts(self) -> dict[str, int]:
        """What TABLE_INFO and STATS report of this shard: keys held, bytes reserved, and keys
        admitted, occurrences rejected (those of them for a size budget: ``over_budget``) and
        keys evicted since it was created."""
        return {"keys": len(self), "bytes": self.nbytes, "admitted": self.admitted, "rejected": self.rejected,
                "evicted": self.evicted, "over_budget": self.over_budget}

    def slab_arrays(self) -> dict[str, np.ndarray]:
        """The per-row arrays by name, live (not copies): ``values``, the optimizer state and
        the statistics; indexed by the rows :attr:`index` gives keys."""
        return {"values": self.values, **self.state, "show": self.show, "click": self.click,
                "delta_score": self.delta_score, "last_step": self.last_step, "last_day": self.last_day}

    def rows_of(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of held keys' rows by name (:meth:`slab_arrays`); for checkpoints and tests.
        Unknown keys are an error."""
        keys = _check_keys(self.name, keys)
        rows = self.index.lookup(keys)
        if (rows < 0).any():
            raise _bad(ErrorCode.BAD_REQUEST, self.name, f"key {int(keys[np.argmax(rows < 0)])} is not held")
        return {name: arr[rows] for name, arr in self.slab_arrays().items()}

    # ------------------------------------------------------------ checkpoints

    def after_save(self, rows: np.ndarray, deleted: np.ndarray) -> None:
        """A base or delta save is in place: the ``rows`` it wrote start a new delta (their delta
        score is reset) and the ``deleted`` keys it covered (what :attr:`deleted` held when it
        was written) are forgotten; deletions are recorded from now on."""
        self.accessor.after_save(self.delta_score, rows)
        self.deleted.forget(deleted)

    @property
    def pending_resets(self) -> int:
        """Times the admission's pending counter was full and started over (checkpoints keep it)."""
        return self.admission.resets

    @pending_resets.setter
    def pending_resets(self, value: int) -> None:
        self.admission.resets = value

    def pending_items(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys not admitted yet that ``admit_count`` is counting, and their counts (empty
        without ``admit_count``): a checkpoint keeps them, so a load does not start them over."""
        return self.admission.items()

    def replace_pending(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Count exactly these not-admitted keys (a delta's counters replace a base's)."""
        self.admission.replace(keys, counts)

    def restore(self, keys: np.ndarray, arrays: dict[str, np.ndarray], pending: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Put saved keys back with their rows (:meth:`slab_arrays` by name, one row per key)
        and saved admission counters (keys, counts), as a checkpoint load does; returns the
        rows the keys took. The keys must not be held; more than the shard may hold
        (``max_keys``, a size budget) is an error."""
        keys = _check_keys(self.name, keys)
        if len(self) + keys.shape[0] > self.key_limit:
            raise _bad(ErrorCode.TOO_LARGE, self.name,
                       f"{len(self) + keys.shape[0]} keys exceed the {self.key_limit} this shard may hold")
        if self.index.free_rows < keys.shape[0]:
            self._grow(len(self) + keys.shape[0])
        rows = self.index.insert(keys)
        self._note_keys(keys, rows)
        for name, arr in self.slab_arrays().items():
            arr[rows] = arrays[name]
        self.admission.restore(*pending)
        return rows

