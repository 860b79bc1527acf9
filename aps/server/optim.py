"""Server-side optimizer kernels and learning-rate schedules.

The pserver applies exactly the optimizer in the table's spec — there is no other code path, so
"SGD asked, Adam applied" cannot happen — and computes the learning rate from the spec's decay
schedule and the shard's own step counter, so a schedule can never apply on the trainer but not
on the server.

Kernels are numba-compiled (``cache=True``) loops over raw arrays: no Python per row. Sparse
kernels first group a push by row id (contiguous segments of ascending ids: as pushed when the
ids arrive sorted, which the server edge detects in its one pass, else after a stable sort), sum each row's
gradients in float64 and apply the optimizer once per distinct row, touching the optimizer state
of those rows only. Arithmetic is float64; storage is float32 (int64 for Adam's per-row step).

Adam follows Paddle's form::

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps * sqrt(1 - b2^t))

with ``t = step + 1`` for a dense block, ``step`` being that block's count of completed
applications. Sparse tables update only the pushed rows (lazy Adam); with
``bias_correction="row"`` each row has its own ``t`` (only touched rows advance), with ``"step"``
every row takes ``t = step + 1`` of the shard and epsilon is added to the raw ``sqrt(v)``, which
is PyTorch's ``SparseAdam`` exactly.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..specs import SGD, Adagrad, Adam, Optimizer

# ---------------------------------------------------------------- schedule and state layout


def learning_rate(opt: Optimizer, step: int) -> float:
    """The learning rate for the application that follows ``step`` completed ones."""
    if opt.decay is None:
        return float(opt.lr)
    return float(opt.lr) * opt.decay.factor(step)


def state_names(opt: Optimizer) -> tuple[str, ...]:
    """Names of the optimizer-state arrays a table keeps next to its values (fixed order)."""
    if isinstance(opt, SGD):
        return ()
    if isinstance(opt, Adagrad):
        return ("acc",)
    if isinstance(opt, Adam):
        return ("m", "v")
    raise TypeError(f"unknown optimizer {opt!r}")


def row_steps(opt: Optimizer) -> bool:
    """Whether a sparse table keeps an int64 step count per row (Adam with per-row correction)."""
    return isinstance(opt, Adam) and opt.bias_correction == "row"


def new_sparse_state(opt: Optimizer, rows: int, dim: int) -> dict[str, np.ndarray]:
    """Fresh optimizer state for ``rows`` x ``dim`` sparse rows (per-row Adam adds ``t``)."""
    state: dict[str, np.ndarray] = {}
    for name in state_names(opt):
        fill = opt.initial_accumulator if isinstance(opt, Adagrad) else 0.0
        state[name] = np.full((rows, dim), fill, dtype=np.float32)
    if row_steps(opt):
        state["t"] = np.zeros(rows, dtype=np.int64)
    return state


def new_dense_state(opt: Optimizer, size: int) -> dict[str, np.ndarray]:
    """Fresh optimizer state for one dense block of ``size`` elements (Adam's t is the block step)."""
    state: dict[str, np.ndarray] = {}
    for name in state_names(opt):
        fill = opt.initial_accumulator if isinstance(opt, Adagrad) else 0.0
        state[name] = np.full(size, fill, dtype=np.float32)
    return state


# ---------------------------------------------------------------- sparse kernels


@njit(cache=True, nogil=True)
def scan_ids(ids: np.ndarray, rows: int, num_shards: int, shard: int, local: np.ndarray) -> tuple[int, int]:
    """The one pass a request's ids get at the server edge (pulls and pushes): validate them,
    find their order and map them to local rows.

    Returns ``(bad, order)``: ``bad`` is the index of the first id outside ``[0, rows)`` or not
    owned by ``shard`` (-1: none); ``order`` is 2 when the ids are strictly ascending (unique and
    sorted, what a trainer's accumulator sends), 1 when ascending with repeats, 0 otherwise.
    With ``num_shards > 1`` the local rows ``id // num_shards`` are written to ``local`` (the
    caller keeps ``ids`` themselves when there is one shard). Folding the order check into this
    pass is what lets the optimizer kernels skip theirs (``ordered=True``)."""
    n = ids.shape[0]
    order = 2
    prev = -1
    for j in range(n):
        r = ids[j]
        if r < 0 or r >= rows or r % num_shards != shard:
            return j, 0
        if r < prev:
            order = 0
        elif r == prev and order == 2:
            order = 1
        prev = r
        if num_shards > 1:
            local[j] = r // num_shards
    return -1, order


@njit(cache=True, nogil=True)
def _push_order(ids: np.ndarray) -> np.ndarray:
    """Positions of ``ids`` in ascending id order, equal ids in push order; empty when the ids
    are ascending already (one pass, no sort and no index array)."""
    for j in range(1, ids.shape[0]):
        if ids[j] < ids[j - 1]:
            return np.argsort(ids, kind="mergesort")
    return np.empty(0, np.int64)  # ascending already: row j of id order is row j


@njit(cache=True, nogil=True)
def _at(order: np.ndarray, j: int) -> int:
    """Where the ``j``-th row in id order is: ``order[j]``, or ``j`` for an empty order."""
    return j if order.shape[0] == 0 else order[j]


@njit(cache=True, nogil=True)
def _segment_sum(ids: np.ndarray, order: np.ndarray, start: int, grads: np.ndarray, acc: np.ndarray) -> int:
    """Sum into ``acc`` the grads of the run of equal ids beginning at position ``start`` in id
    order (see :func:`_at`).

    Returns the position one past the run. Summation follows push order (the sort is stable), so
    the result does not depend on how the ids were split across shards.
    """
    n = ids.shape[0]
    row = ids[_at(order, start)]
    acc[:] = 0.0
    j = start
    while j < n and ids[_at(order, j)] == row:
        src = _at(order, j)
        for c in range(acc.shape[0]):
            acc[c] += grads[src, c]
        j += 1
    return j


@njit(cache=True, nogil=True)
def _sgd_rows(values, ids, grads, scale, lr, ordered):
    order = np.empty(0, np.int64) if ordered else _push_order(ids)
    g = np.empty(values.shape[1], np.float64)
    i = 0
    while i < ids.shape[0]:
        row = ids[_at(order, i)]
        i = _segment_sum(ids, order, i, grads, g)
        for c in range(g.shape[0]):
            values[row, c] = values[row, c] - lr * (g[c] * scale)


@njit(cache=True, nogil=True)
def _adagrad_rows(values, accum, ids, grads, scale, lr, eps, ordered):
    order = np.empty(0, np.int64) if ordered else _push_order(ids)
    g = np.empty(values.shape[1], np.float64)
    i = 0
    while i < ids.shape[0]:
        row = ids[_at(order, i)]
        i = _segment_sum(ids, order, i, grads, g)
        for c in range(g.shape[0]):
            gc = g[c] * scale
            a = np.float64(accum[row, c]) + gc * gc
            accum[row, c] = a
            values[row, c] = values[row, c] - lr * gc / (np.sqrt(a) + eps)


@njit(cache=True, nogil=True)
def _adam_rows(values, m, v, t, ids, grads, scale, lr, beta1, beta2, eps, table_t, ordered):
    """Lazy Adam on the pushed rows: with per-row counts ``t`` (an empty ``t``: every row takes
    the shard's ``table_t`` and eps goes on the raw ``sqrt(v)``, as PyTorch's SparseAdam)."""
    order = np.empty(0, np.int64) if ordered else _push_order(ids)
    g = np.empty(values.shape[1], np.float64)
    per_row = t.shape[0] > 0
    lr_t = lr * np.sqrt(1.0 - beta2**table_t) / (1.0 - beta1**table_t)
    eps_t = eps
    i = 0
    while i < ids.shape[0]:
        row = ids[_at(order, i)]
        i = _segment_sum(ids, order, i, grads, g)
        if per_row:
            t[row] += 1
            corr2 = np.sqrt(1.0 - beta2 ** t[row])
            lr_t = lr * corr2 / (1.0 - beta1 ** t[row])
            eps_t = eps * corr2
        for c in range(g.shape[0]):
            gc = g[c] * scale
            mc = beta1 * m[row, c] + (1.0 - beta1) * gc
            vc = beta2 * v[row, c] + (1.0 - beta2) * gc * gc
            m[row, c] = mc
            v[row, c] = vc
            values[row, c] = values[row, c] - lr_t * mc / (np.sqrt(vc) + eps_t)


@njit(cache=True, nogil=True)
def _add_rows(values, ids, deltas, ordered):
    order = np.empty(0, np.int64) if ordered else _push_order(ids)
    d = np.empty(values.shape[1], np.float64)
    i = 0
    while i < ids.shape[0]:
        row = ids[_at(order, i)]
        i = _segment_sum(ids, order, i, deltas, d)
        for c in range(d.shape[0]):
            values[row, c] = values[row, c] + d[c]


_NO_ROW_STEPS = np.empty(0, np.int64)  # read-only by use: the kernel writes t only when it has rows


def apply_sparse(
    opt: Optimizer,
    values: np.ndarray,
    state: dict[str, np.ndarray],
    local_ids: np.ndarray,
    grads: np.ndarray,
    scale: float,
    step: int,
    ordered: bool = False,
) -> None:
    """One optimizer application on the rows ``local_ids`` (duplicates summed first).

    Arrays must already be validated: values float32[rows, dim], ids int64[n] in range,
    grads float32[n, dim]. ``step`` is the shard's count of completed applications (for decay).
    ``ordered``: the caller knows the ids are ascending (:func:`scan_ids` said so), so the
    kernel neither checks nor sorts them; otherwise it checks in one pass and sorts if needed.
    """
    lr = learning_rate(opt, step)
    if isinstance(opt, SGD):
        _sgd_rows(values, local_ids, grads, float(scale), lr, ordered)
    elif isinstance(opt, Adagrad):
        _adagrad_rows(values, state["acc"], local_ids, grads, float(scale), lr, float(opt.epsilon), ordered)
    elif isinstance(opt, Adam):
        _adam_rows(
            values, state["m"], state["v"], state.get("t", _NO_ROW_STEPS), local_ids, grads, float(scale), lr,
            float(opt.beta1), float(opt.beta2), float(opt.epsilon), step + 1, ordered,
        )
    else:
        raise TypeError(f"unknown optimizer {opt!r}")


def add_rows(values: np.ndarray, local_ids: np.ndarray, deltas: np.ndarray, ordered: bool = False) -> None:
    """``values[id] += delta`` for every pushed row, duplicates summed (GEO's server side);
    ``ordered`` as for :func:`apply_sparse`."""
    _add_rows(values, local_ids, deltas, ordered)


# ---------------------------------------------------------------- dense kernels


@njit(cache=True, nogil=True)
def _sgd_flat(p, g, scale, lr):
    for i in range(p.shape[0]):
        p[i] = p[i] - lr * (np.float64(g[i]) * scale)


@njit(cache=True, nogil=True)
def _adagrad_flat(p, accum, g, scale, lr, eps):
    for i in range(p.shape[0]):
        gi = np.float64(g[i]) * scale
        a = np.float64(accum[i]) + gi * gi
        accum[i] = a
        p[i] = p[i] - lr * gi / (np.sqrt(a) + eps)


@njit(cache=True, nogil=True)
def _adam_flat(p, m, v, g, scale, lr_t, beta1, beta2, eps_t):
    for i in range(p.shape[0]):
        gi = np.float64(g[i]) * scale
        mi = beta1 * m[i] + (1.0 - beta1) * gi
        vi = beta2 * v[i] + (1.0 - beta2) * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = p[i] - lr_t * mi / (np.sqrt(vi) + eps_t)


@njit(cache=True, nogil=True)
def _add_flat(p, d):
    for i in range(p.shape[0]):
        p[i] = p[i] + d[i]


def apply_dense(
    opt: Optimizer,
    values: np.ndarray,
    state: dict[str, np.ndarray],
    offset: int,
    grads: np.ndarray,
    scale: float,
    step: int,
) -> None:
    """One optimizer application on ``values[offset:offset + len(grads)]`` of a dense block.

    ``step`` is the block's count of completed applications: it sets the decayed lr and Adam's
    ``t = step + 1``. Chunks of one logical push share the same ``step``.
    """
    lo, hi = offset, offset + grads.shape[0]
    p = values[lo:hi]
    lr = learning_rate(opt, step)
    if isinstance(opt, SGD):
        _sgd_flat(p, grads, float(scale), lr)
    elif isinstance(opt, Adagrad):
        _adagrad_flat(p, state["acc"][lo:hi], grads, float(scale), lr, float(opt.epsilon))
    elif isinstance(opt, Adam):
        t = step + 1
        corr2 = math.sqrt(1.0 - opt.beta2**t)
        lr_t = lr * corr2 / (1.0 - opt.beta1**t)
        _adam_flat(
            p, state["m"][lo:hi], state["v"][lo:hi], grads, float(scale), lr_t,
            float(opt.beta1), float(opt.beta2), float(opt.epsilon) * corr2,
        )
    else:
        raise TypeError(f"unknown optimizer {opt!r}")


def add_dense(values: np.ndarray, offset: int, deltas: np.ndarray) -> None:
    """``values[offset:offset + n] += deltas`` (GEO's server side for dense tables)."""
    _add_flat(values[offset : offset + deltas.shape[0]], deltas)
