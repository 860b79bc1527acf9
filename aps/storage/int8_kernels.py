"""Rows as int8 codes with one float32 scale a row: the two compiled loops (quantize, dequantize).

Used where rows are read, not trained: ``aps-serve --rows int8`` holds them so, and an export
written with ``rows="int8"`` stores them so (aps/checkpoints/hash_files.py).

Symmetric, one scale a row: ``scale = max|row| / 127``, ``code = rint(row / scale)`` in
[-127, 127], read back as ``code * scale``. Why this shape:

* One scale a row, not one a table or a column: an embedding's rows differ in size by orders of
  magnitude (a key seen once sits near its initial row, a hot key far from it), so a shared
  scale would spend the codes of small rows on nothing. A row is what a lookup reads whole, so
  its scale is read with it (4 bytes, the same cache line as the codes at small dims).
* Symmetric (no zero point): zero is a code, so a zero row, and every zero coordinate, reads
  back as an exact zero, and reading a row is one multiply a coordinate. The error of any
  coordinate is at most ``scale / 2`` (half a step of rounding to nearest), plus the float32
  rounding of the product (under ``1e-5 * scale``).
* -128 is never a code, so a row and its negation quantize alike.

A row whose largest value is 0 gets scale 0 and zero codes. A row holding a NaN or an infinity
has no finite scale: it gets a NaN scale and zero codes, so every coordinate reads NaN (a
diverged row stays visibly diverged; the loader counts them).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .prefetch import LINE, prefetch

#: the largest code; codes lie in [-CODE_MAX, CODE_MAX]
CODE_MAX = 127
#: a lookup asks for the codes and scale of row i + _ROWS_AHEAD while it reads row i
_ROWS_AHEAD = 8
#: the smallest positive float32 (a subnormal): the scale of a nonzero row whose largest value
#: divided by 127 underflows to zero
_TINY = np.float32(np.finfo(np.float32).smallest_subnormal)


@njit(cache=True, nogil=True)
def quantize_rows(values: np.ndarray, rows: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> int:
    """``codes[rows[i]]`` and ``scales[rows[i]]`` from the float32 row ``values[i]``; returns how
    many rows held a NaN or an infinity (their scale is NaN, their codes zero)."""
    n, dim = values.shape
    top = np.float32(CODE_MAX)
    nonfinite = 0
    for i in range(n):
        r = rows[i]
        peak = np.float32(0.0)
        finite = True
        for c in range(dim):
            x = values[i, c]
            if not np.isfinite(x):
                finite = False
            elif abs(x) > peak:
                peak = abs(x)
        if not finite or peak == 0:
            if not finite:
                nonfinite += 1
            scales[r] = np.float32(0.0) if finite else np.float32(np.nan)
            for c in range(dim):
                codes[r, c] = 0
            continue
        scale = peak / top
        if scale == 0:
            scale = _TINY
        scales[r] = scale
        step = np.float64(scale)
        for c in range(dim):
            q = np.rint(np.float64(values[i, c]) / step)
            codes[r, c] = np.int8(min(max(q, -CODE_MAX), CODE_MAX))
    return nonfinite


@njit(cache=True, nogil=True, inline="always")
def _ask_row(codes: np.ndarray, scales: np.ndarray, row: int) -> None:
    """Prefetch slab row ``row``'s codes and scale."""
    for b in range(0, codes.shape[1], LINE):
        prefetch(codes, row, b)
    prefetch(scales, row, 0)


@njit(cache=True, nogil=True)
def dequantize_rows(codes: np.ndarray, scales: np.ndarray, rows: np.ndarray, out: np.ndarray) -> int:
    """``out[i] = codes[rows[i]] * scales[rows[i]]`` (float32) where ``rows[i] >= 0``; rows of
    -1 (keys not held) are left as they were. Returns how many there are. Each row's codes and
    scale are asked for :data:`_ROWS_AHEAD` rows ahead, so a lookup's cache misses overlap."""
    n = rows.shape[0]
    for i in range(min(n, _ROWS_AHEAD)):
        if rows[i] >= 0:
            _ask_row(codes, scales, rows[i])
    unknown = 0
    for i in range(n):
        if i + _ROWS_AHEAD < n and rows[i + _ROWS_AHEAD] >= 0:
            _ask_row(codes, scales, rows[i + _ROWS_AHEAD])
        r = rows[i]
        if r < 0:
            unknown += 1
        else:
            scale = scales[r]
            for c in range(codes.shape[1]):
                out[i, c] = np.float32(codes[r, c]) * scale
    return unknown


def quantize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """float32 rows ``values`` [n, dim] as (int8 codes [n, dim], float32 scales [n], how many rows
    held a NaN or an infinity): what an export written with int8 rows stores a key's row as."""
    n = values.shape[0]
    codes, scales = np.empty(values.shape, np.int8), np.empty(n, np.float32)
    nonfinite = quantize_rows(np.ascontiguousarray(values, np.float32), np.arange(n, dtype=np.int64), codes, scales)
    return codes, scales, nonfinite
