"""Checking and normalising what a caller hands the client, before anything is sent.

Every mistake here is the caller's, so each is a :class:`ConfigError` that names the table and
what was expected; what passes comes back in the one form the wire sends (contiguous int64 ids,
float32 rows), so the rest of the client never converts again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..sharding import UNSHARDED
from ..specs import DenseTable, HashTable, SparseTable, TableSpec
from ..validate import count, seconds


def addresses_of(addresses: Sequence[str] | str) -> list[str]:
    """The pserver addresses as a list of ``host:port`` (a string may list them with commas)."""
    if isinstance(addresses, str):
        addresses = [a for a in addresses.split(",") if a]
    if not addresses:
        raise ConfigError("connect() needs at least one pserver address")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"pserver address must be host:port, got {address!r}")
    return list(addresses)


def check_timing(*, timeout: float | None, retries: int, backoff: float, deadline: float, heartbeat: float) -> None:
    """The client's time and retry settings, each a number that makes sense (ConfigError names
    the one that does not): a typo'd ``deadline=-1`` must not turn into "never retry"."""
    seconds("timeout", timeout, None, none="no limit")
    count("retries", retries, zero="no retry")
    seconds("backoff", backoff, "retry at once")
    seconds("deadline", deadline, "no retry")
    seconds("heartbeat", heartbeat, "no heartbeat")


_INT64 = np.dtype(np.int64)


def check_access(spec: TableSpec, by_ids: bool) -> None:
    """Refuse a call that reads or writes table ``spec`` by ids (the sparse calls,
    ``by_ids=True``) when the table is pulled and pushed whole (a dense table), and the reverse:
    the error says which calls the table takes."""
    if spec.by_ids != by_ids:
        held = "sparse" if spec.by_ids else "dense"
        raise ConfigError(f"table {spec.name!r} is {held}; use the {held} calls")


def sparse_ids(spec: SparseTable | HashTable, ids: Any) -> np.ndarray:
    """``ids`` as contiguous int64, each in the table's range (a hash table's keys: any int64;
    unsigned 64-bit feature signs keep their bit pattern)."""
    if type(ids) is np.ndarray and ids.dtype == _INT64 and ids.ndim == 1 and ids.flags.c_contiguous:
        arr = ids  # already the wire's form (the usual case): nothing to convert
    else:
        arr = np.asarray(ids)
        if arr.ndim != 1 or not (arr.dtype.kind in "iu" or arr.size == 0):
            raise ConfigError(f"table {spec.name!r}: ids must be a 1-d integer array, got {arr.dtype} {arr.shape}")
        arr = np.ascontiguousarray(arr.view(np.int64) if arr.dtype == np.uint64 else arr, dtype=np.int64)
    if spec.keyed:
        return arr
    bad = UNSHARDED.first_bad_id(arr, spec.rows, 0)  # the whole table: any id in range
    if bad >= 0:
        raise ConfigError(f"table {spec.name!r}: id {int(arr[bad])} not in [0, {spec.rows})")
    return arr


def _floats(table: str, arr: np.ndarray) -> None:
    if arr.dtype.kind != "f":
        raise ConfigError(f"table {table!r}: values must be floating point, got {arr.dtype}")


def occurrence_counts(spec: SparseTable | HashTable, ids: np.ndarray, what: str, values: Any) -> np.ndarray | None:
    """A hash table push's ``shows`` or ``clicks``: None, or float32, one per id."""
    if values is None:
        return None
    if not spec.keyed:
        raise ConfigError(f"table {spec.name!r}: {what} are for hash tables (aps.HashTable) only")
    arr = np.asarray(values)
    if arr.shape != (len(ids),):
        raise ConfigError(f"table {spec.name!r}: {what} must have shape ({len(ids)},), got {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise ConfigError(f"table {spec.name!r}: {what} must be numbers, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def sparse_rows(spec: SparseTable | HashTable, ids: np.ndarray, values: Any) -> np.ndarray:
    """``values`` as contiguous float32, one row of the table's width per id."""
    arr = np.asarray(values)
    if arr.shape != (len(ids), spec.dim):
        raise ConfigError(f"table {spec.name!r}: values must have shape ({len(ids)}, {spec.dim}), got {arr.shape}")
    _floats(spec.name, arr)
    return np.ascontiguousarray(arr, dtype=np.float32)


def dense_values(spec: DenseTable, values: Any) -> np.ndarray:
    """``values`` (the table's shape, or flat with its size) as flat contiguous float32."""
    arr = np.asarray(values)
    if arr.size != spec.size or (arr.shape != spec.shape and arr.ndim != 1):
        raise ConfigError(f"table {spec.name!r}: values must have shape {spec.shape}, got {arr.shape}")
    _floats(spec.name, arr)
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
