"""Numba kernels the runtime itself needs: merging sparse gradients by id as they arrive, local
SGD for geo, and row bookkeeping. Models bring their own kernels."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def accumulate_rows(
    slot_of: np.ndarray, acc_ids: np.ndarray, acc_rows: np.ndarray, used: int, ids: np.ndarray, rows: np.ndarray
) -> int:
    """Merge ``rows`` (one per entry of ``ids``) into the accumulator: a row whose id already
    has a slot (``slot_of[id] >= 0``) is added to it, a new id takes the next free slot.

    Returns the slots in use afterwards, or ``-1 - j`` if ``ids[j]`` is not a row of the table
    (the accumulator is then partly updated and must be discarded). The caller makes sure the
    new ids fit (:func:`count_new`)."""
    dim = acc_rows.shape[1]
    limit = slot_of.shape[0]
    for j in range(ids.shape[0]):
        r = ids[j]
        if r < 0 or r >= limit:
            return -1 - j
        s = slot_of[r]
        if s < 0:
            s = used
            used += 1
            slot_of[r] = s
            acc_ids[s] = r
            for d in range(dim):
                acc_rows[s, d] = rows[j, d]
        else:
            for d in range(dim):
                acc_rows[s, d] += rows[j, d]
    return used


@njit(cache=True, nogil=True)
def count_new(slot_of: np.ndarray, ids: np.ndarray) -> int:
    """How many slots merging ``ids`` would take: distinct ids without a slot yet (ids out of
    the table count once each, so that :func:`accumulate_rows` is the one to report them)."""
    limit = slot_of.shape[0]
    new = 0
    for j in range(ids.shape[0]):
        r = ids[j]
        if r < 0 or r >= limit:
            new += 1
        elif slot_of[r] == -1:
            slot_of[r] = -2  # seen in this batch: counted once
            new += 1
    for j in range(ids.shape[0]):
        r = ids[j]
        if 0 <= r < limit and slot_of[r] == -2:
            slot_of[r] = -1
    return new


@njit(cache=True, nogil=True)
def release_slots(slot_of: np.ndarray, acc_ids: np.ndarray, used: int) -> None:
    """Forget the ids of the first ``used`` slots, so the accumulator is empty again in
    O(slots used), not O(table rows)."""
    for s in range(used):
        slot_of[acc_ids[s]] = -1


@njit(cache=True, nogil=True)
def sgd_rows(params: np.ndarray, ids: np.ndarray, grads: np.ndarray, lr: float, dirty: np.ndarray) -> None:
    """params[ids] -= lr * grads, then mark the rows dirty (after writing: see geo recv race)."""
    dim = params.shape[1]
    for j in range(ids.shape[0]):
        r = ids[j]
        for d in range(dim):
            params[r, d] -= lr * grads[j, d]
    for j in range(ids.shape[0]):
        dirty[ids[j]] = 1


@njit(cache=True, nogil=True)
def add_changes(
    params: np.ndarray, rows: np.ndarray, after: np.ndarray, before: np.ndarray, marks: np.ndarray, dirty: np.ndarray
) -> None:
    """params[rows[j]] += after[j] - before[j] for the marked j, then mark those rows dirty (a
    step made on gathered rows, added back to rows others may write too)."""
    dim = params.shape[1]
    for j in range(rows.shape[0]):
        if marks[j]:
            r = rows[j]
            for d in range(dim):
                params[r, d] += after[j, d] - before[j, d]
    for j in range(rows.shape[0]):
        if marks[j]:
            dirty[rows[j]] = 1


@njit(cache=True, nogil=True)
def add_counts(counts: np.ndarray, rows: np.ndarray, stats: np.ndarray) -> None:
    """counts[rows[j]] += stats[j] (shows, clicks); ``stats`` empty: one show each."""
    for j in range(rows.shape[0]):
        r = rows[j]
        if stats.shape[0]:
            counts[r, 0] += stats[j, 0]
            counts[r, 1] += stats[j, 1]
        else:
            counts[r, 0] += 1.0


@njit(cache=True, nogil=True)
def gather_rows(params: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    for j in range(ids.shape[0]):
        out[j, :] = params[ids[j], :]


@njit(cache=True, nogil=True)
def scatter_rows(params: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
    for j in range(ids.shape[0]):
        params[ids[j], :] = rows[j, :]


@njit(cache=True, nogil=True)
def geo_delta(local: np.ndarray, old: np.ndarray, ids: np.ndarray, scale: float, out: np.ndarray) -> None:
    """out = (local[ids] - old[ids]) * scale; old[ids] += out  (GEO-SGD send side)."""
    dim = local.shape[1]
    for j in range(ids.shape[0]):
        r = ids[j]
        for d in range(dim):
            delta = (local[r, d] - old[r, d]) * scale
            out[j, d] = delta
            old[r, d] += delta


@njit(cache=True, nogil=True)
def geo_apply(local: np.ndarray, old: np.ndarray, ids: np.ndarray, server: np.ndarray) -> None:
    """local[ids] += server - old[ids]; old[ids] = server  (GEO-SGD recv side)."""
    dim = local.shape[1]
    for j in range(ids.shape[0]):
        r = ids[j]
        for d in range(dim):
            local[r, d] += server[j, d] - old[r, d]
            old[r, d] = server[j, d]
