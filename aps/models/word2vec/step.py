"""Numba kernels of one word2vec step: scores → sigmoid cross-entropy → gradients or in-place SGD.

This is the *step* half of the model (the batching half is :mod:`.batching`). Every term of the
loss is ``softplus(x) = log(1 + e^x)`` with ``x = -s`` for a positive score ``s`` and ``x = s`` for
a negative one, ``s = <emb[input], emb_w[output]> + emb_b[output]``; ``dloss/ds`` is
``sigmoid(s) - label``. One ``exp`` per term gives both; the monitoring loss takes the log of a
running product of the factors ``1 + e^x``, flushed every 12 factors (<= (1 + e^30)^12, far from
overflow), so it costs one ``log`` per dozen terms instead of one each. For ``|x| > 30`` the
float32 result is exact with ``softplus(x) = max(x, 0)``.

Two families, one per way of sharing negatives:

* **reference modes** (``negatives="batch"`` / ``"pair"``): pairs ``(centre, context)`` scored
  centre-input against context-output, the loss the *mean* over a batch of pairs, gradients
  computed on gathered copies of the batch's rows (:func:`batch_grad`) and applied by SGD
  (:func:`local_step`);
* **window mode** (``negatives="window"``, word2vec.c's direction, shared as in pWord2Vec): for
  one target token, its ``n <= 2 * window`` context words are the inputs and the target plus
  ``K`` negatives the outputs; the ``n x (1 + K)`` scores are one small dense product, and the
  loss is *summed* over pairs. :func:`window_sgd` updates the replica in place target by target
  (Hogwild, like word2vec.c's threads); :func:`window_grad` gives the gradient at the start of the
  batch for the modes that push gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ...storage.prefetch import LINE, prefetch
from ...trainer.kernels import sgd_rows

# fast-math without nnan/ninf: vectorised dot products, but exp overflow still behaves
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}

_FLUSH = 12  # factors 1 + e^x multiplied before one log


class Tables(NamedTuple):
    """The three parameter arrays (full tables, or a batch's gathered rows, or their gradients)."""

    emb: np.ndarray  # [rows, dim] input vectors
    emb_w: np.ndarray  # [rows, dim] output vectors
    emb_b: np.ndarray  # [rows, 1] output biases


class Marks(NamedTuple):
    """Geo's dirty marks (uint8 per row) of the three tables."""

    emb: np.ndarray
    emb_w: np.ndarray
    emb_b: np.ndarray


class Rates(NamedTuple):
    """SGD learning rates of the three tables for this step."""

    emb: float
    emb_w: float
    emb_b: float


@njit(cache=True, nogil=True, inline="always")
def _term(s: float, positive: bool) -> tuple[np.float32, float, float]:
    """``(dloss/ds, loss added now, factor 1 + e^x for the running product)`` of one score."""
    x = -np.float32(s) if positive else np.float32(s)
    sign = np.float32(-1.0) if positive else np.float32(1.0)
    if x > 30.0:
        return sign, np.float64(x), 1.0
    if x < -30.0:
        return np.float32(0.0), 0.0, 1.0
    z = np.exp(x)  # float32: expf
    return sign * z / (np.float32(1.0) + z), 0.0, 1.0 + np.float64(z)


@njit(cache=True, nogil=True, inline="always")
def _tally(loss: float, prod: float, pending: int, add: float, f: float, times: int) -> tuple[float, float, int]:
    """Add ``times`` equal terms (``add`` now, factor ``f`` into the running product) to the
    monitoring loss; at most 11 + 8 pending factors <= (1 + e^30)^19, far from overflow."""
    loss += times * add
    if times <= 8:
        for _ in range(times):
            prod *= f
        pending += times
    else:
        loss += times * np.log(f)
    if pending >= _FLUSH:
        loss += np.log(prod)
        prod = 1.0
        pending = 0
    return loss, prod, pending


# ---------------------------------------------------------------- reference modes


@njit(cache=True, nogil=True)
def gather(full: Tables, u_in: np.ndarray, u_out: np.ndarray, rows: Tables) -> None:
    """Copy the batch's rows into compact buffers: one short loop of independent row copies lets
    the CPU have many cache misses in flight, and the step then works on L1/L2-resident rows."""
    dim = full.emb.shape[1]
    for i in range(u_in.shape[0]):
        r = u_in[i]
        for d in range(dim):
            rows.emb[i, d] = full.emb[r, d]
    for j in range(u_out.shape[0]):
        r = u_out[j]
        for d in range(dim):
            rows.emb_w[j, d] = full.emb_w[r, d]
        rows.emb_b[j, 0] = full.emb_b[r, 0]


@njit(cache=True, nogil=True)
def _start(full: Tables, u_in: np.ndarray, u_out: np.ndarray, scratch: Tables, g: Tables) -> tuple[Tables, Tables]:
    """The batch's rows gathered into ``scratch`` and its zeroed gradient rows, both as views."""
    nc = u_in.shape[0]
    nw = u_out.shape[0]
    rows = Tables(scratch.emb[:nc], scratch.emb_w[:nw], scratch.emb_b[:nw])
    gather(full, u_in, u_out, rows)
    g_rows = Tables(g.emb[:nc], g.emb_w[:nw], g.emb_b[:nw])
    g_rows.emb[:] = 0.0
    g_rows.emb_w[:] = 0.0
    g_rows.emb_b[:] = 0.0
    return rows, g_rows


@njit(cache=True, nogil=True, fastmath=_FAST)
def pair_grad(rows: Tables, inv_c: np.ndarray, inv_t: np.ndarray, inv_n: np.ndarray, per_pair: bool,
              g: Tables) -> float:
    """Add the gradient of the batch-mean loss to ``g`` and return the *summed* loss over pairs.

    Pair ``p`` is ``(rows.emb[inv_c[p]], rows.emb_w[inv_t[p]])``; its ``K`` negatives are
    ``inv_n[p*K:(p+1)*K]`` (``per_pair``) or the batch's shared ``inv_n[:K]``. With shared
    negatives ``s_k`` depends only on the centre, so consecutive pairs with the same centre (a
    *run*) evaluate their negative terms once, weighted by the run length: the same sum, about
    3x fewer dot products. Per pair, every pair is a run of one with its own negatives.
    """
    e, w, b = rows.emb, rows.emb_w, rows.emb_b
    n = inv_c.shape[0]
    dim = e.shape[1]
    k_neg = inv_n.shape[0] // n if per_pair else inv_n.shape[0]
    scale = 1.0 / n if n > 0 else 0.0
    loss = 0.0
    prod = 1.0
    pending = 0
    run = 0
    for p in range(n):
        ic = inv_c[p]
        it = inv_t[p]
        s = b[it, 0]
        for d in range(dim):
            s += e[ic, d] * w[it, d]
        ds, add, f = _term(s, True)
        loss, prod, pending = _tally(loss, prod, pending, add, f, 1)
        gs = np.float32(ds * scale)
        g.emb_b[it, 0] += gs
        for d in range(dim):
            g.emb_w[it, d] += gs * e[ic, d]
            g.emb[ic, d] += gs * w[it, d]
        run += 1
        if not per_pair and p + 1 < n and inv_c[p + 1] == ic:
            continue
        base = p * k_neg if per_pair else 0
        for k in range(k_neg):
            ik = inv_n[base + k]
            s = b[ik, 0]
            for d in range(dim):
                s += e[ic, d] * w[ik, d]
            ds, add, f = _term(s, False)
            loss, prod, pending = _tally(loss, prod, pending, add, f, run)
            gs = np.float32(run * ds * scale)
            g.emb_b[ik, 0] += gs
            for d in range(dim):
                g.emb_w[ik, d] += gs * e[ic, d]
                g.emb[ic, d] += gs * w[ik, d]
        run = 0
    return loss + np.log(prod)


@njit(cache=True, nogil=True)
def batch_grad(full: Tables, u_in: np.ndarray, u_out: np.ndarray, inv_c: np.ndarray, inv_t: np.ndarray,
               inv_n: np.ndarray, per_pair: bool, scratch: Tables, g: Tables, scale: float = 1.0) -> float:
    """Gather the batch's rows into ``scratch``, zero ``g`` and fill it with ``scale`` times the
    gradient of the batch-mean loss (rows in ``u_in`` / ``u_out`` order); return the summed loss.
    ``scale`` is the linear schedule's factor in the modes that push gradients: the pservers'
    SGD then steps by exactly the decayed rate."""
    rows, g_rows = _start(full, u_in, u_out, scratch, g)
    loss = pair_grad(rows, inv_c, inv_t, inv_n, per_pair, g_rows)
    if scale != 1.0:
        f = np.float32(scale)
        g_rows.emb[:] *= f
        g_rows.emb_w[:] *= f
        g_rows.emb_b[:] *= f
    return loss


@njit(cache=True, nogil=True)
def local_step(full: Tables, u_in: np.ndarray, u_out: np.ndarray, inv_c: np.ndarray, inv_t: np.ndarray,
               inv_n: np.ndarray, per_pair: bool, lr: Rates, scratch: Tables, g: Tables, dirty: Marks) -> float:
    """One fused geo step: :func:`batch_grad` into per-worker scratch, then SGD on the shared
    rows and their dirty marks; returns the summed loss."""
    loss = batch_grad(full, u_in, u_out, inv_c, inv_t, inv_n, per_pair, scratch, g)
    sgd_rows(full.emb, u_in, g.emb[: u_in.shape[0]], lr.emb, dirty.emb)
    sgd_rows(full.emb_w, u_out, g.emb_w[: u_out.shape[0]], lr.emb_w, dirty.emb_w)
    sgd_rows(full.emb_b, u_out, g.emb_b[: u_out.shape[0]], lr.emb_b, dirty.emb_b)
    return loss


# ---------------------------------------------------------------- window mode


@njit(cache=True, nogil=True, inline="always")
def _prefetch_row(table: np.ndarray, row: int, row_bytes: int) -> None:
    for offset in range(0, row_bytes, LINE):
        prefetch(table, row, offset)


class WindowScratch(NamedTuple):
    """Per-process buffers of one target (window mode)."""

    outs: np.ndarray  # int64 [1 + K]: the target's output rows (positive first)
    w: np.ndarray  # float32 [1 + K, dim]: a copy of those rows, read by every context
    b: np.ndarray  # float32 [1 + K]: their biases
    d_out: np.ndarray  # float32 [1 + K, dim]: their updates, summed over the contexts
    d_in: np.ndarray  # float32 [2 * window, dim]: each context row's update
    g: np.ndarray  # float32 [1 + K]: one context's dloss/ds against each output
    g_sum: np.ndarray  # float32 [1 + K]: those summed over the contexts (the biases' gradients)


@njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
def _window_target(src: Tables, ctx: np.ndarray, ctx_off: np.ndarray, pos: np.ndarray, neg: np.ndarray, t: int,
                   dst: Tables, scale: Rates, buf: WindowScratch) -> float:
    """Target ``t``: score its contexts ``src.emb[ins]`` (``ins`` = ``ctx[ctx_off[t] - ctx_off[0]:
    ctx_off[t + 1] - ctx_off[0]]``) against ``src.emb_w[outs]`` (``outs`` = ``pos[t]``, then the
    negatives ``neg[t*K:(t+1)*K]``; one equal to the target is skipped, as word2vec.c does), and
    add ``scale * gradient of the summed loss`` to ``dst`` at the same rows.

    The ``1 + K`` output rows are copied once into ``buf.w`` (the small dense operand every
    context row is multiplied with); each context row is then read once for its ``1 + K`` scores,
    its own update and its share of the outputs' updates. ``dst`` may be ``src`` itself (in-place
    SGD, ``scale = -lr``): every update is computed from the parameters of before the target and
    written at the end, outputs first.
    """
    outs = buf.outs
    w = buf.w
    bias = buf.b
    d_out = buf.d_out
    d_in = buf.d_in
    gk = buf.g
    g_sum = buf.g_sum
    width = outs.shape[0]
    dim = w.shape[1]
    outs[0] = pos[t]
    for k in range(width - 1):
        outs[1 + k] = neg[t * (width - 1) + k]
    for k in range(width):
        o = outs[k]
        for d in range(dim):
            w[k, d] = src.emb_w[o, d]
            d_out[k, d] = 0.0
        bias[k] = src.emb_b[o, 0]
        g_sum[k] = 0.0
    ins = ctx[ctx_off[t] - ctx_off[0] : ctx_off[t + 1] - ctx_off[0]]
    n = ins.shape[0]
    loss = 0.0
    prod = 1.0
    pending = 0
    for j in range(n):
        c = ins[j]
        for k in range(width):
            if k > 0 and outs[k] == outs[0]:
                gk[k] = 0.0
                continue
            s = bias[k]
            for d in range(dim):
                s += src.emb[c, d] * w[k, d]
            g, add, f = _term(s, k == 0)
            gk[k] = g
            loss, prod, pending = _tally(loss, prod, pending, add, f, 1)
        for d in range(dim):
            d_in[j, d] = 0.0
        for k in range(width):
            g = gk[k]
            if g != 0.0:
                for d in range(dim):
                    d_in[j, d] += g * w[k, d]
                    d_out[k, d] += g * src.emb[c, d]
        for k in range(width):
            g_sum[k] += gk[k]
    for k in range(width):
        o = outs[k]
        dst.emb_b[o, 0] += np.float32(scale.emb_b) * g_sum[k]
        for d in range(dim):
            dst.emb_w[o, d] += np.float32(scale.emb_w) * d_out[k, d]
    for j in range(n):
        c = ins[j]
        for d in range(dim):
            dst.emb[c, d] += np.float32(scale.emb) * d_in[j, d]
    return loss + np.log(prod)


@njit(cache=True, nogil=True, fastmath=_FAST)
def window_sgd(full: Tables, ctx: np.ndarray, ctx_off: np.ndarray, tgt: np.ndarray, neg: np.ndarray, lr: Rates,
               buf: WindowScratch, dirty: Marks) -> float:
    """Geo's step in window mode: SGD in place on the replica, one target after the other.

    Target ``t`` is ``tgt[t]``; its contexts ``ctx[ctx_off[t] - ctx_off[0]:ctx_off[t + 1] - ctx_off[0]]``
    and its negatives ``neg[t*K:(t+1)*K]`` (global ids). Every written row is marked dirty after
    it is written. Returns the summed loss."""
    scale = Rates(-lr.emb, -lr.emb_w, -lr.emb_b)
    outs = buf.outs
    loss = 0.0
    width = buf.outs.shape[0]
    row_bytes = full.emb_w.shape[1] * full.emb_w.itemsize
    for t in range(tgt.shape[0]):
        if t + 1 < tgt.shape[0]:  # the next target's output rows: random rows, mostly cache misses
            _prefetch_row(full.emb_w, tgt[t + 1], row_bytes)
            for k in range(width - 1):
                _prefetch_row(full.emb_w, neg[(t + 1) * (width - 1) + k], row_bytes)
        loss += _window_target(full, ctx, ctx_off, tgt, neg, t, full, scale, buf)
        for j in range(ctx_off[t] - ctx_off[0], ctx_off[t + 1] - ctx_off[0]):
            dirty.emb[ctx[j]] = 1
        for k in range(outs.shape[0]):
            dirty.emb_w[outs[k]] = 1
            dirty.emb_b[outs[k]] = 1
    return loss


@njit(cache=True, nogil=True, fastmath=_FAST)
def window_grad(full: Tables, u_in: np.ndarray, u_out: np.ndarray, inv_in: np.ndarray, ctx_off: np.ndarray,
                inv_pos: np.ndarray, inv_neg: np.ndarray, scratch: Tables, g: Tables, buf: WindowScratch,
                scale: float = 1.0) -> float:
    """Window mode's gradient of the summed loss at the start of the batch (for the modes that
    push gradients), times ``scale`` (as in :func:`batch_grad`): rows gathered as there, ``g``
    zeroed then filled in ``u_in`` / ``u_out`` order. ``inv_in`` holds the batch's pairs' input
    positions, ``ctx_off`` its targets' pair offsets (from ``ctx_off[0]``), ``inv_pos`` /
    ``inv_neg`` positions in ``u_out``. Returns the summed loss."""
    rows, g_rows = _start(full, u_in, u_out, scratch, g)
    one = Rates(scale, scale, scale)
    loss = 0.0
    for t in range(inv_pos.shape[0]):
        loss += _window_target(rows, inv_in, ctx_off, inv_pos, inv_neg, t, g_rows, one, buf)
    return loss
