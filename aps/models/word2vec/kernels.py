"""Numba kernels of skip-gram word2vec: bytes → pairs → batches → gradients → SGD.

Everything per token, per pair and per row runs here, compiled (``cache=True``, ``nogil``); the
model's Python code only calls these once per chunk (parsing, pairing, batching) or once per
batch (the step), so a chunk of ~1.4 M pairs costs a handful of Python calls plus one per batch.

The step kernel computes exactly the reference network (Fleet's word2vec), for every pair
``(centre c, context t)`` of a batch and its ``K`` shared negatives ``n_1..n_K``::

    s_t = <emb[c], emb_w[t]> + emb_b[t]            label 1
    s_k = <emb[c], emb_w[n_k]> + emb_b[n_k]        label 0
    loss(pair) = softplus(-s_t) + sum_k softplus(s_k)     (sigmoid cross-entropy)

and the gradient of the *batch mean* ``sum(loss) / pairs`` (the reference's ``reduce_mean``).
Because the negatives are shared by the whole batch, ``s_k`` depends only on the centre word;
consecutive pairs with the same centre (all the contexts of one centre token) form a *run*
whose negative terms are computed once and weighted by the run length — the same sum, about 3x
fewer dot products than evaluating them pair by pair.

A step first copies the batch's rows into compact scratch buffers (:func:`gather`): the random
row reads then overlap in one short loop instead of stalling the arithmetic, and the gradient
loop runs on rows that stay in L1/L2. Gradients go to one row per distinct id (the batch's
``sparse_ids`` order), so the runtime's pull / push / SGD see each row once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...trainer.kernels import sgd_rows

# parse_ids status codes (info[0])
PARSE_OK = 0
PARSE_NOT_INT = 1
PARSE_OUT_OF_RANGE = 2

_NL = 10
_SPACE = 32
_TAB = 9
_CR = 13
_MAX_DIGITS = 18  # more digits cannot be a row id (and would overflow int64)

# fast-math without nnan/ninf: vectorised dot products, but exp overflow still behaves
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


# ---------------------------------------------------------------- parsing


@njit(cache=True, nogil=True)
def parse_ids(buf: np.ndarray, vocab: int, skip_bad: bool, ids: np.ndarray, sent_off: np.ndarray, info: np.ndarray) -> None:
    """Parse lines of space-separated ids from raw bytes.

    ``ids`` (int32, >= len(buf) // 2 + 1) receives the tokens of the kept lines back to back;
    ``sent_off[s]:sent_off[s + 1]`` are the tokens of the ``s``-th non-empty kept line.
    ``info`` (int64[8]) returns: status, tokens, sentences, bad lines skipped, and on error the
    0-based line index and the byte range of the offending token. A bad token is one that is not
    a plain decimal integer or is ``>= vocab``; with ``skip_bad`` its whole line is dropped.
    """
    n = buf.shape[0]
    ntok = 0
    nsent = 0
    nbad = 0
    line = 0
    i = 0
    sent_off[0] = 0
    info[0] = PARSE_OK
    while i < n:
        line_tok0 = ntok
        bad = False
        while i < n and buf[i] != _NL:
            c = buf[i]
            if c == _SPACE or c == _TAB or c == _CR:
                i += 1
                continue
            start = i
            val = 0
            digits = 0
            is_int = True
            while i < n:
                c = buf[i]
                if c == _SPACE or c == _TAB or c == _CR or c == _NL:
                    break
                if c < 48 or c > 57:
                    is_int = False
                elif digits < _MAX_DIGITS:
                    val = val * 10 + (c - 48)
                digits += 1
                i += 1
            if is_int and digits <= _MAX_DIGITS and val < vocab:
                ids[ntok] = val
                ntok += 1
                continue
            if not skip_bad:
                info[0] = PARSE_NOT_INT if not is_int else PARSE_OUT_OF_RANGE
                info[4] = line
                info[5] = start
                info[6] = i
                info[1] = ntok
                info[2] = nsent
                info[3] = nbad
                return
            bad = True
            while i < n and buf[i] != _NL:
                i += 1
        if bad:
            ntok = line_tok0
            nbad += 1
        elif ntok > line_tok0:
            nsent += 1
            sent_off[nsent] = ntok
        line += 1
        i += 1  # the newline
    info[1] = ntok
    info[2] = nsent
    info[3] = nbad


# ---------------------------------------------------------------- pairs and batches


@njit(cache=True, nogil=True)
def count_pairs(sent_off: np.ndarray, nsent: int, wins: np.ndarray) -> int:
    """Number of (centre, context) pairs the windows ``wins`` (one per token) give."""
    total = 0
    for s in range(nsent):
        a = sent_off[s]
        b = sent_off[s + 1]
        for i in range(a, b):
            r = wins[i]
            lo = max(a, i - r)
            hi = min(b, i + r + 1)
            total += hi - lo - 1
    return total


@njit(cache=True, nogil=True)
def make_pairs(ids: np.ndarray, sent_off: np.ndarray, nsent: int, wins: np.ndarray, cen: np.ndarray, ctx: np.ndarray) -> int:
    """Skip-gram pairs in the reference's order: each centre, its left then right contexts
    within its own window ``wins[i]``, never crossing a line."""
    p = 0
    for s in range(nsent):
        a = sent_off[s]
        b = sent_off[s + 1]
        for i in range(a, b):
            r = wins[i]
            lo = max(a, i - r)
            hi = min(b, i + r + 1)
            centre = ids[i]
            for j in range(lo, hi):
                if j != i:
                    cen[p] = centre
                    ctx[p] = ids[j]
                    p += 1
    return p


@njit(cache=True, nogil=True, inline="always")
def _index_of(x: int, mark: np.ndarray, unique: np.ndarray, total: int, base: int) -> tuple[int, int]:
    """Position of id ``x`` among this batch's unique ids (those since ``base``), appending it
    to ``unique`` on first sight. ``mark`` (vocab-sized, -1 = unseen) makes it O(1)."""
    m = mark[x]
    if m < 0:
        m = total - base
        mark[x] = m
        unique[total] = x
        total += 1
    return m, total


@njit(cache=True, nogil=True)
def index_batches(
    cen: np.ndarray,
    ctx: np.ndarray,
    batch: int,
    negs: np.ndarray,
    mark: np.ndarray,
    uc: np.ndarray,
    uc_off: np.ndarray,
    uw: np.ndarray,
    uw_off: np.ndarray,
    inv_c: np.ndarray,
    inv_t: np.ndarray,
    inv_n: np.ndarray,
) -> None:
    """Unique rows and inverse indexes of every batch of ``batch`` consecutive pairs.

    Batch ``b`` reads ``emb`` rows ``uc[uc_off[b]:uc_off[b+1]]`` (its distinct centres, in order
    of first use) and ``emb_w``/``emb_b`` rows ``uw[uw_off[b]:uw_off[b+1]]`` (its distinct
    contexts, then negatives). ``inv_c[p]`` / ``inv_t[p]`` / ``inv_n[b, k]`` index those lists.
    ``mark`` (int32[vocab], all -1) is scratch: a row's slot while its batch is being indexed,
    reset to -1 afterwards, so deduplication is O(pairs) with no sort and no hash table.
    """
    npairs = cen.shape[0]
    nb = negs.shape[0]
    k_neg = negs.shape[1]
    c_tot = 0
    w_tot = 0
    uc_off[0] = 0
    uw_off[0] = 0
    for b in range(nb):
        p0 = b * batch
        p1 = min(npairs, p0 + batch)
        c0 = c_tot
        for p in range(p0, p1):
            x = cen[p]
            m, c_tot = _index_of(x, mark, uc, c_tot, c0)
            inv_c[p] = m
        for q in range(c0, c_tot):
            mark[uc[q]] = -1
        w0 = w_tot
        for p in range(p0, p1):
            x = ctx[p]
            m, w_tot = _index_of(x, mark, uw, w_tot, w0)
            inv_t[p] = m
        for k in range(k_neg):
            x = negs[b, k]
            m, w_tot = _index_of(x, mark, uw, w_tot, w0)
            inv_n[b, k] = m
        for q in range(w0, w_tot):
            mark[uw[q]] = -1
        uc_off[b + 1] = c_tot
        uw_off[b + 1] = w_tot


# ---------------------------------------------------------------- the step


@njit(cache=True, nogil=True)
def gather(emb: np.ndarray, emb_w: np.ndarray, emb_b: np.ndarray, uc: np.ndarray, uw: np.ndarray,
           e: np.ndarray, w: np.ndarray, b: np.ndarray) -> None:
    """Copy the batch's rows into compact buffers: one short loop of independent row copies lets
    the CPU have many cache misses in flight, and the step then works on L1/L2-resident rows."""
    dim = emb.shape[1]
    for i in range(uc.shape[0]):
        r = uc[i]
        for d in range(dim):
            e[i, d] = emb[r, d]
    for j in range(uw.shape[0]):
        r = uw[j]
        for d in range(dim):
            w[j, d] = emb_w[r, d]
        b[j, 0] = emb_b[r, 0]


@njit(cache=True, nogil=True, fastmath=_FAST)
def grad_rows(e: np.ndarray, w: np.ndarray, b: np.ndarray, inv_c: np.ndarray, inv_t: np.ndarray,
              inv_n: np.ndarray, g_e: np.ndarray, g_w: np.ndarray, g_b: np.ndarray) -> float:
    """Add the gradient of the batch-mean loss to ``g_e`` / ``g_w`` / ``g_b`` and return the
    *summed* loss over the batch's pairs (for monitoring).

    ``e`` holds the batch's centre rows and ``w`` / ``b`` its context-and-negative rows (see
    :func:`gather`); pair ``p`` is ``(e[inv_c[p]], w[inv_t[p]])``, negative ``k`` is
    ``w[inv_n[k]]``. Parameters are only read, so this is the gradient at the start of the batch.

    Every term is ``softplus(x) = log(1 + e^x)`` with ``x = -s`` (label 1) or ``x = s`` (label
    0), and ``dloss/dx = e^x / (1 + e^x)``. One ``exp`` per term gives both; the logs of the
    factors ``1 + e^x`` are taken as the log of their running product, flushed before it can
    overflow (at most 19 factors <= 1 + e^30), so the monitoring loss costs one ``log`` per
    dozen terms instead of one ``log1p`` each — a third of the kernel's time otherwise.
    For ``|x| > 30`` the float32 result is exact with ``softplus(x) = max(x, 0)``.
    """
    n = inv_c.shape[0]
    dim = e.shape[1]
    k_neg = inv_n.shape[0]
    scale = 1.0 / n if n > 0 else 0.0
    loss = 0.0
    prod = 1.0  # product of pending factors 1 + e^x
    pending = 0
    run = 0
    for p in range(n):
        ic = inv_c[p]
        it = inv_t[p]
        s = b[it, 0]
        for d in range(dim):
            s += e[ic, d] * w[it, d]
        # label 1: x = -s; dloss/ds = -e^x / (1 + e^x) = sigmoid(s) - 1
        x = -np.float64(s)
        if x > 30.0:
            loss += x
            g = np.float32(-scale)
        elif x < -30.0:
            g = np.float32(0.0)
        else:
            z = np.exp(x)
            prod *= 1.0 + z
            pending += 1
            g = np.float32(-z / (1.0 + z) * scale)
        if pending >= 12:
            loss += np.log(prod)
            prod = 1.0
            pending = 0
        g_b[it, 0] += g
        for d in range(dim):
            g_w[it, d] += g * e[ic, d]
            g_e[ic, d] += g * w[it, d]
        run += 1
        if p + 1 < n and inv_c[p + 1] == ic:
            continue
        # end of this centre's run: its negative terms, once, weighted by the run length
        for k in range(k_neg):
            ik = inv_n[k]
            s = b[ik, 0]
            for d in range(dim):
                s += e[ic, d] * w[ik, d]
            # label 0: x = s; dloss/ds = sigmoid(s)
            x = np.float64(s)
            if x > 30.0:
                loss += run * x
                g = np.float32(run * scale)
            elif x < -30.0:
                g = np.float32(0.0)
            else:
                z = np.exp(x)
                f = 1.0 + z
                if run <= 8:
                    for _ in range(run):
                        prod *= f
                    pending += run
                else:
                    loss += run * np.log(f)
                g = np.float32(run * scale * z / f)
            if pending >= 12:
                loss += np.log(prod)
                prod = 1.0
                pending = 0
            g_b[ik, 0] += g
            for d in range(dim):
                g_w[ik, d] += g * e[ic, d]
                g_e[ic, d] += g * w[ik, d]
        run = 0
    return loss + np.log(prod)


@njit(cache=True, nogil=True)
def batch_grad(
    emb: np.ndarray, emb_w: np.ndarray, emb_b: np.ndarray, uc: np.ndarray, uw: np.ndarray,
    inv_c: np.ndarray, inv_t: np.ndarray, inv_n: np.ndarray,
    scratch_e: np.ndarray, scratch_w: np.ndarray, scratch_b: np.ndarray,
    g_e: np.ndarray, g_w: np.ndarray, g_b: np.ndarray,
) -> float:
    """Gather the batch's rows into the scratch buffers, zero ``g_*`` and fill them with the
    gradient of the batch-mean loss (rows in ``uc`` / ``uw`` order); return the summed loss."""
    nc = uc.shape[0]
    nw = uw.shape[0]
    e = scratch_e[:nc]
    w = scratch_w[:nw]
    b = scratch_b[:nw]
    gather(emb, emb_w, emb_b, uc, uw, e, w, b)
    g_e[:nc] = 0.0
    g_w[:nw] = 0.0
    g_b[:nw] = 0.0
    return grad_rows(e, w, b, inv_c, inv_t, inv_n, g_e[:nc], g_w[:nw], g_b[:nw])


@njit(cache=True, nogil=True)
def local_step(
    emb: np.ndarray, emb_w: np.ndarray, emb_b: np.ndarray, uc: np.ndarray, uw: np.ndarray,
    inv_c: np.ndarray, inv_t: np.ndarray, inv_n: np.ndarray, lr_e: float, lr_w: float, lr_b: float,
    scratch_e: np.ndarray, scratch_w: np.ndarray, scratch_b: np.ndarray,
    g_e: np.ndarray, g_w: np.ndarray, g_b: np.ndarray,
    dirty_e: np.ndarray, dirty_w: np.ndarray, dirty_b: np.ndarray,
) -> float:
    """One fused geo step: :func:`batch_grad` into per-worker scratch, then SGD on the shared
    rows and their dirty marks; returns the summed loss."""
    loss = batch_grad(emb, emb_w, emb_b, uc, uw, inv_c, inv_t, inv_n, scratch_e, scratch_w, scratch_b, g_e, g_w, g_b)
    sgd_rows(emb, uc, g_e[: uc.shape[0]], lr_e, dirty_e)
    sgd_rows(emb_w, uw, g_w[: uw.shape[0]], lr_w, dirty_w)
    sgd_rows(emb_b, uw, g_b[: uw.shape[0]], lr_b, dirty_b)
    return loss


# ---------------------------------------------------------------- negatives per pair
#
# ``negatives="pair"`` (word2vec / gensim style): every pair draws its own ``K`` negatives, so
# ``inv_n`` is ``[pairs, K]`` and a batch reads up to ``pairs * (1 + K)`` output rows. The
# kernels below mirror :func:`index_batches` / :func:`grad_rows` / :func:`batch_grad` /
# :func:`local_step` for that layout; the shared-negative kernels above are left untouched.


def negative_guide(cdf: np.ndarray, bits: int = 17) -> np.ndarray:
    """Bucket starts for :func:`sample_cdf`: ``guide[j] = searchsorted(cdf, j / 2**bits)`` for
    ``j = 0..2**bits`` (a power of two, so ``u * 2**bits`` and ``j / 2**bits`` are exact)."""
    n = 1 << bits
    return np.searchsorted(cdf, np.arange(n + 1, dtype=np.float64) / n).astype(np.int64)


@njit(cache=True, nogil=True)
def sample_cdf(cdf: np.ndarray, guide: np.ndarray, uniforms: np.ndarray, out: np.ndarray) -> None:
    """``out = min(searchsorted(cdf, uniforms), len(cdf) - 1)`` (exactly
    :func:`~aps.models.word2vec.model.sample_negatives`), but searching only the bucket of
    :func:`negative_guide` that holds each uniform: a couple of probes instead of ~16 cache
    missing ones over the whole table. ``uniforms`` and ``out`` are flat and of equal length."""
    nbuckets = guide.shape[0] - 1
    last = cdf.shape[0] - 1
    for i in range(uniforms.shape[0]):
        u = uniforms[i]
        j = int(u * nbuckets)
        if j >= nbuckets:
            j = nbuckets - 1
        lo = guide[j]
        hi = guide[j + 1]
        while lo < hi:  # first index in [lo, hi) with cdf >= u, else hi
            mid = (lo + hi) >> 1
            if cdf[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo if lo < last else last


@njit(cache=True, nogil=True)
def index_batches_pair(
    cen: np.ndarray,
    ctx: np.ndarray,
    batch: int,
    negs: np.ndarray,
    mark: np.ndarray,
    uc: np.ndarray,
    uc_off: np.ndarray,
    uw: np.ndarray,
    uw_off: np.ndarray,
    inv_c: np.ndarray,
    inv_t: np.ndarray,
    inv_n: np.ndarray,
) -> None:
    """:func:`index_batches` with per-pair negatives: ``negs`` / ``inv_n`` are ``[pairs, K]``.

    Batch ``b``'s ``emb_w`` rows are its distinct contexts then its distinct negatives not
    already among them (``uw`` needs ``pairs * (1 + K)`` room in the worst case)."""
    npairs = cen.shape[0]
    k_neg = negs.shape[1]
    nb = (npairs + batch - 1) // batch
    c_tot = 0
    w_tot = 0
    uc_off[0] = 0
    uw_off[0] = 0
    for b in range(nb):
        p0 = b * batch
        p1 = min(npairs, p0 + batch)
        c0 = c_tot
        for p in range(p0, p1):
            x = cen[p]
            m, c_tot = _index_of(x, mark, uc, c_tot, c0)
            inv_c[p] = m
        for q in range(c0, c_tot):
            mark[uc[q]] = -1
        w0 = w_tot
        for p in range(p0, p1):
            x = ctx[p]
            m, w_tot = _index_of(x, mark, uw, w_tot, w0)
            inv_t[p] = m
        for p in range(p0, p1):
            for k in range(k_neg):
                x = negs[p, k]
                m, w_tot = _index_of(x, mark, uw, w_tot, w0)
                inv_n[p, k] = m
        for q in range(w0, w_tot):
            mark[uw[q]] = -1
        uc_off[b + 1] = c_tot
        uw_off[b + 1] = w_tot


@njit(cache=True, nogil=True, fastmath=_FAST)
def grad_rows_pair(e: np.ndarray, w: np.ndarray, b: np.ndarray, inv_c: np.ndarray, inv_t: np.ndarray,
                   inv_n: np.ndarray, g_e: np.ndarray, g_w: np.ndarray, g_b: np.ndarray) -> float:
    """:func:`grad_rows` with per-pair negatives: pair ``p``'s negative ``k`` is
    ``w[inv_n[p, k]]``. Same loss, same gradient of the batch mean, same overflow handling and
    batched logs; no runs (each pair's negatives are its own)."""
    n = inv_c.shape[0]
    dim = e.shape[1]
    k_neg = inv_n.shape[1]
    scale = 1.0 / n if n > 0 else 0.0
    loss = 0.0
    prod = 1.0
    pending = 0
    for p in range(n):
        ic = inv_c[p]
        for k in range(k_neg + 1):
            if k == 0:
                it = inv_t[p]
            else:
                it = inv_n[p, k - 1]
            s = b[it, 0]
            for d in range(dim):
                s += e[ic, d] * w[it, d]
            # label 1 (k == 0): x = -s, dloss/ds = -e^x/(1+e^x); label 0: x = s, dloss/ds = e^x/(1+e^x)
            x = -np.float64(s) if k == 0 else np.float64(s)
            sign = -scale if k == 0 else scale
            if x > 30.0:
                loss += x
                g = np.float32(sign)
            elif x < -30.0:
                g = np.float32(0.0)
            else:
                z = np.exp(x)
                prod *= 1.0 + z
                pending += 1
                g = np.float32(sign * z / (1.0 + z))
            if pending >= 12:
                loss += np.log(prod)
                prod = 1.0
                pending = 0
            g_b[it, 0] += g
            for d in range(dim):
                g_w[it, d] += g * e[ic, d]
                g_e[ic, d] += g * w[it, d]
    return loss + np.log(prod)


@njit(cache=True, nogil=True)
def batch_grad_pair(
    emb: np.ndarray, emb_w: np.ndarray, emb_b: np.ndarray, uc: np.ndarray, uw: np.ndarray,
    inv_c: np.ndarray, inv_t: np.ndarray, inv_n: np.ndarray,
    scratch_e: np.ndarray, scratch_w: np.ndarray, scratch_b: np.ndarray,
    g_e: np.ndarray, g_w: np.ndarray, g_b: np.ndarray,
) -> float:
    """:func:`batch_grad` for per-pair negatives (``inv_n`` is ``[pairs, K]``)."""
    nc = uc.shape[0]
    nw = uw.shape[0]
    e = scratch_e[:nc]
    w = scratch_w[:nw]
    b = scratch_b[:nw]
    gather(emb, emb_w, emb_b, uc, uw, e, w, b)
    g_e[:nc] = 0.0
    g_w[:nw] = 0.0
    g_b[:nw] = 0.0
    return grad_rows_pair(e, w, b, inv_c, inv_t, inv_n, g_e[:nc], g_w[:nw], g_b[:nw])


@njit(cache=True, nogil=True)
def local_step_pair(
    emb: np.ndarray, emb_w: np.ndarray, emb_b: np.ndarray, uc: np.ndarray, uw: np.ndarray,
    inv_c: np.ndarray, inv_t: np.ndarray, inv_n: np.ndarray, lr_e: float, lr_w: float, lr_b: float,
    scratch_e: np.ndarray, scratch_w: np.ndarray, scratch_b: np.ndarray,
    g_e: np.ndarray, g_w: np.ndarray, g_b: np.ndarray,
    dirty_e: np.ndarray, dirty_w: np.ndarray, dirty_b: np.ndarray,
) -> float:
    """:func:`local_step` for per-pair negatives."""
    loss = batch_grad_pair(emb, emb_w, emb_b, uc, uw, inv_c, inv_t, inv_n, scratch_e, scratch_w, scratch_b, g_e, g_w, g_b)
    sgd_rows(emb, uc, g_e[: uc.shape[0]], lr_e, dirty_e)
    sgd_rows(emb_w, uw, g_w[: uw.shape[0]], lr_w, dirty_w)
    sgd_rows(emb_b, uw, g_b[: uw.shape[0]], lr_b, dirty_b)
    return loss
