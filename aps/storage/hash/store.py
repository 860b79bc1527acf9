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
  keys whose score is under a threshold or that were not pushed for ``ttl`` steps.
* Days, as the reference's ``unseen_days``: the shard keeps a day counter that only a shrink's
  ``days`` advances (a daily job's shrink passes 1), and each key the day of its last push
  (``last_day``); a key is unseen for ``day - last_day`` days, and a shrink deletes the keys
  unseen for more than the table's ``ttl_days``. A counter the client advances, not the wall
  clock: every pserver counts the same days, so a reshard keeps them, and a replayed stream of
  old data ages keys by its own days.
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

Without ``max_keys`` the slab grows by doubling (one copy per doubling, like a list); the index
resizes in pieces (see :mod:`.hash_index`). Nothing here touches sockets or the event loop; what
walks the whole table comes in two halves for a server that must keep answering meanwhile: a
plan that only reads the index (:meth:`shrink_plan`, :meth:`evict_plan`, and :meth:`reserve`,
which copies the slab) and may run in a thread while pulls read, and :meth:`delete_keys`, which
a caller runs in slices between requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import njit

from ...errors import ErrorCode
from ...specs import MAX_DAYS, HashTable
from .. import optim
from ..init_kernels import init_key_rows, table_seed
from ..pages import fault_in_zeros
from ..prefetch import prefetch
from ..tables import TablesBudget, _bad, _check_scale, _check_values
from .accessor import CtrAccessor
from .admission import KeyAdmission
from .evict import mark_victims, row_score
from .index import MAX_ROWS, HashIndex, index_nbytes
from .tracking import HashChangeTracking

#: a max_keys cap evicts this share of the cap at once
EVICT_SHARE = 1 / 16
_MIN_ROWS = 1024
#: a HashIndex's counters (int64[6]) beside its arrays
_INDEX_META_NBYTES = 48
#: slab rows kept mapped ahead of the rows keys have used, in pushes' worth of new keys
#: (:meth:`HashSparseStore.reserve`), and the most bytes of rows that may be
MAP_AHEAD_PUSHES = 2
MAP_AHEAD_BYTES = 64 << 20
#: rows ahead whose statistics :func:`_add_stats` asks for (aps/storage/prefetch.py)
_STATS_AHEAD = 16
#: a row's statistics side by side: a push writes all five, and in five arrays of millions of
#: rows that was five misses to memory a row where one record costs one (24 bytes, unpadded)
STATS = np.dtype([("show", np.float32), ("click", np.float32), ("delta_score", np.float32),
                  ("last_day", np.int32), ("last_step", np.int64)])


@njit(cache=True, nogil=True)
def _add_stats(show, click, delta, last, last_day, rows, shows, clicks, step, day, nonclk, clk):
    """Add each pushed occurrence's show and click (1 and 0 when not given) to its row, and mark
    the row seen at ``step`` and ``day``."""
    for i in range(rows.shape[0]):
        if i + _STATS_AHEAD < rows.shape[0]:  # one record (STATS), which may cross a line
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


@njit(cache=True, nogil=True)
def _decay_and_judge(show, click, last_step, last_day, used, rows, decay, threshold, ttl, step, ttl_days, day, nonclk, clk, dead):
    """A shrink's pass over the statistics, in place and without the GIL: decay the first
    ``used`` rows' show and click by ``decay`` (in float64, stored as float32), then ``dead[i]``:
    row ``rows[i]`` scores under ``threshold`` (:meth:`CtrAccessor.score`), or was last pushed more
    than ``ttl`` steps / ``ttl_days`` days ago (negative: no such rule). One pass and no
    temporaries: numpy's version of it allocated ~30 bytes a key, half a gigabyte at 10M keys."""
    for r in range(used):
        show[r] = np.float32(np.float64(show[r]) * decay)
        click[r] = np.float32(np.float64(click[r]) * decay)
    for i in range(rows.shape[0]):
        r = rows[i]
        out = row_score(show, click, r, nonclk, clk) < threshold
        if ttl >= 0 and step - last_step[r] > ttl:
            out = True
        if ttl_days >= 0 and day - last_day[r] > ttl_days:
            out = True
        dead[i] = out


def _stat_view(field: str, doc: str) -> property:
    """A store attribute reading one field of its :data:`STATS` records (a strided view)."""
    return property(lambda store: store.stats[field], doc=f"{doc} A view of ``stats``.")


def _check_keys(table: str, keys: object) -> np.ndarray:
    if not isinstance(keys, np.ndarray) or keys.dtype != np.int64:
        kind = keys.dtype if isinstance(keys, np.ndarray) else type(keys).__name__
        raise _bad(ErrorCode.BAD_REQUEST, table, f"keys must be an int64 array, got {kind}")
    if keys.ndim != 1:
        raise _bad(ErrorCode.SHAPE_MISMATCH, table, f"keys must be 1-D, got shape {keys.shape}")
    return np.ascontiguousarray(keys)


_NONE = np.empty(0, np.float32)
_NO_ROWS = np.empty(0, np.int64)


def row_nbytes(spec: HashTable) -> int:
    """Bytes of one key's slab row: value, optimizer state and statistics."""
    template = optim.new_sparse_state(spec.optimizer, 1, spec.dim)
    return 4 * spec.dim + sum(a.itemsize * math.prod(a.shape[1:]) for a in template.values()) + STATS.itemsize


def planned_nbytes(spec: HashTable, keys: int) -> int:
    """Bytes a shard holding ``keys`` keys takes by the size rule of ``--max-table-bytes``: the
    slab rows, the index right after a resize, and the admission counters when ``admit_count``
    needs them (``pending_keys`` of them, with their own index)."""
    pending = spec.pending_keys * 8 + index_nbytes(spec.pending_keys) if spec.admit_count > 1 else 0
    return keys * row_nbytes(spec) + index_nbytes(keys) + pending


def _index_claim(keys: int) -> int:
    """The most bytes a :class:`HashIndex` for up to ``keys`` keys holds: its free list, and its
    slot array beside the one it drains (half its size) or the one made ahead for the next
    resize (made only while keys may pass the current array's load: then it is this array).
    A resize is sized for the keys held, so the last array is at most :func:`index_nbytes`'s."""
    slots = index_nbytes(keys) - 4 * keys
    return index_nbytes(keys) + slots // 2 + _INDEX_META_NBYTES


def _pending_claim(spec: HashTable) -> int:
    """The most bytes ``admit_count``'s counters take (none without it)."""
    return spec.pending_keys * 8 + _index_claim(spec.pending_keys) if spec.admit_count > 1 else 0


def claim_nbytes(spec: HashTable, rows: int) -> int:
    """The most bytes a shard whose slab has ``rows`` rows takes while keys fill it: what it
    claims of a pserver's tables budget (``--max-tables-bytes``) before its slab grows to
    ``rows``. Slab rows (value, optimizer state, statistics), the index at its peak
    (:func:`_index_claim`) and the admission counters; not change tracking, which has a budget
    of its own (``--max-tracking-bytes``)."""
    return rows * row_nbytes(spec) + _index_claim(rows) + _pending_claim(spec)


def budget_keys(spec: HashTable, budget: int) -> int:
    """The most keys whose :func:`planned_nbytes` fits in ``budget`` bytes (0 if none)."""
    return _most(0, MAX_ROWS, lambda keys: planned_nbytes(spec, keys) <= budget)


def _most(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [low, high] that ``fits``, by bisection: sizes grow with keys or rows,
    so what fits is a prefix. ``low`` is taken to fit."""
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


class HashSparseStore(HashChangeTracking):
    """The keys one pserver holds of a :class:`~aps.specs.HashTable`, with their rows, optimizer
    state and statistics. ``rows``: slab rows to reserve (default ``max_keys``, else 1024);
    ``key_limit``: keys past it are rejected (a size budget; None: only ``max_keys`` bounds)."""

    def __init__(self, spec: HashTable, rows: int | None = None, *, key_limit: int | None = None) -> None:
        self.spec = spec
        #: what shows and clicks mean: scores, save selection, shrink defaults (accessor.py)
        self.accessor = CtrAccessor.of(spec)
        self.key_limit = min(MAX_ROWS, spec.max_keys or MAX_ROWS, MAX_ROWS if key_limit is None else key_limit)
        capacity = min(int(rows or spec.max_keys or _MIN_ROWS), self.key_limit)
        self.index = HashIndex(capacity)
        self._template = optim.new_sparse_state(spec.optimizer, 1, spec.dim)
        self._row_nbytes = row_nbytes(spec)  # asked after every push (_map_ahead_rows): made once
        self.values = np.zeros((capacity, spec.dim), np.float32)
        self.state = {n: np.zeros((capacity, *a.shape[1:]), a.dtype) for n, a in self._template.items()}
        self.stats = np.zeros(capacity, STATS)  # per row; its fields are views (show, click, ...)
        self._mapped = 0  # slab rows below it were written at least once (map_ahead)
        self._recent_new = 0  # keys a push admitted lately: the largest, fading by 1/8 a push
        self.day = 0  # days counted by shrinks (the module's note)
        self.step = 0  # completed optimizer applications (lr decay, last_step)
        self.pushes = 0  # push calls: the admission draws' counter
        self.admitted = self.rejected = self.evicted = 0
        self.over_budget = 0  # occurrences of new keys rejected for lack of room (also in rejected)
        self._budget: TablesBudget | None = None  # the pserver's budget for all its tables
        self._claimed = 0  # bytes claimed of it
        self._refused_at = -1  # the budget's version when it last had no room for more rows
        self._pending_claim = _pending_claim(spec)
        self._wanted = 0  # keys the last push wanted admitted (eviction_due keeps room for as many)
        self._seed = table_seed(spec.name, spec.seed)
        #: which unseen keys are admitted: counts and draws (admission.py)
        self.admission = KeyAdmission(spec, self._seed)
        self._init_hash_tracking(capacity)

    @property
    def name(self) -> str:
        return self.spec.name

    show = _stat_view("show", "Shows per slab row (decayed by shrinks).")
    click = _stat_view("click", "Clicks per slab row (decayed by shrinks).")
    delta_score = _stat_view("delta_score", "Score gained since the last base or delta save.")
    last_step = _stat_view("last_step", "The shard step of each row's last push.")
    last_day = _stat_view("last_day", "The day of each row's last push.")

    def __len__(self) -> int:
        """Keys held."""
        return len(self.index)

    # ------------------------------------------------------------ data path

    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys``, float32[n, dim]; an unknown key reads its initial row and stays
        unknown."""
        keys = _check_keys(self.name, keys)
        out = np.empty((keys.shape[0], self.spec.dim), np.float32)
        rows, unknown = self.index.gather(keys, self.values, out)
        if unknown:
            at = np.flatnonzero(rows < 0)
            init_key_rows(self.spec.init, self._seed, keys[at], at, out)
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

        def update(rows: np.ndarray, g: np.ndarray, ordered: bool) -> None:
            optim.apply_sparse(self.spec.optimizer, self.values, self.state, rows, g, scale, self.step, ordered=ordered)

        return self._push(keys, grads, "grads", shows, clicks, distinct, advance_step, client, update)

    def push_delta(
        self, keys: np.ndarray, deltas: np.ndarray, *, shows: np.ndarray | None = None, clicks: np.ndarray | None = None,
        advance_step: bool = True, client: int | None = None, distinct: bool = False,
    ) -> int:
        """GEO's ``param += delta`` per held key (repeats summed), after admitting unknown keys
        as a gradient push does (an admitted key starts from its initial row), and their
        statistics as for :meth:`push_grad` (one show and no click per occurrence when not
        given). Returns how many keys were admitted. ``distinct`` as for :meth:`push_grad`."""

        def update(rows: np.ndarray, d: np.ndarray, ordered: bool) -> None:
            optim.add_rows(self.values, rows, d, ordered=ordered)

        return self._push(keys, deltas, "deltas", shows, clicks, distinct, advance_step, client, update)

    def _push(
        self, keys: np.ndarray, values: np.ndarray, what: str, shows: np.ndarray | None, clicks: np.ndarray | None,
        distinct: bool, advance_step: bool, client: int | None, update: Callable[[np.ndarray, np.ndarray, bool], None],
    ) -> int:
        """What both pushes do around their update: check every array (before anything
        changes), admit, drop the occurrences not admitted, ``update(rows, values, ordered)`` the
        held rows, add the statistics. Returns how many keys were admitted."""
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
        update(rows, values, ordered)
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
        rules = self.accessor
        _add_stats(self.show, self.click, self.delta_score, self.last_step, self.last_day, rows, shows, clicks,
                   self.step, self.day, rules.nonclk_coeff, rules.click_coeff)
        self._recent_new = max(int(new.size), self._recent_new - self._recent_new // 8)
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
        if cap is not None and len(self) + wanted > cap:
            over = len(self) + min(wanted, cap) - cap
            self.delete_keys(self.evict_plan(over + int(cap * EVICT_SHARE), protected_rows))
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
        if self._budget is not None:
            self._budget.refused(self.name, occurrences, len(self), self.key_limit)

    # ------------------------------------------------------------ the tables budget

    def share_budget(self, budget: TablesBudget) -> None:
        """Count this shard against ``budget`` (a pserver's, for all its tables) from now on:
        claim what its slab and index may take (:func:`claim_nbytes`); it may grow only into
        what the budget has free."""
        self._budget, self._claimed, self._refused_at = budget, 0, -1
        self._claim(self.capacity)

    def _claim_nbytes(self, rows: int) -> int:
        """:func:`claim_nbytes` for this shard, without building the optimizer's template."""
        return rows * self._row_nbytes + _index_claim(rows) + self._pending_claim

    def _claim(self, rows: int) -> None:
        """Claim of the budget what a slab of ``rows`` rows may take (replacing the last claim)."""
        if self._budget is not None:
            claim = self._claim_nbytes(rows)
            self._budget.take(claim - self._claimed)
            self._claimed = claim

    def _rows_in_budget(self, rows: int) -> int:
        """The most slab rows, at most ``rows`` and at least those held, that the budget has room
        for. O(1) while the budget has room, or had none and nothing changed since."""
        budget = self._budget
        if budget is None or self._claim_nbytes(rows) - self._claimed <= budget.free:
            return rows
        if budget.version == self._refused_at:
            return self.capacity
        free = budget.free + self._claimed  # the rows held are claimed already
        fit = _most(self.capacity, rows - 1, lambda n: self._claim_nbytes(n) <= free)
        if fit == self.capacity:
            self._refused_at = budget.version
        return fit

    @property
    def _budget_full(self) -> bool:
        """The budget had no room for one more row, and nothing changed since."""
        return self._budget is not None and self._refused_at == self._budget.version

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
        under ``max_keys`` seldom evict inline: 0 while the room under the cap is at least
        1/16 of it and what the last push wanted admitted (at most a quarter of the cap); else
        enough to make that room, and 1/32 of the cap more."""
        cap = self.spec.max_keys
        if cap is None:
            return 0
        want = max(int(cap * EVICT_SHARE), min(self._wanted, cap // 4))
        room = cap - len(self)
        if room >= want:
            return 0
        return min(len(self), want - room + int(cap * EVICT_SHARE / 2))

    def delete_keys(self, keys: np.ndarray) -> int:
        """Delete held ``keys`` (unknown ones are skipped); returns how many went, counted as
        evicted. O(len(keys)): a caller that must stay responsive passes slices."""
        count = int((self.index.delete(_check_keys(self.name, keys)) >= 0).sum())
        self.evicted += count
        return count

    def _allocate(self, keys: np.ndarray) -> np.ndarray:
        """Rows for new ``keys``, reset to their initial value, state and statistics."""
        if self.index.free_rows < keys.shape[0]:
            self._grow(len(self) + keys.shape[0])
        rows = self.index.insert(keys)
        self._note_keys(keys, rows)
        init_key_rows(self.spec.init, self._seed, keys, rows, self.values)
        for name, arr in self.state.items():
            arr[rows] = self._template[name][0]
        for arr in (self.show, self.click, self.delta_score):
            arr[rows] = 0.0
        self.last_step[rows] = self.step
        self.last_day[rows] = self.day
        return rows

    @property
    def _slab_growth_due(self) -> bool:
        return self.capacity < self.key_limit and self.index.free_rows < self.capacity // 4 and not self._budget_full

    @property
    def _map_ahead_rows(self) -> int:
        """Rows :meth:`reserve` keeps mapped past the used ones: :data:`MAP_AHEAD_PUSHES` times
        the keys a push admitted lately, at least 1024 rows, at most :data:`MAP_AHEAD_BYTES`,
        never past the slab's end. Sized by the pushes, not the table: mapped rows are memory
        held before keys need it (a fixed 64 MiB was 42 bytes more per key at 1 M keys)."""
        want = min(MAP_AHEAD_BYTES // self.row_nbytes, MAP_AHEAD_PUSHES * self._recent_new)
        return min(self.capacity - self.index.rows_used, max(_MIN_ROWS, want))

    @property
    def _map_ahead_due(self) -> bool:
        rows = self._map_ahead_rows
        return rows > 0 and self._mapped - self.index.rows_used <= rows // 2

    @property
    def growth_due(self) -> bool:
        """True when :meth:`reserve` has work: fewer than a quarter of the slab's rows are free
        and it may still grow, fewer than half the rows it maps ahead are left
        (:attr:`_map_ahead_rows`), or the index should make its next slot array
        (:meth:`HashIndex.resize_ahead_due`). A server then runs it off its event loop before a
        push has to do any of it inline."""
        return self._slab_growth_due or self._map_ahead_due or self.index.resize_ahead_due(self.capacity)

    def reserve(self) -> None:
        """Do what :attr:`growth_due` asks: double the slab (up to ``key_limit`` rows and what
        the tables budget has room for), which copies every used row; map the slab rows the next
        new keys will take; make and map the index's next slot array. A server runs it in a thread while pushes wait (pulls may read
        meanwhile: no held row or slot changes).

        Why map ahead: the slab is lazily mapped zeros, so the first push to reach a row of a
        page stops while the OS finds and clears it; after a doubling every new key lands on
        fresh pages, and on a 2-core VM the first pushes after one waited 50-100 ms on the
        event loop. Mapping the rows of the next pushes here moves that wait off the loop while
        the slab still costs memory only near the rows keys use."""
        if self._slab_growth_due:
            self._grow(min(self.key_limit, 2 * self.capacity), partial=True)
        if self._map_ahead_due:
            self._map_ahead()
        if self.index.resize_ahead_due(self.capacity):  # keys never pass the slab's rows
            self.index.prepare_resize()

    def _map_ahead(self) -> None:
        """Write a zero into every page of the never-used slab rows up to
        :attr:`_map_ahead_rows` past the used ones (they are zeros: rows above
        :attr:`HashIndex.rows_used` were never taken)."""
        start = max(self._mapped, self.index.rows_used)
        stop = self.index.rows_used + self._map_ahead_rows
        for arr in (self.values, *self.state.values(), self.stats):
            fault_in_zeros(arr[start:stop])
        self._mapped = max(self._mapped, stop)

    def _grow(self, needed: int, *, partial: bool = False) -> None:
        """Double the slab (at least to ``needed`` rows, at most to ``key_limit`` and to what the
        tables budget has room for): lazily mapped zeros, used rows copied. ``partial``: grow as
        far as the budget lets it, even short of ``needed``; else that is an error."""
        capacity = min(MAX_ROWS, self.key_limit, max(needed, 2 * self.capacity))
        if capacity < needed:
            raise _bad(ErrorCode.TOO_LARGE, self.name, f"{needed} keys exceed the {capacity} rows this shard may hold")
        capacity = self._rows_in_budget(capacity)
        if capacity < needed and not partial:
            raise _bad(ErrorCode.TOO_LARGE, self.name, f"{needed} keys do not fit this pserver's budget for all tables "
                       f"({capacity} rows do; aps-server --max-tables-bytes)")
        if capacity <= self.capacity:
            return
        used = self.index.rows_used

        def grown(arr: np.ndarray) -> np.ndarray:
            out = np.zeros((capacity, *arr.shape[1:]), arr.dtype)
            out[:used] = arr[:used]
            return out

        self.values = grown(self.values)
        self.state = {n: grown(a) for n, a in self.state.items()}
        self.stats = grown(self.stats)
        self._mapped = used  # the copy wrote them; the rest of the new arrays are fresh zeros
        self.index.grow_rows(capacity)
        self._tracked_rows = capacity  # bitmaps widen when next used (tracking.py)
        self._claim(capacity)

    # ------------------------------------------------------------ eviction

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
        if not 0 <= days <= MAX_DAYS or self.day + days > np.iinfo(np.int32).max:
            raise _bad(ErrorCode.BAD_REQUEST, self.name, f"a shrink advances the day by 0 to {MAX_DAYS} days, got {days}")
        self.day += days
        rules = self.accessor
        decay = rules.show_click_decay if decay is None else decay
        threshold = rules.delete_threshold if threshold is None else threshold
        keys, rows = self.index.items()
        dead = np.empty(keys.shape[0], np.bool_)
        _decay_and_judge(self.show, self.click, self.last_step, self.last_day, self.index.rows_used, rows, float(decay),
                         float(threshold), -1 if ttl is None else int(ttl), self.step,
                         -1 if self.spec.ttl_days is None else int(self.spec.ttl_days), self.day, rules.nonclk_coeff,
                         rules.click_coeff, dead)
        return keys[dead]

    # ------------------------------------------------------------ bookkeeping

    @property
    def nbytes(self) -> int:
        """Bytes reserved: the slab (values, optimizer state, statistics) and both indexes."""
        slab = self.values.nbytes + sum(a.nbytes for a in self.state.values())
        stats = self.stats.nbytes
        pending = self.admission.nbytes
        tracking = self.tracking_nbytes + (self._row_keys.nbytes if self._row_keys is not None else 0)
        return int(slab + stats + self.index.nbytes + pending + tracking)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one key's row: value, optimizer state and statistics."""
        return self._row_nbytes

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

    def restore(self, keys: np.ndarray, arrays: dict[str, np.ndarray], pending: tuple[np.ndarray, np.ndarray]) -> None:
        """Put saved keys back with their rows (:meth:`slab_arrays` by name, one row per key)
        and saved admission counters (keys, counts), as a checkpoint load does. The keys must
        not be held; more than the shard may hold (``max_keys``, a size budget) is an error."""
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

