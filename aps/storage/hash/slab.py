"""A hash table's rows by slab row, and how the slab grows: the arrays a :class:`HashIndex`
gives keys rows in (values, optimizer state, per-row statistics), doubled as keys come, mapped
ahead of the keys that will take them, and bounded by a row limit and a pserver's tables budget.

Why apart from the store: the store (store.py) decides what a key's row holds and when a key
comes or goes; the slab only holds rows and grows with the index's row range (the two always
grow together, so the slab does both). aps-serve's served hash tables hold rows the same way,
values only, and grow by this same code.

How it grows: by doubling (one copy of the used rows per doubling, like a list) into lazily
mapped zeros, so rows cost memory only once keys use them. Growth and mapping are whole-slab
work, so a pserver asks :attr:`RowSlab.growth_due` after a push and runs :meth:`RowSlab.reserve`
in a thread, off its event loop, before a push has to do it inline.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping

import numpy as np

from ...errors import ErrorCode
from ..pages import fault_in_zeros, lazy_zeros
from ..tables import TablesBudget, _bad
from .index import MAX_ROWS, HashIndex, index_claim_nbytes

#: a slab's rows when nothing asks for more, and the fewest rows it maps ahead
MIN_ROWS = 1024
#: slab rows kept mapped ahead of the rows keys have used, in pushes' worth of new keys
#: (:meth:`RowSlab.reserve`), and the most bytes of rows that may be
MAP_AHEAD_PUSHES = 2
MAP_AHEAD_BYTES = 64 << 20


def most_that_fit(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [low, high] that ``fits``, by bisection: sizes grow with keys or rows,
    so what fits is a prefix. ``low`` is taken to fit."""
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


class RowSlab:
    """The per-row arrays over ``index``'s rows: ``values`` (``value_dtype``[rows, dim]), ``state``
    (one array per entry of ``template``, each a one-row array of its shape and dtype) and
    ``stats`` (records of dtype ``stats``; None: no statistics). ``name`` names the table in
    errors; ``max_rows``: the most rows it may grow to; ``extra_claim``: bytes the table claims
    of a tables budget beyond the slab and the index (:meth:`claim_nbytes`)."""

    def __init__(
        self, index: HashIndex, dim: int, template: Mapping[str, np.ndarray] | None = None, stats: np.dtype | None = None,
        *, name: str = "", max_rows: int = MAX_ROWS, extra_claim: int = 0, value_dtype: type = np.float32,
    ) -> None:
        self.index = index
        self.name = name
        self.max_rows = max_rows
        capacity = index.row_capacity
        #: one fresh row of each optimizer state array: what a new key's state starts from
        self.template = dict(template or {})
        self.values = lazy_zeros((capacity, dim), value_dtype)
        self.state = {n: lazy_zeros((capacity, *a.shape[1:]), a.dtype) for n, a in self.template.items()}
        self.stats = None if stats is None else lazy_zeros(capacity, stats)
        #: bytes of one row of every array; asked after every push (_map_ahead_rows): made once
        self.row_nbytes = self.values.itemsize * dim + sum(a.itemsize * math.prod(a.shape[1:]) for a in self.template.values()) + (
            0 if stats is None else stats.itemsize
        )
        self.extra_claim = extra_claim
        self._mapped = 0  # rows below it were written at least once (_map_ahead)
        self._recent_new = 0  # keys a push admitted lately: the largest, fading by 1/8 a push
        #: the pserver's budget for all its tables (None: none counts this slab)
        self.budget: TablesBudget | None = None
        self._claimed = 0  # bytes claimed of it
        self._refused_at = -1  # the budget's version when it last had no room for more rows

    @property
    def capacity(self) -> int:
        """Rows reserved (the index's row range)."""
        return self.index.row_capacity

    @property
    def mapped(self) -> int:
        """Rows below it were written at least once: the OS has mapped their pages."""
        return self._mapped

    @property
    def nbytes(self) -> int:
        """Bytes reserved by the arrays (not the index)."""
        return int(sum(a.nbytes for a in self.arrays()))

    def arrays(self) -> list[np.ndarray]:
        """Every per-row array, live: values, the optimizer state, the statistics."""
        return [self.values, *self.state.values(), *([] if self.stats is None else [self.stats])]

    def reset_state(self, rows: np.ndarray) -> None:
        """Give ``rows`` fresh optimizer state (the template's), as a key taking them starts with."""
        for name, arr in self.state.items():
            arr[rows] = self.template[name][0]

    def note_admitted(self, count: int) -> None:
        """A push admitted ``count`` keys: the rows mapped ahead follow the pushes' size."""
        self._recent_new = max(count, self._recent_new - self._recent_new // 8)

    def copy(self, index: HashIndex) -> RowSlab:
        """A copy of the rows over ``index`` (a copy of this slab's index)."""
        twin = copy.copy(self)
        twin.index = index
        twin.values = self.values.copy()
        twin.state = {n: a.copy() for n, a in self.state.items()}
        twin.stats = None if self.stats is None else self.stats.copy()
        return twin

    # ------------------------------------------------------------ growth

    def fit(self, rows: int) -> None:
        """Grow so that ``rows`` more keys have rows; too many for the row limit or the tables
        budget is an error (TOO_LARGE)."""
        if self.index.free_rows < rows:
            self.grow(len(self.index) + rows)

    def grow(self, needed: int, *, partial: bool = False) -> None:
        """Double the slab (at least to ``needed`` rows, at most to ``max_rows`` and to what the
        tables budget has room for): lazily mapped zeros, used rows copied. ``partial``: grow as
        far as the budget lets it, even short of ``needed``; else that is an error."""
        capacity = min(MAX_ROWS, self.max_rows, max(needed, 2 * self.capacity))
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
            out = lazy_zeros((capacity, *arr.shape[1:]), arr.dtype)
            out[:used] = arr[:used]
            return out

        self.values = grown(self.values)
        self.state = {n: grown(a) for n, a in self.state.items()}
        if self.stats is not None:
            self.stats = grown(self.stats)
        self._mapped = used  # the copy wrote them; the rest of the new arrays are fresh zeros
        self.index.grow_rows(capacity)
        self._claim(capacity)

    @property
    def _slab_growth_due(self) -> bool:
        return self.capacity < self.max_rows and self.index.free_rows < self.capacity // 4 and not self._budget_full

    @property
    def _map_ahead_rows(self) -> int:
        """Rows :meth:`reserve` keeps mapped past the used ones: :data:`MAP_AHEAD_PUSHES` times
        the keys a push admitted lately, at least 1024 rows, at most :data:`MAP_AHEAD_BYTES`,
        never past the slab's end. Sized by the pushes, not the table: mapped rows are memory
        held before keys need it (a fixed 64 MiB was 42 bytes more per key at 1 M keys)."""
        want = min(MAP_AHEAD_BYTES // self.row_nbytes, MAP_AHEAD_PUSHES * self._recent_new)
        return min(self.capacity - self.index.rows_used, max(MIN_ROWS, want))

    @property
    def _keys_coming(self) -> int:
        """New keys the next pushes may bring: what the slab maps rows ahead for, at least
        :data:`MIN_ROWS` (the index makes its next slot array no sooner than they need it)."""
        return max(MIN_ROWS, MAP_AHEAD_PUSHES * self._recent_new)

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
        return self._slab_growth_due or self._map_ahead_due or self.index.resize_ahead_due(self.capacity, self._keys_coming)

    def reserve(self) -> None:
        """Do what :attr:`growth_due` asks: double the slab (up to ``max_rows`` rows and what
        the tables budget has room for), which copies every used row; map the slab rows the next
        new keys will take; make and map the index's next slot array. A server runs it in a
        thread while pushes wait (pulls may read meanwhile: no held row or slot changes).

        Why map ahead: the slab is lazily mapped zeros, so the first push to reach a row of a
        page stops while the OS finds and clears it; after a doubling every new key lands on
        fresh pages, and on a 2-core VM the first pushes after one waited 50-100 ms on the
        event loop. Mapping the rows of the next pushes here moves that wait off the loop while
        the slab still costs memory only near the rows keys use."""
        if self._slab_growth_due:
            self.grow(min(self.max_rows, 2 * self.capacity), partial=True)
        if self._map_ahead_due:
            self._map_ahead()
        if self.index.resize_ahead_due(self.capacity, self._keys_coming):  # keys never pass the slab's rows
            self.index.prepare_resize()

    def _map_ahead(self) -> None:
        """Write a zero into every page of the never-used slab rows up to
        :attr:`_map_ahead_rows` past the used ones (they are zeros: rows above
        :attr:`HashIndex.rows_used` were never taken)."""
        start = max(self._mapped, self.index.rows_used)
        stop = self.index.rows_used + self._map_ahead_rows
        for arr in self.arrays():
            fault_in_zeros(arr[start:stop])
        self._mapped = max(self._mapped, stop)

    # ------------------------------------------------------------ the tables budget

    def share_budget(self, budget: TablesBudget) -> None:
        """Count this slab against ``budget`` (a pserver's, for all its tables) from now on:
        claim what it and its index may take (:meth:`claim_nbytes`); it may grow only into
        what the budget has free."""
        self.budget, self._claimed, self._refused_at = budget, 0, -1
        self._claim(self.capacity)

    def claim_nbytes(self, rows: int) -> int:
        """The most bytes the table takes while keys fill a slab of ``rows`` rows: the rows, the
        index at its peak and :attr:`extra_claim` (``claim_nbytes`` of store.py, made once)."""
        return rows * self.row_nbytes + index_claim_nbytes(rows) + self.extra_claim

    def _claim(self, rows: int) -> None:
        """Claim of the budget what a slab of ``rows`` rows may take (replacing the last claim)."""
        if self.budget is not None:
            claim = self.claim_nbytes(rows)
            self.budget.take(claim - self._claimed)
            self._claimed = claim

    def _rows_in_budget(self, rows: int) -> int:
        """The most slab rows, at most ``rows`` and at least those held, that the budget has room
        for. O(1) while the budget has room, or had none and nothing changed since."""
        budget = self.budget
        if budget is None or self.claim_nbytes(rows) - self._claimed <= budget.free:
            return rows
        if budget.version == self._refused_at:
            return self.capacity
        free = budget.free + self._claimed  # the rows held are claimed already
        fit = most_that_fit(self.capacity, rows - 1, lambda n: self.claim_nbytes(n) <= free)
        if fit == self.capacity:
            self._refused_at = budget.version
        return fit

    @property
    def _budget_full(self) -> bool:
        """The budget had no room for one more row, and nothing changed since."""
        return self.budget is not None and self._refused_at == self.budget.version
