"""Numba kernels the runtime itself needs: merging sparse gradients by id, local SGD for geo,
and row bookkeeping. Models bring their own kernels."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _merge_sorted(ids: np.ndarray, rows: np.ndarray, order: np.ndarray, out_ids: np.ndarray, out_rows: np.ndarray) -> int:
    n = ids.shape[0]
    dim = rows.shape[1]
    k = -1
    last = -1
    for j in range(n):
        i = order[j]
        if k < 0 or ids[i] != last:
            k += 1
            last = ids[i]
            out_ids[k] = last
            for d in range(dim):
                out_rows[k, d] = rows[i, d]
        else:
            for d in range(dim):
                out_rows[k, d] += rows[i, d]
    return k + 1


def merge_rows(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum rows that share an id. Returns (unique ids ascending, summed rows)."""
    if len(ids) == 0:
        return ids.astype(np.int64), rows.reshape(0, rows.shape[1] if rows.ndim == 2 else 0).astype(np.float32)
    order = np.argsort(ids, kind="stable")
    out_ids = np.empty(len(ids), dtype=np.int64)
    out_rows = np.empty((len(ids), rows.shape[1]), dtype=np.float32)
    k = _merge_sorted(ids, rows, order, out_ids, out_rows)
    return out_ids[:k], out_rows[:k]


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
