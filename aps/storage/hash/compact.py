"""Values stored in fewer bits than they are computed in (``HashTable(dtype="float16")``).

The slab keeps a float16 table's values as numpy ``float16``; everything that computes on them
(the optimizer kernels, initialisers, GEO's additions) does so in float32 on a scratch copy of the
rows a request touches, and writes them back rounded. Why this shape:

* The optimizer kernels stay the ones fixed and float32 tables run (numba has no float16 on
  CPUs), so a compact table computes exactly what a float32 one computes on the same stored
  values; only the rounding of each written row differs.
* Rounding to nearest (ties to even), numpy's cast, not stochastic rounding: it is
  deterministic, so the same pushes give the same bits on any number of pservers and after a
  reload, and the steps the CTR models take (Adagrad's and Adam's, at their rates) are many
  units in the last place of float16 at the values' scale, which is where stochastic rounding
  pays. The cost was measured (docs/concepts.md, "Compact rows").
* Values beyond float16's range saturate at +-65504 rather than becoming infinite: an
  embedding that large has diverged, and an infinity would poison every sum it enters.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: numpy's storage type for each ``HashTable.dtype``
STORAGE = {"float32": np.float32, "float16": np.float16}
#: the largest finite float16
FLOAT16_MAX = float(np.finfo(np.float16).max)

#: a float32 row kernel: ``(values, state, ids, ordered)`` over a scratch copy of the rows
RowKernel = Callable[[np.ndarray, dict[str, np.ndarray], np.ndarray, bool], None]


def storage_dtype(dtype: str) -> type:
    """The numpy type a hash table of ``dtype`` keeps its values in."""
    return STORAGE[dtype]


def value_row_nbytes(dtype: str, dim: int) -> int:
    """Bytes of one key's values as a table of ``dtype`` stores them (slab rows, checkpoint and
    export files)."""
    return np.dtype(STORAGE[dtype]).itemsize * dim


def write_rounded(values: np.ndarray, rows: np.ndarray, new: np.ndarray) -> None:
    """``values[rows] = new`` (float32 rows, changed in place), rounded to ``values``' type and
    saturated at its largest finite value."""
    if values.dtype == np.float16:
        np.clip(new, -FLOAT16_MAX, FLOAT16_MAX, out=new)
    values[rows] = new


def as_stored(rows: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``rows`` as a table of ``dtype`` would store them (rounded), as float32: what an
    unknown key's initial row reads, the row a push admitting it stores."""
    return rows if dtype == "float32" else rows.astype(STORAGE[dtype]).astype(np.float32)


def read_rows(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]`` as float32 (a copy)."""
    return values[rows].astype(np.float32)


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
    sub = {name: arr[distinct] for name, arr in state.items()}
    kernel(scratch, sub, local, ordered)
    for name, arr in sub.items():
        state[name][distinct] = arr
    write_rounded(values, distinct, scratch)
