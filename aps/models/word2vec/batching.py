"""Numba kernels that turn a chunk of text into word2vec batches: bytes → ids → windows → rows.

This is the *batching* half of the model (the step half is :mod:`.step`): everything here runs
once per chunk, before any parameter is read. Parsing yields token ids and line offsets; the
windows of a line give each target token its context tokens; negatives are drawn by inverse CDF
from the exact unigram^0.75 distribution; and each batch's distinct rows and inverse indexes are
found with an O(1) mark array (no sort, no hash table), for the modes that pull rows by id.

The pairs of a chunk are laid out by *target*: ``tgt[t]`` is the ``t``-th token that has at least
one context, and ``ctx[ctx_off[t]:ctx_off[t + 1]]`` are its contexts (left then right, never
crossing a line). A pair is ``(tgt[t], ctx[j])``; every sampling mode reads this one layout.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

# parse_ids status codes (info[0])
PARSE_OK = 0
PARSE_NOT_INT = 1
PARSE_OUT_OF_RANGE = 2

_NL = 10
_SPACE = 32
_TAB = 9
_CR = 13
_MAX_DIGITS = 18  # more digits cannot be a row id (and would overflow int64)


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


# ---------------------------------------------------------------- windows


@njit(cache=True, nogil=True)
def count_windows(sent_off: np.ndarray, nsent: int, wins: np.ndarray) -> tuple[int, int]:
    """Targets with at least one context, and pairs, that the windows ``wins`` (one per token) give."""
    pairs = 0
    targets = 0
    for s in range(nsent):
        a = sent_off[s]
        b = sent_off[s + 1]
        for i in range(a, b):
            r = wins[i]
            n = min(b, i + r + 1) - max(a, i - r) - 1
            pairs += n
            targets += n > 0
    return targets, pairs


@njit(cache=True, nogil=True)
def make_windows(ids: np.ndarray, sent_off: np.ndarray, nsent: int, wins: np.ndarray,
                 tgt: np.ndarray, ctx_off: np.ndarray, ctx: np.ndarray, tok_before: np.ndarray) -> None:
    """Fill the target layout (see the module docstring) with each token's window ``wins[i]``.

    ``tok_before[t]`` is the number of tokens of the chunk before target ``t`` (a learning-rate
    schedule counts progress in tokens, as word2vec.c does)."""
    p = 0
    t = 0
    ctx_off[0] = 0
    for s in range(nsent):
        a = sent_off[s]
        b = sent_off[s + 1]
        for i in range(a, b):
            r = wins[i]
            lo = max(a, i - r)
            hi = min(b, i + r + 1)
            if hi - lo < 2:
                continue
            for j in range(lo, hi):
                if j != i:
                    ctx[p] = ids[j]
                    p += 1
            tgt[t] = ids[i]
            tok_before[t] = i
            t += 1
            ctx_off[t] = p


def batch_bounds(ctx_off: np.ndarray, batch: int) -> np.ndarray:
    """Target offsets of batches of whole targets holding about ``batch`` pairs each: a batch
    ends with the first target whose pairs reach the next multiple of ``batch``."""
    npairs = int(ctx_off[-1])
    ends = np.searchsorted(ctx_off, np.arange(batch, npairs, batch, dtype=np.int64), side="left")
    bounds = np.unique(np.concatenate(([0], ends, [ctx_off.shape[0] - 1])))
    return bounds.astype(np.int64)


# ---------------------------------------------------------------- negatives


def negative_guide(cdf: np.ndarray, bits: int = 17) -> np.ndarray:
    """Bucket starts for :func:`sample_cdf`: ``guide[j] = searchsorted(cdf, j / 2**bits)`` for
    ``j = 0..2**bits`` (a power of two, so ``u * 2**bits`` and ``j / 2**bits`` are exact)."""
    n = 1 << bits
    return np.searchsorted(cdf, np.arange(n + 1, dtype=np.float64) / n).astype(np.int64)


@njit(cache=True, nogil=True)
def sample_cdf(cdf: np.ndarray, guide: np.ndarray, uniforms: np.ndarray, out: np.ndarray) -> None:
    """``out = min(searchsorted(cdf, uniforms), len(cdf) - 1)`` (exactly
    :func:`~aps.models.word2vec.corpus.sample_negatives`), but searching only the bucket of
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




# ---------------------------------------------------------------- rows of a batch


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
def _index_range(src: np.ndarray, lo: int, hi: int, mark: np.ndarray, unique: np.ndarray, total: int, base: int,
                 inv: np.ndarray) -> int:
    for q in range(lo, hi):
        m, total = _index_of(src[q], mark, unique, total, base)
        inv[q] = m
    return total


class BatchRows(NamedTuple):
    """The rows batches read, for :func:`index_batches`: flat id arrays and each batch's bounds.

    Batch ``b`` reads input (``emb``) rows ``inputs[input_b[b]:input_b[b + 1]]`` and output
    (``emb_w`` / ``emb_b``) rows ``positives[positive_b[b]:positive_b[b + 1]]`` and
    ``negatives[negative_b[b]:negative_b[b + 1]]``."""

    inputs: np.ndarray  # int32 ids
    input_b: np.ndarray  # int64 [batches + 1]
    positives: np.ndarray
    positive_b: np.ndarray
    negatives: np.ndarray
    negative_b: np.ndarray


class RowIndex(NamedTuple):
    """What :func:`index_batches` finds: batch ``b``'s distinct rows, in order of first use,
    ``u_in[u_in_off[b]:u_in_off[b + 1]]`` and ``u_out[u_out_off[b]:u_out_off[b + 1]]``; the
    inverse indexes ``inv_in`` / ``inv_pos`` / ``inv_neg`` (shaped like :class:`BatchRows`'
    ``inputs`` / ``positives`` / ``negatives``) index those lists."""

    u_in: np.ndarray  # int64
    u_in_off: np.ndarray  # int64 [batches + 1]
    u_out: np.ndarray
    u_out_off: np.ndarray
    inv_in: np.ndarray  # int32
    inv_pos: np.ndarray
    inv_neg: np.ndarray


@njit(cache=True, nogil=True)
def index_batches(rows: BatchRows, mark: np.ndarray, out: RowIndex) -> None:
    """Distinct rows and inverse indexes of every batch (:class:`RowIndex`), for every sampling
    mode. ``mark`` (int32[vocab], all -1) is scratch: a row's slot while its batch is indexed,
    reset to -1 afterwards."""
    i_tot = 0
    o_tot = 0
    out.u_in_off[0] = 0
    out.u_out_off[0] = 0
    for b in range(rows.input_b.shape[0] - 1):
        i0 = i_tot
        i_tot = _index_range(rows.inputs, rows.input_b[b], rows.input_b[b + 1], mark, out.u_in, i_tot, i0, out.inv_in)
        for q in range(i0, i_tot):
            mark[out.u_in[q]] = -1
        o0 = o_tot
        o_tot = _index_range(rows.positives, rows.positive_b[b], rows.positive_b[b + 1], mark, out.u_out, o_tot, o0,
                             out.inv_pos)
        o_tot = _index_range(rows.negatives, rows.negative_b[b], rows.negative_b[b + 1], mark, out.u_out, o_tot, o0,
                             out.inv_neg)
        for q in range(o0, o_tot):
            mark[out.u_out[q]] = -1
        out.u_in_off[b + 1] = i_tot
        out.u_out_off[b + 1] = o_tot


def index_rows(rows: BatchRows, mark: np.ndarray) -> RowIndex:
    """:func:`index_batches` with its output arrays allocated here."""
    nb = rows.input_b.shape[0] - 1
    out = RowIndex(
        np.empty(rows.inputs.shape[0], dtype=np.int64), np.empty(nb + 1, dtype=np.int64),
        np.empty(rows.positives.shape[0] + rows.negatives.shape[0], dtype=np.int64), np.empty(nb + 1, dtype=np.int64),
        np.empty(rows.inputs.shape[0], dtype=np.int32), np.empty(rows.positives.shape[0], dtype=np.int32),
        np.empty(rows.negatives.shape[0], dtype=np.int32),
    )
    index_batches(rows, mark, out)
    return out
