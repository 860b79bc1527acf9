"""Server-side optimizer kernels and learning-rate schedules.

The pserver applies exactly the optimizer in the table's spec — there is no other code path, so
"SGD asked, Adam applied" cannot happen — and computes the learning rate from the spec's decay
schedule and the shard's own step counter, so a schedule can never apply on the trainer but not
on the server.

Kernels are numba-compiled (``cache=True``) loops over raw arrays: no Python per row. Sparse
kernels first group a push by row id (contiguous segments of ascending ids: as pushed when the
ids arrive sorted, which the server edge detects in its one pass, else after a stable sort), sum each row's
gradients in float64 and apply the optimizer once per distinct row, touching the optimizer state
of those rows only. Arithmetic is float64 (dense Adam's float32, as PyTorch's: :func:`_adam_flat`);
storage is float32 (int64 for Adam's per-row step).

Adam follows Paddle's form::

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps * sqrt(1 - b2^t))

with ``t = step + 1`` for a dense block, ``step`` being that block's count of completed
applications. Sparse tables update only the pushed rows (lazy Adam); with
``bias_correction="row"`` each row has its own ``t`` (only touched rows advance), with ``"step"``
every row takes ``t = step + 1`` of the shard and epsilon is added to the raw ``sqrt(v)``, which
is PyTorch's ``SparseAdam`` exactly.

Before any of them, each distinct row's summed gradient is scaled, clipped to ``clip_norm`` (the
row's norm) and given ``l2 * w`` (L2 decay, on the pushed rows only): :func:`_shape_row`. Dense
blocks take ``l2 * w`` on every element. FTRL-Proximal keeps ``z`` and ``n`` per coordinate and
puts its l2 in the closed form (:func:`_ftrl_coord`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..sharding import row_local, row_owner
from ..specs import SGD, Adagrad, Adam, Ftrl, Optimizer
from .prefetch import LINE, prefetch

#: how many positions (in id order) ahead a sparse kernel asks for a row's lines: a table far
#: larger than the caches costs a miss to memory per row, and a loop that touches row i only
#: when it reaches it waits for those misses one after another (aps/storage/prefetch.py)
_ROWS_AHEAD = 8

# ---------------------------------------------------------------- schedule and state layout


def learning_rate(opt: Optimizer, step: int) -> float:
    """The learning rate for the application that follows ``step`` completed ones (FTRL's alpha:
    its schedule is per coordinate)."""
    if isinstance(opt, Ftrl):
        return float(opt.alpha)
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
    if isinstance(opt, Ftrl):
        return ("z", "n")
    raise TypeError(f"unknown optimizer {opt!r}")


def row_steps(opt: Optimizer) -> bool:
    """Whether a sparse table keeps an int64 step count per row (Adam with per-row correction)."""
    return isinstance(opt, Adam) and opt.bias_correction == "row"


def state_columns(opt: Optimizer, dim: int) -> int:
    """Columns of a sparse row's optimizer-state arrays: one a coordinate (``dim``), or one for
    the whole row with row-wise Adagrad."""
    return 1 if isinstance(opt, Adagrad) and opt.rowwise else dim


def new_sparse_state(opt: Optimizer, rows: int, dim: int) -> dict[str, np.ndarray]:
    """Fresh optimizer state for ``rows`` sparse rows of ``dim`` (per-row Adam adds ``t``)."""
    state: dict[str, np.ndarray] = {}
    columns = state_columns(opt, dim)
    for name in state_names(opt):
        fill = opt.initial_accumulator if isinstance(opt, Adagrad) else 0.0
        state[name] = np.full((rows, columns), fill, dtype=np.float32)
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
    With ``num_shards > 1`` the local rows are written to ``local`` (the caller keeps ``ids``
    themselves when there is one shard). Ownership and local rows are the fixed tables' rule
    (aps/sharding.py, compiled in). Folding the order check into this pass is what lets the
    optimizer kernels skip theirs (``ordered=True``)."""
    n = ids.shape[0]
    order = 2
    prev = -1
    for j in range(n):
        r = ids[j]
        if r < 0 or r >= rows or row_owner(r, num_shards) != shard:
            return j, 0
        if r < prev:
            order = 0
        elif r == prev and order == 2:
            order = 1
        prev = r
        if num_shards > 1:
            local[j] = row_local(r, num_shards)
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
def _shape_row(g: np.ndarray, scale: float, clip: float, l2: float, values: np.ndarray, row: int) -> None:
    """``g = clip(g * scale) + l2 * values[row]`` in place: the gradient a row's update uses.

    ``clip`` > 0 scales the row's gradient to norm ``clip`` when it is longer (0: no clipping);
    the decay term is added after, unclipped, as the reference adds its regulariser to the
    clipped gradient."""
    f = scale
    if clip > 0.0:
        sq = 0.0
        for c in range(g.shape[0]):
            sq += g[c] * g[c]
        norm = np.sqrt(sq) * abs(scale)
        if norm > clip:
            f = scale * (clip / norm)
    for c in range(g.shape[0]):
        g[c] = g[c] * f
    if l2 != 0.0:
        for c in range(g.shape[0]):
            g[c] += l2 * values[row, c]


@njit(cache=True, nogil=True)
def _scratch(values: np.ndarray, ids: np.ndarray, ordered: bool) -> tuple[np.ndarray, np.ndarray]:
    """What a sparse kernel walks a push with: the push's id order (see :func:`_push_order`;
    empty when ``ordered`` or ascending) and a float64 row for each distinct row's gradient."""
    order = np.empty(0, np.int64) if ordered else _push_order(ids)
    return order, np.empty(values.shape[1], np.float64)


@njit(cache=True, nogil=True)
def _row_ahead(ids, order, start):
    """The row :data:`_ROWS_AHEAD` positions past ``start`` in id order, or -1 past the end."""
    j = start + _ROWS_AHEAD
    return ids[_at(order, j)] if j < ids.shape[0] else -1


@njit(cache=True, nogil=True)
def _ask(arr, row):
    """Ask for the lines of ``arr``'s row ``row`` (nothing for -1; a hint: a repeated id only
    makes it ask for a row already asked for)."""
    if row >= 0:
        for b in range(0, arr.strides[0], LINE):
            prefetch(arr, row, b)


@njit(cache=True, nogil=True)
def _next_row(ids, order, start, grads, g, scale, clip, l2, values):
    """The row of the run of equal ids at ``start`` and the position after it, with the run's
    gradient summed into ``g`` and shaped (:func:`_segment_sum`, :func:`_shape_row`); the values
    row some positions ahead is asked for, and that row is returned third (:func:`_row_ahead`) for
    the kernel to ask for its optimizer state's."""
    ahead = _row_ahead(ids, order, start)
    _ask(values, ahead)
    row = ids[_at(order, start)]
    end = _segment_sum(ids, order, start, grads, g)
    _shape_row(g, scale, clip, l2, values, row)
    return row, end, ahead


@njit(cache=True, nogil=True)
def _ftrl_coord(w: float, z: float, n: float, g: float, alpha: float, beta: float, l1: float, l2: float) -> tuple[float, float, float]:
    """One FTRL-Proximal step of one coordinate: the new ``(w, z, n)``."""
    n_new = n + g * g
    z = z + g - (np.sqrt(n_new) - np.sqrt(n)) / alpha * w
    if abs(z) <= l1:
        return 0.0, z, n_new
    return -(z - np.sign(z) * l1) / ((beta + np.sqrt(n_new)) / alpha + l2), z, n_new


@njit(cache=True, nogil=True)
def _sgd_rows(values, ids, grads, scale, clip, l2, lr, ordered):
    order, g = _scratch(values, ids, ordered)
    i = 0
    while i < ids.shape[0]:
        row, i, _ = _next_row(ids, order, i, grads, g, scale, clip, l2, values)
        for c in range(g.shape[0]):
            values[row, c] = values[row, c] - lr * g[c]


@njit(cache=True, nogil=True)
def _adagrad_rows(values, accum, ids, grads, scale, clip, l2, lr, eps, ordered):
    order, g = _scratch(values, ids, ordered)
    i = 0
    while i < ids.shape[0]:
        row, i, ahead = _next_row(ids, order, i, grads, g, scale, clip, l2, values)
        _ask(accum, ahead)
        for c in range(g.shape[0]):
            gc = g[c]
            a = np.float64(accum[row, c]) + gc * gc
            accum[row, c] = a
            values[row, c] = values[row, c] - lr * gc / (np.sqrt(a) + eps)


@njit(cache=True, nogil=True)
def _adagrad_rowwise_rows(values, accum, ids, grads, scale, clip, l2, lr, eps, ordered):
    """Row-wise Adagrad: one accumulator a row (``accum`` is rows x 1) takes the mean of the row's
    squared gradient, and every coordinate of the row steps by ``lr / (sqrt(acc) + eps)``."""
    order, g = _scratch(values, ids, ordered)
    dim = g.shape[0]
    i = 0
    while i < ids.shape[0]:
        row, i, ahead = _next_row(ids, order, i, grads, g, scale, clip, l2, values)
        _ask(accum, ahead)
        sq = 0.0
        for c in range(dim):
            sq += g[c] * g[c]
        a = np.float64(accum[row, 0]) + sq / dim
        accum[row, 0] = a
        step = lr / (np.sqrt(a) + eps)
        for c in range(dim):
            values[row, c] = values[row, c] - step * g[c]


@njit(cache=True, nogil=True)
def _adam_rows(values, m, v, t, ids, grads, scale, clip, l2, lr, beta1, beta2, eps, table_t, ordered):
    """Lazy Adam on the pushed rows: with per-row counts ``t`` (an empty ``t``: every row takes
    the shard's ``table_t`` and eps goes on the raw ``sqrt(v)``, as PyTorch's SparseAdam)."""
    order, g = _scratch(values, ids, ordered)
    per_row = t.shape[0] > 0
    lr_t = lr * np.sqrt(1.0 - beta2**table_t) / (1.0 - beta1**table_t)
    eps_t = eps
    i = 0
    while i < ids.shape[0]:
        row, i, ahead = _next_row(ids, order, i, grads, g, scale, clip, l2, values)
        _ask(m, ahead)
        _ask(v, ahead)
        if per_row:
            _ask(t, ahead)
            t[row] += 1
            corr2 = np.sqrt(1.0 - beta2 ** t[row])
            lr_t = lr * corr2 / (1.0 - beta1 ** t[row])
            eps_t = eps * corr2
        for c in range(g.shape[0]):
            gc = g[c]
            mc = beta1 * m[row, c] + (1.0 - beta1) * gc
            vc = beta2 * v[row, c] + (1.0 - beta2) * gc * gc
            m[row, c] = mc
            v[row, c] = vc
            values[row, c] = values[row, c] - lr_t * mc / (np.sqrt(vc) + eps_t)


@njit(cache=True, nogil=True)
def _ftrl_rows(values, z, n, ids, grads, scale, clip, alpha, beta, l1, l2, ordered):
    """FTRL-Proximal on the pushed rows (the clip applies to the gradient, l2 in the closed form)."""
    order, g = _scratch(values, ids, ordered)
    i = 0
    while i < ids.shape[0]:
        row, i, ahead = _next_row(ids, order, i, grads, g, scale, clip, 0.0, values)
        _ask(z, ahead)
        _ask(n, ahead)
        for c in range(g.shape[0]):
            w, zc, nc = _ftrl_coord(values[row, c], z[row, c], n[row, c], g[c], alpha, beta, l1, l2)
            values[row, c] = w
            z[row, c] = zc
            n[row, c] = nc


@njit(cache=True, nogil=True)
def _add_rows(values, ids, deltas, ordered):
    order, d = _scratch(values, ids, ordered)
    i = 0
    while i < ids.shape[0]:
        row, i, _ = _next_row(ids, order, i, deltas, d, 1.0, 0.0, 0.0, values)
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
    grads float32[n, dim]. Each row's gradient is ``clip(sum * scale) + l2 * w`` (FTRL: l2 in
    its closed form) with the spec's ``clip_norm`` and ``l2``. ``step`` is the shard's count of completed applications (for decay).
    ``ordered``: the caller knows that equal ids sit next to each other (ascending ids, as
    :func:`scan_ids` finds them, or distinct ones, as a hash table's rows of unique keys), so the
    kernel neither checks nor sorts them; otherwise it checks in one pass and sorts if needed.
    """
    lr = learning_rate(opt, step)
    scale, clip, l2 = float(scale), float(opt.clip_norm or 0.0), float(opt.l2)
    if isinstance(opt, SGD):
        _sgd_rows(values, local_ids, grads, scale, clip, l2, lr, ordered)
    elif isinstance(opt, Adagrad):
        rows = _adagrad_rowwise_rows if opt.rowwise else _adagrad_rows
        rows(values, state["acc"], local_ids, grads, scale, clip, l2, lr, float(opt.epsilon), ordered)
    elif isinstance(opt, Adam):
        _adam_rows(
            values, state["m"], state["v"], state.get("t", _NO_ROW_STEPS), local_ids, grads, scale, clip, l2, lr,
            float(opt.beta1), float(opt.beta2), float(opt.epsilon), step + 1, ordered,
        )
    elif isinstance(opt, Ftrl):
        _ftrl_rows(values, state["z"], state["n"], local_ids, grads, scale, clip, lr, float(opt.beta), float(opt.l1), l2, ordered)
    else:
        raise TypeError(f"unknown optimizer {opt!r}")


def add_rows(values: np.ndarray, local_ids: np.ndarray, deltas: np.ndarray, ordered: bool = False) -> None:
    """``values[id] += delta`` for every pushed row, duplicates summed (GEO's server side);
    ``ordered`` as for :func:`apply_sparse`."""
    _add_rows(values, local_ids, deltas, ordered)


# ---------------------------------------------------------------- dense kernels


@njit(cache=True, nogil=True)
def _sgd_flat(p, g, scale, l2, lr):
    for i in range(p.shape[0]):
        p[i] = p[i] - lr * (np.float64(g[i]) * scale + l2 * p[i])


@njit(cache=True, nogil=True)
def _adagrad_flat(p, accum, g, scale, l2, lr, eps):
    for i in range(p.shape[0]):
        gi = np.float64(g[i]) * scale + l2 * p[i]
        a = np.float64(accum[i]) + gi * gi
        accum[i] = a
        p[i] = p[i] - lr * gi / (np.sqrt(a) + eps)


@njit(cache=True, nogil=True)
def _adam_flat(p, m, v, g, scale, l2, lr_t, beta1, beta2, eps_t):
    """Dense Adam in float32 arithmetic, as PyTorch's Adam computes it: the loop is bound by
    memory and float64 took 1.7x its time (a 410k-float block: 2.4-2.9 ms against 1.3-1.6, every
    hybrid and sync round waiting for it)."""
    f = np.float32
    s, dl2, lr, b1, b2, e = f(scale), f(l2), f(lr_t), f(beta1), f(beta2), f(eps_t)
    c1, c2 = f(1.0 - beta1), f(1.0 - beta2)
    for i in range(p.shape[0]):
        gi = g[i] * s + dl2 * p[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = p[i] - lr * mi / (np.sqrt(vi) + e)


@njit(cache=True, nogil=True)
def _ftrl_flat(p, z, n, g, scale, alpha, beta, l1, l2):
    for i in range(p.shape[0]):
        p[i], z[i], n[i] = _ftrl_coord(p[i], z[i], n[i], np.float64(g[i]) * scale, alpha, beta, l1, l2)


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
    ``t = step + 1``. Every element's gradient takes ``l2 * w`` (a dense table refuses
    ``clip_norm``: no pserver sees its whole gradient). Chunks of one logical push share the same ``step``.
    """
    lo, hi = offset, offset + grads.shape[0]
    p = values[lo:hi]
    lr = learning_rate(opt, step)
    scale, l2 = float(scale), float(opt.l2)
    if isinstance(opt, SGD):
        _sgd_flat(p, grads, scale, l2, lr)
    elif isinstance(opt, Adagrad):
        _adagrad_flat(p, state["acc"][lo:hi], grads, scale, l2, lr, float(opt.epsilon))
    elif isinstance(opt, Adam):
        t = step + 1
        corr2 = math.sqrt(1.0 - opt.beta2**t)
        lr_t = lr * corr2 / (1.0 - opt.beta1**t)
        _adam_flat(
            p, state["m"][lo:hi], state["v"][lo:hi], grads, scale, l2, lr_t,
            float(opt.beta1), float(opt.beta2), float(opt.epsilon) * corr2,
        )
    elif isinstance(opt, Ftrl):
        _ftrl_flat(p, state["z"][lo:hi], state["n"][lo:hi], grads, scale, lr, float(opt.beta), float(opt.l1), l2)
    else:
        raise TypeError(f"unknown optimizer {opt!r}")


def add_dense(values: np.ndarray, offset: int, deltas: np.ndarray) -> None:
    """``values[offset:offset + n] += deltas`` (GEO's server side for dense tables)."""
    _add_flat(values[offset : offset + deltas.shape[0]], deltas)
