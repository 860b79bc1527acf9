"""Give the memory pages of part of a numpy array back to the OS (``madvise(MADV_DONTNEED)``),
or make the OS map a fresh array's pages now (:func:`fault_in_zeros`).

Why: a hash index resizes by draining an old slot array into a new one in pieces; until the
last piece, both arrays were resident, so a table at its ``max_keys`` cap briefly held its index
twice (32 MiB more at 1 M keys) every time tombstones forced a resize. The drained part of the
old array is never read again (probes skip it), so its pages can go back as the drain passes
them. After this call the pages read as zeros if touched; only whole pages inside the array
are given back, never memory beyond it.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys

import numpy as np
from numba import njit

_PAGE = mmap.PAGESIZE
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
#: arrays of at least this many bytes get a mapping of their own (:func:`lazy_zeros`)
LAZY_MIN_BYTES = 1 << 20


def lazy_zeros(shape: int | tuple[int, ...], dtype: np.typing.DTypeLike) -> np.ndarray:
    """Zeros whose pages the OS maps only when they are first written: for a large array, an
    anonymous mapping of its own (freed with the array). ``np.zeros`` is no such promise: glibc
    serves even a large ``calloc`` from freed heap memory when earlier frees left a free region
    that big, clears it, and the whole array is resident at once (a slab reserved for 2M rows, a
    slot array made ahead, seen in a test process that had run others first)."""
    dtype = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(dims) * dtype.itemsize
    if nbytes < LAZY_MIN_BYTES:
        return np.zeros(dims, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(dims)


def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux") or _DONTNEED is None:
        return None
    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def release_pages(arr: np.ndarray, start: int, stop: int) -> int:
    """Give back the whole pages of rows ``[0, stop)`` of the C-contiguous ``arr`` that begin at
    or after row ``start`` rounded down to its page (the caller's previous ``stop``): the rows
    must never be read again unless rewritten. Returns the bytes given back (0 where the
    platform has no madvise)."""
    if _MADVISE is None or stop <= start or not arr.flags.c_contiguous:
        return 0
    row = arr.strides[0]
    base = arr.ctypes.data
    first = max(base + start * row - (base + start * row) % _PAGE, -(-base // _PAGE) * _PAGE)
    last = base + stop * row - (base + stop * row) % _PAGE
    if last <= first:
        return 0
    if _MADVISE(first, last - first, _DONTNEED) != 0:
        return 0  # a hint: memory simply stays resident
    return last - first


@njit(cache=True, nogil=True)
def _write_zero_every(flat: np.ndarray, stride: int) -> None:
    for i in range(0, flat.shape[0], stride):
        flat[i] = 0


def fault_in_zeros(arr: np.ndarray) -> None:
    """Map every page of the C-contiguous all-zero ``arr`` (a fresh ``np.zeros`` array, or rows
    of one nothing has written yet) now, by writing a zero into each page it covers (its values
    stay zeros), without the GIL. Nothing may write ``arr`` meanwhile.

    Why: ``np.zeros`` of a large array maps nothing until it is written (and numpy backs such
    arrays with transparent huge pages), so the first writes to fresh rows stop their thread
    while the kernel finds and clears memory: 3-4 ms per 2 MiB page on a 2-core VM, 0.4 s for a
    256 MiB array. A hash table's next index slot array and the slab rows its next keys take
    are written from inside requests, so a server maps them ahead in a thread
    (:meth:`HashSparseStore.reserve`) instead."""
    if arr.size:
        _write_zero_every(arr.reshape(-1).view(np.uint8), _PAGE)
