"""Values and optimizer state stored in fewer bits than they are computed in
(``HashTable(dtype="float16")`` or ``"bfloat16"``, ``HashTable(state_dtype="bfloat16")``).

The slab keeps a float16 table's values as numpy ``float16`` and a bfloat16 one's as ``uint16``
(the top half of a float32: numpy has no bfloat16); everything that computes on them (the
optimizer kernels, initialisers, GEO's additions) does so in float32 on a scratch copy of the rows
a request touches, and writes them back rounded. Why this shape:

* The optimizer kernels stay the ones fixed and float32 tables run (numba has no float16 on
  CPUs), so a compact table computes exactly what a float32 one computes on the same stored
  values; only the rounding of each written row differs.
* Rounding to nearest (ties to even), numpy's cast, not stochastic rounding: it is
  deterministic, so the same pushes give the same bits on any number of pservers and after a
  reload, and the steps the CTR models take (Adagrad's and Adam's, at their rates) are many
  units in the last place of float16 at the values' scale, which is where stochastic rounding
  pays. The cost was measured (docs/concepts.md, "Compact rows").
* Values beyond float16's range saturate at +-65504 rather than becoming infinite: an
  embedding that large has diverged, and an infinity would poison every sum it enters. The same
  holds for bfloat16 at its largest finite value (about 3.39e38); a NaN stays a NaN.
* bfloat16 keeps float32's exponent with 8 bits of mantissa (float16: 5 and 10), so it holds
  what float16 cannot: Adam's second moments (squared gradients, 1e-10 and below, under float16's
  smallest subnormal) and Adagrad's sums. That is why optimizer state may be bfloat16 and not
  float16; values may be either (float16 is the more precise where it fits).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from ..prefetch import prefetch

#: numpy's storage type for each ``HashTable.dtype`` and ``state_dtype`` (bfloat16: its bits)
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
#: the largest finite float16
FLOAT16_MAX = float(np.finfo(np.float16).max)
#: the stored types written through :func:`encode`
_ROUNDED = (np.float32, np.float16, np.uint16)
#: the largest finite bfloat16's bits, without the sign
_BF16_MAX_BITS = 0x7F7F


@njit(cache=True, nogil=True)
def _encode_bfloat16(bits: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """float32 ``bits`` (uint32) to bfloat16 (uint16): rounded to nearest, ties to even;
    infinities and values that round past the largest finite one saturate; NaN stays NaN."""
    for i in range(bits.shape[0]):
        b = np.uint32(bits[i])
        sign = (b >> 16) & 0x8000
        if (b & 0x7F800000) == 0x7F800000:
            if b & 0x007FFFFF:
                out[i] = np.uint16((b >> 16) | 0x0040)  # a quiet NaN
            else:
                out[i] = np.uint16(sign | _BF16_MAX_BITS)
            continue
        rounded = (np.uint64(b) + np.uint64(0x7FFF) + np.uint64((b >> 16) & 1)) >> 16
        if (rounded & 0x7F80) == 0x7F80:
            out[i] = np.uint16(sign | _BF16_MAX_BITS)
        else:
            out[i] = np.uint16(rounded)


def encode(values: np.ndarray, stored: type) -> np.ndarray:
    """float32 ``values`` as ``stored`` (one of :data:`STORAGE`'s types), rounded and saturated."""
    if stored is np.float32:
        return np.asarray(values, np.float32)
    if stored is np.float16:
        return np.clip(values, -FLOAT16_MAX, FLOAT16_MAX).astype(np.float16)
    flat = np.ascontiguousarray(values, np.float32).reshape(-1)
    out = np.empty(flat.shape[0], np.uint16)
    _encode_bfloat16(flat.view(np.uint32), out)
    return out.reshape(np.shape(values))


def decode(stored: np.ndarray) -> np.ndarray:
    """Stored values or state (any of :data:`STORAGE`'s types) as float32 (a copy)."""
    if stored.dtype == np.uint16:
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32)


#: rows a gather asks the memory system for ahead of the row it copies
_AHEAD = 16


@njit(cache=True, nogil=True, inline="always")
def _float16_bits_to_float32(h: np.uint32) -> np.uint32:  # pragma: no cover - numba
    """IEEE half-precision bits to single-precision bits, exactly (every half is a single)."""
    sign = (h & 0x8000) << 16
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 0x1F:  # infinity or NaN, its payload kept
        return np.uint32(sign | 0x7F800000 | (mantissa << 13))
    if exponent != 0:
        return np.uint32(sign | ((exponent + 112) << 23) | (mantissa << 13))
    if mantissa == 0:
        return np.uint32(sign)
    shift = 0  # subnormal: normalise the mantissa
    while (mantissa & 0x400) == 0:
        mantissa <<= 1
        shift += 1
    return np.uint32(sign | ((113 - shift) << 23) | ((mantissa & 0x3FF) << 13))


@njit(cache=True, nogil=True)
def _gather_decoded(bits, rows, bfloat16, out):  # pragma: no cover - numba
    """``out[i] = float32(stored[rows[i]])`` for each ``rows[i] >= 0`` (others left as they
    are), from the stored rows' 16-bit patterns ``bits`` (uint16[n, width]) into ``out``'s
    float32 bits (uint32[len(rows), width]), asking for rows ahead (a table's rows are far
    apart in memory: each is a miss)."""
    n = rows.shape[0]
    for i in range(min(_AHEAD, n)):
        if rows[i] >= 0:
            prefetch(bits, rows[i], 0)
    for i in range(n):
        ahead = i + _AHEAD
        if ahead < n and rows[ahead] >= 0:
            prefetch(bits, rows[ahead], 0)
        r = rows[i]
        if r < 0:
            continue
        for j in range(bits.shape[1]):
            h = np.uint32(bits[r, j])
            out[i, j] = h << 16 if bfloat16 else _float16_bits_to_float32(h)


def gather_decoded(stored: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = stored[rows[i]]`` as float32 for every ``rows[i] >= 0``, the rest of ``out``
    untouched: a 16-bit table's rows (float16, or bfloat16's uint16) in one pass, with none of
    numpy's steps (the fancy index, the cast, the scatter) and their copies."""
    width = int(np.prod(stored.shape[1:], dtype=np.int64))
    bits = stored.view(np.uint16).reshape(stored.shape[0], width)
    _gather_decoded(bits, rows, stored.dtype == np.uint16, out.view(np.uint32).reshape(out.shape[0], width))


#: a float32 row kernel: ``(values, state, ids, ordered)`` over a scratch copy of the rows
RowKernel = Callable[[np.ndarray, dict[str, np.ndarray], np.ndarray, bool], None]


def storage_dtype(dtype: str) -> type:
    """The numpy type a hash table of ``dtype`` keeps its values in."""
    return STORAGE[dtype]


def value_row_nbytes(dtype: str, dim: int) -> int:
    """Bytes of one key's values as a table of ``dtype`` stores them (slab rows, checkpoint and
    export files)."""
    return np.dtype(STORAGE[dtype]).itemsize * dim


def stored_state(template: dict[str, np.ndarray], state_dtype: str) -> dict[str, np.ndarray]:
    """An optimizer's fresh state rows (float32, and Adam's int64 step counts) as a table whose
    ``state_dtype`` is given stores them: its float arrays rounded to that type."""
    stored = STORAGE[state_dtype]
    return {name: encode(arr, stored) if arr.dtype == np.float32 else arr for name, arr in template.items()}


def write_rounded(values: np.ndarray, rows: np.ndarray, new: np.ndarray) -> None:
    """``values[rows] = new`` (float32 rows, or any rows of another dtype, such as Adam's int64
    step counts, as they are), rounded to ``values``' type and saturated at its largest finite
    value."""
    values[rows] = encode(new, values.dtype.type) if values.dtype.type in _ROUNDED else new


def as_stored(rows: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``rows`` as a table of ``dtype`` would store them (rounded), as float32: what an
    unknown key's initial row reads, the row a push admitting it stores."""
    return rows if dtype == "float32" else decode(encode(rows, STORAGE[dtype]))


def read_rows(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]`` as float32 (a copy)."""
    if values.dtype == np.float32:
        return values[rows]
    out = np.empty((rows.shape[0], *values.shape[1:]), np.float32)
    gather_decoded(values, rows, out)
    return out


def update_rows(
    values: np.ndarray, state: dict[str, np.ndarray], rows: np.ndarray, ordered: bool, kernel: RowKernel
) -> None:
    """Run ``kernel`` on the float32 copy of the stored ``rows`` (repeats allowed unless
    ``ordered``, which says no two positions share a row) and their optimizer state, then write
    them back (values rounded). The kernel sees each distinct row once, at local ids."""
    if ordered:
        distinct, local = rows, np.arange(rows.shape[0], dtype=np.int64)
    else:
        distinct, local = np.unique(rows, return_inverse=True)
        local = local.astype(np.int64, copy=False)
    scratch = read_rows(values, distinct)
    sub = {name: read_rows(arr, distinct) if arr.dtype.type in _ROUNDED else arr[distinct] for name, arr in state.items()}
    kernel(scratch, sub, local, ordered)
    for name, arr in sub.items():
        write_rounded(state[name], distinct, arr)
    write_rounded(values, distinct, scratch)
