"""Which keys a hash table shard's ``max_keys`` cap evicts: the lowest scores, found by row;
how many it evicts, inline and ahead of need; and which keys a shrink deletes.

Why by row and compiled: the cap evicts while the table is at its cap, so whatever the search
allocates comes on top of the cap's memory, and the search runs in a thread beside the event
loop, so it must not hold the GIL. Copying every key with its row, a shuffle and float64 scores
(numpy, as before) cost about 56 bytes a key (56 MiB at 1 M keys, 30% over the cap's own bytes)
and held the GIL through each sort. Here the walk reads the statistics by slab row with one byte
a row saying which rows are held, selects the cut with an in-place quickselect over 8 bytes a
candidate, and marks the victims in that same byte array; :meth:`HashIndex.keys_of` then names
their keys.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..init_kernels import key_uniform
from .stats import PIN_DAYS

#: a max_keys cap evicts this share of the cap at once
EVICT_SHARE = 1 / 16


def evictions_now(cap: int | None, held: int, wanted: int) -> int:
    """Keys to evict before ``wanted`` new keys are admitted to a shard holding ``held`` under
    ``cap`` (None: no cap): none while they fit; else the overflow and 1/16 of the cap more, so
    the walk that finds them is paid once per many admissions."""
    if cap is None or held + wanted <= cap:
        return 0
    return held + min(wanted, cap) - cap + int(cap * EVICT_SHARE)


def evictions_ahead(cap: int | None, held: int, wanted: int) -> int:
    """Keys a server should evict ahead of pushes (off its event loop) so that admissions
    under ``cap`` seldom evict inline: 0 while the room under the cap is at least 1/16 of it
    and what the last push wanted admitted (``wanted``, at most a quarter of the cap); else
    enough to make that room, and 1/32 of the cap more."""
    if cap is None:
        return 0
    want = max(int(cap * EVICT_SHARE), min(wanted, cap // 4))
    room = cap - held
    if room >= want:
        return 0
    return min(held, want - room + int(cap * EVICT_SHARE / 2))


@njit(cache=True, nogil=True, inline="always")
def row_score(show, click, r, nonclk, clk):
    """Row ``r``'s ``nonclk * (show - click) + clk * click`` in float64 (Paddle's CTR accessor;
    :meth:`aps.storage.hash.accessor.CtrAccessor.score` is the same over arrays)."""
    s = np.float64(show[r])
    c = np.float64(click[r])
    return nonclk * (s - c) + clk * c


@njit(cache=True, nogil=True)
def _select_kth(vals, k):
    """The k-th smallest (0-based) of ``vals``, which it reorders in place (quickselect)."""
    lo, hi = 0, vals.shape[0] - 1
    while lo < hi:
        pivot = vals[(lo + hi) // 2]
        i, j = lo, hi
        while i <= j:
            while vals[i] < pivot:
                i += 1
            while vals[j] > pivot:
                j -= 1
            if i <= j:
                vals[i], vals[j] = vals[j], vals[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return vals[k]
    return vals[k]


@njit(cache=True, nogil=True)
def mark_victims(held, guard, show, click, count, seed, counter, nonclk, clk):
    """Leave ``held[r]`` True only for the ``count`` (at most) held rows of lowest score that
    ``guard`` does not protect (``guard`` empty: none is). Rows whose score ties the cut are
    taken uniformly at random (selection sampling on stateless draws per row), so a cap's
    victims of equal score are spread over the slots. Returns how many rows are marked."""
    n = held.shape[0]
    guarded = guard.shape[0] > 0
    m = 0
    for r in range(n):
        if held[r] and not (guarded and guard[r]):
            m += 1
    k = min(count, m)
    if k <= 0:
        held[:] = False
        return 0
    vals = np.empty(m, np.float64)
    m = 0
    for r in range(n):
        if held[r] and not (guarded and guard[r]):
            vals[m] = row_score(show, click, r, nonclk, clk)
            m += 1
    cut = _select_kth(vals, k - 1)
    below = ties = 0
    for i in range(m):
        if vals[i] < cut:
            below += 1
        elif vals[i] == cut:
            ties += 1
    need = k - below  # ties to take, >= 1
    seen = taken = 0
    for r in range(n):
        if not held[r] or (guarded and guard[r]):
            held[r] = False
            continue
        s = row_score(show, click, r, nonclk, clk)
        if s == cut:
            keep = key_uniform(seed, r, counter) * (ties - seen) < need - taken
            seen += 1
            taken += keep
            held[r] = keep
        else:
            held[r] = s < cut
    return k


@njit(cache=True, nogil=True, inline="always")
def _unseen(last_day, r, day):
    """Days since row ``r``'s last push: 16-bit last days (compact statistics) count modulo 2^16
    (aps/storage/hash/stats.py)."""
    if last_day.itemsize == 2:
        return (day - np.int64(last_day[r])) & 0xFFFF
    return day - np.int64(last_day[r])


@njit(cache=True, nogil=True)
def decay_and_judge(show, click, last_step, last_day, used, rows, decay, threshold, ttl, step, ttl_days, day, nonclk, clk, dead):
    """A shrink's pass over the statistics, in place and without the GIL: decay the first
    ``used`` rows' show and click by ``decay`` (in float64, stored as float32), then ``dead[i]``:
    row ``rows[i]`` scores under ``threshold`` (:meth:`CtrAccessor.score`), or was last pushed more
    than ``ttl`` steps / ``ttl_days`` days ago (negative: no such rule). One pass and no
    temporaries: numpy's version of it allocated ~30 bytes a key, half a gigabyte at 10M keys.
    16-bit last days have their unseen days pinned at 2^15 in the same pass (stats.py's note)."""
    for r in range(used):
        show[r] = np.float32(np.float64(show[r]) * decay)
        click[r] = np.float32(np.float64(click[r]) * decay)
        if last_day.itemsize == 2 and _unseen(last_day, r, day) > PIN_DAYS:
            last_day[r] = (day - PIN_DAYS) & 0xFFFF
    for i in range(rows.shape[0]):
        r = rows[i]
        out = row_score(show, click, r, nonclk, clk) < threshold
        if ttl >= 0 and step - last_step[r] > ttl:
            out = True
        if ttl_days >= 0 and _unseen(last_day, r, day) > ttl_days:
            out = True
        dead[i] = out
