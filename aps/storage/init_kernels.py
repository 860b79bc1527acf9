"""Deterministic, placement-independent initialisation of table values.

Why counter-based: a value must depend only on *what* it is (table seed, row id, column — or flat
index for dense tables), never on *where* it is stored. Then a table initialised over 1, 2 or 7
pservers is bit-for-bit the same table, a re-sharded checkpoint agrees with a fresh start, and no
part of a table can end up initialised differently from the rest (the reference's "one column
stuck at zero" bug). A sequential RNG consumed shard by shard cannot promise that; a hash of the
element's coordinates (splitmix64's finaliser, chained) can, and it parallelises trivially.

The table name is folded into the seed by :func:`table_seed`, so two tables that both use the
default ``seed=0`` still get different values. A dense table's flat element ``i`` is addressed as
(row ``i >> 1``, column ``i & 1``) so that Normal's Box-Muller pairs work the same way in both.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba import njit

from ..mixer import mix64
from ..specs import Constant, Initializer, Normal, Uniform

# initializer kinds understood by the kernels
_UNIFORM = 0
_NORMAL = 1
_CONSTANT = 2

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROW_SALT = np.uint64(0xD1B54A32D192ED03)
_COL_SALT = np.uint64(0x8CB92BA72F3D8DD7)
_STREAM_SALT = np.uint64(0xA0761D6478BD642F)
_S11 = np.uint64(11)
_INV_2_53 = 1.0 / 9007199254740992.0
_TWO_PI = 6.283185307179586


def table_seed(name: str, seed: int) -> int:
    """The 64-bit kernel seed of table ``name`` with user seed ``seed``.

    A cryptographic digest (not ``hash()``, which is salted per process) so every process of the
    cluster derives the same value, and distinct (name, seed) pairs do not collide in practice.
    """
    digest = hashlib.blake2b(f"{name}\0{int(seed)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


#: splitmix64's finaliser (aps/mixer.py), also hash tables' probe start and admission draws
_mix = mix64


@njit(cache=True, nogil=True, inline="always")
def _row_key(seed: np.uint64, row: np.uint64) -> np.uint64:
    """The hash state after absorbing (seed, row): computed once per row, shared by its columns."""
    h = _mix(seed + _GOLDEN)
    return _mix(h ^ (row * _ROW_SALT + _GOLDEN))


@njit(cache=True, nogil=True, inline="always")
def _uniform(row_key: np.uint64, col: np.uint64, stream: np.uint64) -> float:
    """A uniform float64 in [0, 1) that depends only on (seed, row), column and stream."""
    h = _mix(row_key ^ (col * _COL_SALT + _GOLDEN))
    h = _mix(h ^ (stream * _STREAM_SALT + _GOLDEN))
    return (h >> _S11) * _INV_2_53


@njit(cache=True, nogil=True)
def key_uniform(seed: np.uint64, key: np.int64, counter: np.uint64) -> float:
    """A uniform float64 in [0, 1) that depends only on (seed, key, counter): a stateless draw
    per key and occasion (a hash table's admission), from a stream no initial value uses."""
    return _uniform(_row_key(seed, np.uint64(key)), counter, np.uint64(2))


@njit(cache=True, nogil=True, inline="always")
def _uniform_value(a: float, b: float, top: np.float32, row_key: np.uint64, col: int) -> np.float32:
    """Uniform(a, b) as float32, clamped to ``top`` because float32 rounding may reach ``b``."""
    v = np.float32(a + (b - a) * _uniform(row_key, np.uint64(col), np.uint64(0)))
    return top if v > top else v


@njit(cache=True, nogil=True, inline="always")
def _normal_pair(a: float, b: float, row_key: np.uint64, pair: int) -> tuple[float, float]:
    """Box-Muller: two independent N(a, b^2) values for columns (2 pair, 2 pair + 1).

    Sharing one (u1, u2) draw between a column pair halves the transcendental work while every
    value still depends only on its own (seed, row, column).
    """
    u1 = _uniform(row_key, np.uint64(pair), np.uint64(0))
    u2 = _uniform(row_key, np.uint64(pair), np.uint64(1))
    radius = b * np.sqrt(-2.0 * np.log(1.0 - u1))  # 1 - u1 is in (0, 1]: finite log
    angle = _TWO_PI * u2
    return a + radius * np.cos(angle), a + radius * np.sin(angle)


@njit(cache=True, nogil=True, inline="always")
def _init_row(kind: int, a: float, b: float, top: np.float32, seed: np.uint64, key: np.int64, out: np.ndarray, i: int) -> None:
    """Write the initial value of row ``key`` (any int64, taken by bit pattern) into ``out[i]``:
    the one body behind fixed tables' row ids and hash tables' keys."""
    dim = out.shape[1]
    if kind == _CONSTANT:
        out[i, :] = a
        return
    h = _row_key(seed, np.uint64(key))
    if kind == _UNIFORM:
        for c in range(dim):
            out[i, c] = _uniform_value(a, b, top, h, c)
    else:
        for p in range((dim + 1) // 2):
            z0, z1 = _normal_pair(a, b, h, p)
            out[i, 2 * p] = z0
            if 2 * p + 1 < dim:
                out[i, 2 * p + 1] = z1


@njit(cache=True, nogil=True)
def _init_rows(kind: int, a: float, b: float, top: np.float32, seed: np.uint64, ids: np.ndarray, out: np.ndarray) -> None:
    for i in range(ids.shape[0]):
        _init_row(kind, a, b, top, seed, ids[i], out, i)


@njit(cache=True, nogil=True)
def _init_rows_at(kind: int, a: float, b: float, top: np.float32, seed: np.uint64, keys: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    for i in range(keys.shape[0]):
        _init_row(kind, a, b, top, seed, keys[i], out, rows[i])


@njit(cache=True, nogil=True)
def _init_flat(kind: int, a: float, b: float, top: np.float32, seed: np.uint64, start: int, out: np.ndarray) -> None:
    """Dense element ``i`` is (row ``i >> 1``, column ``i & 1``) of the same scheme as sparse rows."""
    stop = start + out.shape[0]
    if kind == _CONSTANT:
        out[:] = a
        return
    if kind == _UNIFORM:
        for i in range(start, stop):
            out[i - start] = _uniform_value(a, b, top, _row_key(seed, np.uint64(i >> 1)), i & 1)
        return
    for row in range(start >> 1, ((stop - 1) >> 1) + 1):
        z0, z1 = _normal_pair(a, b, _row_key(seed, np.uint64(row)), 0)
        if 2 * row >= start:
            out[2 * row - start] = z0
        if 2 * row + 1 < stop:
            out[2 * row + 1 - start] = z1


def _params(init: Initializer) -> tuple[int, float, float, np.float32]:
    """(kind, a, b, top) for the kernels; ``top`` is the largest float32 below a Uniform's high."""
    if isinstance(init, Uniform):
        low, high = float(init.low), float(init.high)
        top = np.float32(high)
        if high > low:
            top = np.nextafter(top, np.float32(low))
            top = max(top, np.float32(low))
        return _UNIFORM, low, high, np.float32(top)
    if isinstance(init, Normal):
        return _NORMAL, float(init.mean), float(init.std), np.float32(0.0)
    if isinstance(init, Constant):
        return _CONSTANT, float(init.value), 0.0, np.float32(0.0)
    raise TypeError(f"unknown initializer {init!r}")


def init_sparse_rows(init: Initializer, seed: int, global_ids: np.ndarray, dim: int) -> np.ndarray:
    """Initial values of the rows ``global_ids`` (int64) of a ``dim``-wide table, as float32[n, dim].

    ``seed`` is the table's kernel seed from :func:`table_seed` (name already folded in).
    """
    ids = np.ascontiguousarray(global_ids, dtype=np.int64)
    out = np.empty((ids.shape[0], int(dim)), dtype=np.float32)
    if out.size:
        kind, a, b, top = _params(init)
        _init_rows(kind, a, b, top, np.uint64(seed), ids, out)
    return out


def init_key_rows(init: Initializer, seed: int, keys: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """Write the initial value of each key ``keys[i]`` into ``out[rows[i]]`` (a hash table's slab).

    A key's row is the row a fixed table would give id ``key`` (negative keys by bit pattern),
    so a key evicted and admitted again, or held by another pserver, starts from the same values.
    Written in place: no temporary the size of the batch."""
    if keys.shape[0]:
        kind, a, b, top = _params(init)
        _init_rows_at(kind, a, b, top, np.uint64(seed), keys, rows, out)


def init_dense(init: Initializer, seed: int, start: int, stop: int) -> np.ndarray:
    """Initial values of flat elements ``[start, stop)`` of a dense table, as float32[stop - start]."""
    if not 0 <= start <= stop:
        raise ValueError(f"bad dense range [{start}, {stop})")
    out = np.empty(stop - start, dtype=np.float32)
    if out.size:
        kind, a, b, top = _params(init)
        _init_flat(kind, a, b, top, np.uint64(seed), int(start), out)
    return out
