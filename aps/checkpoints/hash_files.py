"""Checkpoints of hash tables: one file per logical shard, so a load reassigns files.

A hash table's keys belong to one of :data:`~aps.sharding.LOGICAL_SHARDS` logical shards, each
held by one pserver (:class:`~aps.sharding.LogicalSharding` says which). So each pserver writes
one file per logical shard it owns, inside its own shard directory::

    shard-00001-of-00002/t0000-emb.l0001.npz   keys, values, optimizer state, show, click,
    shard-00001-of-00002/t0000-emb.l0003.npz   delta_score, last_step, last_day, the admission
    ...                                          counters (pending_keys, pending_counts), and in
                                                 a delta the keys deleted (deleted_keys)

and a load onto ``m`` pservers reads, for each logical shard ``l`` it now owns, the file
``l`` from the shard directory of the old server that held ``l``: files move whole, no key is
rehashed, and no server reads a file it will not keep. The manifest entry lists every file with its key count, so a
loader sizes the slab once and refuses a checkpoint that lacks a file or holds a different one.

Save modes (Paddle's CtrCommonAccessor): ``full`` writes every key; ``base`` the keys whose
score ``0.1 (show - click) + click`` is at least the table's ``base_threshold``; ``delta`` the
keys whose delta score is at least its ``delta_threshold``. The delta score counts the score
pushed since the key was last written by a base or delta save (or since it was admitted): those
saves reset it for the keys they wrote, and only after their shard is in place. A delta also
lists, per logical shard, the keys deleted (shrink, ``max_keys`` eviction, TTL) since the last
base or delta save whose row it does not write (``deleted_keys``, its count per logical shard
in the manifest's ``deleted``), so a reader drops them (storage/hash/deleted.py); those saves
forget the deleted keys they covered, again only once in place. Files without ``deleted_keys``
(full and base saves, deltas written before it) list none.

An export may write its rows as int8 instead (``rows_as="int8"``, for aps-serve: smaller files,
faster to copy to the serving machines): a logical shard's file then holds its keys, ``values``
as int8 codes and ``scales`` (float32, one a row), and in a delta ``deleted_keys``; no optimizer
state, statistics or admission counters, so a pserver refuses to load it (its manifest entry
says ``"rows_as": "int8"``).

Last days and steps are written in the full statistics record's dtypes (int32, int64) whatever
the table keeps, and a load gives them in its own (storage/hash/stats.py), so a table with
``stats="compact"`` and one without load each other's files.

Files are ``.npz`` written without pickle and read with ``allow_pickle=False``; the caller makes
them durable before the manifest that names them (one ``sync_tree`` for the whole shard, not an
fsync per file: 1024 fsyncs took seconds for a small table).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import npyio
from ..errors import ConfigError, ServerError
from ..sharding import LOGICAL_SHARDS, LogicalSharding
from ..specs import HashTable, spec_to_dict
from ..storage.hash.compact import decode
from ..storage.hash.slab import MIN_ROWS
from ..storage.hash.stats import STATS, as_full, as_layout
from ..storage.hash.store import HashSparseStore
from ..storage.int8_kernels import quantize

#: what the manifest keeps of a store's counters besides its keys
_COUNTERS = ("admitted", "rejected", "evicted", "pending_resets")
_PENDING = ("pending_keys", "pending_counts")
#: arrays a logical shard's file may lack: ``last_day`` (files written before keys kept it) and
#: ``deleted_keys`` (only a delta save writes it; deltas written before it list no deletions)
_OPTIONAL = frozenset({"last_day", "deleted_keys"})
_NO_KEYS = np.empty(0, np.int64)
#: threads that gather and write a table's logical shards: numpy's gathers, zlib's checksums
#: and file writes release the GIL, so two threads write a 4M-key table about 1.5x faster
#: (a save runs while nothing trains, or beside a loop that only answers requests)
SAVE_THREADS = 2


def selected(store: HashSparseStore, rows: np.ndarray, mode: str) -> np.ndarray:
    """Which of the held ``rows`` a save in ``mode`` writes (a boolean mask; the table's accessor rules)."""
    return store.accessor.saved(store.show[rows], store.click[rows], store.delta_score[rows], mode)


def _by_logical(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order sorting ``keys`` by logical shard then key, bounds of each logical shard in it).

    Sorted by key, then stably by shard as 16-bit numbers, which numpy sorts by radix: about 3x
    faster than ``np.lexsort`` on millions of keys, the same order (a save's files list keys
    ascending)."""
    logical = LogicalSharding.logical(keys)
    by_key = np.argsort(keys)
    order = by_key[np.argsort(logical[by_key].astype(np.uint16), kind="stable")]
    return order, np.searchsorted(logical[order], np.arange(LOGICAL_SHARDS + 1))


def write_hash_table(
    directory: Path, prefix: str, store: HashSparseStore, server: int, num_servers: int, mode: str = "full",
    rows_as: str = "stored",
) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """Write the logical shards ``server`` of ``num_servers`` owns; returns the manifest entry
    and, for a base or delta save, what to run once the shard is in place
    (:meth:`HashSparseStore.after_save`: the rows written start a new delta, the deleted keys
    the save covered are forgotten). ``rows_as``: what rows are written as (EXPORT_ROWS).
    Reads the store only: the caller holds its writes back meanwhile."""
    keys, rows = store.index.items()
    keep = selected(store, rows, mode)
    written = _ByLogical.grouped(keys[keep], rows[keep])
    files = LogicalFiles(directory, prefix, store, mode, rows_as)
    slab = {name: arr for name, arr in store.slab_arrays().items() if rows_as == "stored" or name == "values"}

    def write(shard: int) -> None:
        shard_keys, at = written.part(shard)
        files.write(shard, shard_keys, {name: arr[at] for name, arr in slab.items()})

    with ThreadPoolExecutor(SAVE_THREADS, thread_name_prefix="aps-save") as pool:
        for _ in pool.map(write, LogicalSharding(num_servers).logical_shards_of(server)):
            pass  # a failed shard's error is raised here
    entry = files.entry(store.spec)
    if mode == "full":
        return entry, None
    _, rows_written = written.arrays
    return entry, lambda: store.after_save(rows_written, files.covered)


class LogicalFiles:
    """A hash table's files as a save writes them, a logical shard at a time, and the manifest
    entry that lists them: what a hash table's save and a disk table's export share. ``clocks``:
    the store whose step, day, counters, admission counters and deleted keys the save records."""

    def __init__(self, directory: Path, prefix: str, clocks: HashSparseStore, mode: str, rows_as: str = "stored") -> None:
        self.directory, self.prefix, self.clocks, self.mode, self.rows_as = directory, prefix, clocks, mode, rows_as
        #: the keys deleted since the last base or delta save that this save covers
        self.covered = clocks.deleted.keys() if mode != "full" else _NO_KEYS
        self._pending = _ByLogical.grouped(*clocks.pending_items())
        self._deleted = _ByLogical.grouped(self.covered) if mode == "delta" else None
        self.files: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.deleted_counts: dict[str, int] = {}

    def write(self, shard: int, keys: np.ndarray, rows: dict[str, np.ndarray]) -> None:
        """Logical shard ``shard``'s file: ``keys`` (ascending) with their rows by name, the last
        days and steps in the full layout whatever the table keeps (storage/hash/stats.py), the
        admission counters, and for a delta the deleted keys it does not write. With int8 rows,
        the keys' values alone, as int8 codes and a scale a row (:func:`int8_values`). Threads may
        write different shards at once: each touches its own file and its own keys of the dicts."""
        if self.rows_as == "int8":
            arrays = {"keys": keys, **int8_values(rows["values"])}
        else:
            arrays = {"keys": keys, **rows, **dict(zip(_PENDING, self._pending.part(shard)))}
            clocks = self.clocks
            arrays["last_day"], arrays["last_step"] = as_full(arrays["last_day"], arrays["last_step"], clocks.day, clocks.step)
        if self._deleted is not None:
            (mine,) = self._deleted.part(shard)
            arrays["deleted_keys"] = _deleted_not_written(mine, keys)
            self.deleted_counts[str(shard)] = int(arrays["deleted_keys"].shape[0])
        self.files[str(shard)] = f"{self.prefix}.l{shard:04d}.npz"
        self.counts[str(shard)] = int(keys.shape[0])
        npyio.write_npz(self.directory / self.files[str(shard)], arrays)

    def entry(self, spec: HashTable) -> dict[str, Any]:
        """The manifest entry of the table (``spec``) once every file is written."""
        clocks = self.clocks
        return {
            "spec": spec_to_dict(spec), "kind": "hash", "mode": self.mode, "step": clocks.step, "pushes": clocks.pushes,
            "day": clocks.day, "logical_shards": LOGICAL_SHARDS, "files": _by_shard(self.files), "keys": _by_shard(self.counts),
            **({"deleted": _by_shard(self.deleted_counts)} if self._deleted is not None else {}),
            **({"rows_as": self.rows_as} if self.rows_as != "stored" else {}),
            **{name: int(getattr(clocks, name)) for name in _COUNTERS},
        }


def _by_shard(per_shard: dict[str, Any]) -> dict[str, Any]:
    """A per-shard dict in shard order, however its shards' files were written (threads)."""
    return {shard: per_shard[shard] for shard in sorted(per_shard, key=int)}


def int8_values(values: np.ndarray) -> dict[str, np.ndarray]:
    """A table's stored values (float32, float16, bfloat16's bits) as an int8 export writes them:
    ``values`` int8 codes and ``scales`` float32, one a row (storage/int8_kernels.py: each
    coordinate within half its row's scale, a zero row exactly zero)."""
    codes, scales, _ = quantize(decode(values))
    return {"values": codes, "scales": scales}


def _deleted_not_written(deleted: np.ndarray, written: np.ndarray) -> np.ndarray:
    """What a delta lists as deleted: the keys deleted since the last base or delta save whose row
    it does not write. A key deleted and admitted again is listed unless its new row is written:
    a reader's row for it is from before the deletion, which the pserver no longer holds."""
    return np.setdiff1d(deleted, written, assume_unique=True)


@dataclass(frozen=True)
class _ByLogical:
    """Some keys and the arrays that go with them, sorted by the keys' logical shard then key,
    so each logical shard's file takes one slice of each."""

    arrays: tuple[np.ndarray, ...]
    bounds: np.ndarray

    @classmethod
    def grouped(cls, keys: np.ndarray, *others: np.ndarray) -> _ByLogical:
        order, bounds = _by_logical(keys)
        return cls(tuple(a[order] for a in (keys, *others)), bounds)

    def part(self, logical: int) -> tuple[np.ndarray, ...]:
        """Each array's slice for logical shard ``logical``."""
        lo, hi = self.bounds[logical], self.bounds[logical + 1]
        return tuple(a[lo:hi] for a in self.arrays)


def load_hash_table(
    spec: HashTable, sources: dict[int, tuple[Path, dict[str, Any]]], saved_servers: int, shard: int, num_shards: int,
    key_limit: int | None = None,
) -> HashSparseStore:
    """Server ``shard`` of ``num_shards``'s part of a saved hash table.

    ``sources``: old server index -> (its shard directory, its manifest entry for the table),
    for the old servers that held the logical shards this one now owns.
    ``key_limit``: keys a size budget lets this server hold (None: only ``max_keys``)."""
    saved, now = LogicalSharding(saved_servers), LogicalSharding(num_shards)
    _check_entries(spec, sources, saved)
    total = sum(int(sources[saved.server_of(l)][1]["keys"][str(l)]) for l in now.logical_shards_of(shard))
    store = HashSparseStore(spec, max(total, spec.max_keys or MIN_ROWS), key_limit=key_limit)
    if total > store.key_limit:
        raise ConfigError(
            f"checkpoint: hash table {spec.name!r} has {total} keys for server {shard} of {num_shards}, more than the "
            f"{store.key_limit} it may hold (max_keys per shard, aps-server --max-table-bytes); load onto more pservers"
        )
    for directory, arrays in _logical_files(store, sources, saved, now, shard):
        try:
            store.restore(arrays["keys"], arrays, (arrays["pending_keys"], arrays["pending_counts"]))
        except ServerError as exc:
            raise ConfigError(f"checkpoint {directory}: {exc.message}") from None
    _restore_clocks(store, sources, saved, now, shard)
    return store


def apply_hash_delta(
    store: HashSparseStore, sources: dict[int, tuple[Path, dict[str, Any]]], saved_servers: int, shard: int, num_shards: int
) -> None:
    """Put a delta save's part of ``store``'s table (server ``shard`` of ``num_shards``'s) over
    it: the keys it lists as deleted (``deleted_keys``) go, each saved key's row replaces the
    one held (or is added), the admission counters and the clocks and counts become the
    delta's. ``sources`` as for :func:`load_hash_table`. Other keys keep their rows; a delta
    written before deletions were recorded lists none."""
    saved, now = LogicalSharding(saved_servers), LogicalSharding(num_shards)
    _check_entries(store.spec, sources, saved)
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    for directory, arrays in _logical_files(store, sources, saved, now, shard):
        store.delete_keys(arrays["deleted_keys"])  # counted as evicted until the delta's counts replace them below
        rows = store.index.lookup(arrays["keys"])
        held = rows >= 0
        for name, arr in store.slab_arrays().items():
            arr[rows[held]] = arrays[name][held]
        if not held.all():
            try:
                store.restore(arrays["keys"][~held], {n: arrays[n][~held] for n in store.slab_arrays()}, (_NO_KEYS, _NO_KEYS))
            except ServerError as exc:
                raise ConfigError(f"checkpoint {directory}: {exc.message}") from None
        pending.append((arrays["pending_keys"], arrays["pending_counts"]))
    store.replace_pending(np.concatenate([k for k, _ in pending]), np.concatenate([c for _, c in pending]))
    _restore_clocks(store, sources, saved, now, shard)


def _logical_files(
    store: HashSparseStore, sources: dict[int, tuple[Path, dict[str, Any]]], saved: LogicalSharding, now: LogicalSharding,
    shard: int,
) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    """(directory, checked arrays) of each logical shard, saved under the ``saved`` sharding,
    that server ``shard`` owns ``now``. Last days and steps of either statistics layout are
    checked in the full layout's dtypes and given in the table's, for the day it will have
    (:func:`_restore_clocks`; storage/hash/stats.py)."""
    names = {"keys", *store.slab_arrays(), *_PENDING, "deleted_keys"}
    day = max(int(e.get("day", 0)) for _, e in sources.values())
    for l in now.logical_shards_of(shard):
        directory, entry = sources[saved.server_of(l)]
        file = entry["files"][str(l)]
        arrays = _read_logical(directory, file, names, int(entry.get("day", 0)))
        arrays["last_day"], arrays["last_step"] = as_full(arrays["last_day"], arrays["last_step"], int(entry.get("day", 0)),
                                                          int(entry["step"]))
        _check_logical(directory, file, store, arrays, int(entry["keys"][str(l)]), l)
        _check_deleted(directory, file, arrays["deleted_keys"], entry.get("deleted", {}).get(str(l)), l)
        arrays["last_day"], arrays["last_step"] = as_layout(store.stats.dtype, arrays["last_day"], arrays["last_step"], day)
        yield directory, arrays


def _check_entries(spec: HashTable, sources: dict[int, tuple[Path, dict[str, Any]]], saved: LogicalSharding) -> None:
    """Each saved server's entry lists one file for each logical shard it owned."""
    for index, (directory, entry) in sources.items():
        if entry.get("rows_as", "stored") != "stored":
            raise ConfigError(
                f"checkpoint {directory}: hash table {spec.name!r} was exported with {entry['rows_as']} rows, values only, for "
                "aps-serve: a pserver loads a full checkpoint or an export with the rows as stored"
            )
        owned = {str(l) for l in saved.logical_shards_of(index)}
        if entry.get("logical_shards") != LOGICAL_SHARDS or set(entry.get("files", ())) != owned or set(entry.get("keys", ())) != owned:
            raise ConfigError(
                f"checkpoint {directory}: hash table {spec.name!r} does not list one file for each of the "
                f"{len(owned)} logical shards (of {LOGICAL_SHARDS}) that server {index} of {saved.num_servers} owns"
            )


def _restore_clocks(
    store: HashSparseStore, sources: dict[int, tuple[Path, dict[str, Any]]], saved: LogicalSharding, now: LogicalSharding,
    shard: int,
) -> None:
    """The saved day, step, push counter and counts (admitted, ...) for server ``shard``."""
    # every pserver counts the same days (each shrink reaches all): the latest, even resharded
    store.day = max(int(e.get("day", 0)) for _, e in sources.values())
    if saved == now:  # the same server's clocks and counters
        own = sources[shard][1]
        store.step, store.pushes = int(own["step"]), int(own["pushes"])
        for name in _COUNTERS:
            setattr(store, name, int(own[name]))
    else:  # resharded: the latest clocks (as fixed tables' steps)
        store.step = max(int(e["step"]) for _, e in sources.values())
        store.pushes = max(int(e["pushes"]) for _, e in sources.values())
        # old server i's counters go whole with its first logical shard, i, to the new server
        # that holds it: summed over the new servers they are the old totals, none lost or
        # counted twice (sources holds every old server when the cluster size changes, load_shards)
        for name in _COUNTERS:
            setattr(store, name, sum(int(e[name]) for i, (_, e) in sources.items() if now.server_of(i) == shard))


def _read_logical(directory: Path, file: str, names: set[str], day: int) -> dict[str, np.ndarray]:
    """One logical shard's arrays by name. A file written before keys kept their last day has no
    ``last_day``: its keys count as seen on the saved ``day`` (the manifest's, 0 when absent).
    One without ``deleted_keys`` (a full or base save, or a delta from before deletions were
    recorded) lists none."""
    try:
        with npyio.load(directory / file) as saved:
            if not names - _OPTIONAL <= set(saved.files) <= names:
                raise ConfigError(f"checkpoint {directory}: {file} holds arrays {sorted(saved.files)}, expected {sorted(names)}")
            arrays = npyio.members(saved, saved.files)
            if "last_day" not in arrays:
                arrays["last_day"] = np.full(arrays["keys"].shape, day, np.int32)
            arrays.setdefault("deleted_keys", _NO_KEYS)
            return arrays
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # absent, truncated, not an npz
        raise ConfigError(f"checkpoint {directory}: cannot read {file}: {exc}") from exc


def _check_logical(
    directory: Path, file: str, store: HashSparseStore, arrays: dict[str, np.ndarray], count: int, logical: int
) -> None:
    """Each array of one logical shard's file has the manifest's key count and the table's
    row shape and dtype, and every key belongs to that logical shard."""
    keys = arrays["keys"]
    if keys.dtype != np.int64 or keys.shape != (count,):
        raise ConfigError(f"checkpoint {directory}: {file} keys are {keys.dtype}{list(keys.shape)}, expected {count} int64")
    for name, target in store.slab_arrays().items():
        a = arrays[name]
        dtype = STATS[name] if name in ("last_day", "last_step") else target.dtype  # files keep the full layout's
        if a.shape != (count, *target.shape[1:]) or a.dtype != dtype:
            raise ConfigError(
                f"checkpoint {directory}: {file} {name} is {a.dtype}{list(a.shape)}, expected {count} rows of {dtype}{list(target.shape[1:])}"
            )
    pk, pc = arrays["pending_keys"], arrays["pending_counts"]
    if pk.dtype != np.int64 or pc.dtype != np.int64 or pk.ndim != 1 or pk.shape != pc.shape:
        raise ConfigError(f"checkpoint {directory}: {file} admission counters are {pk.dtype}{list(pk.shape)} and {pc.dtype}{list(pc.shape)}")
    if keys.size and not (LogicalSharding.logical(keys) == logical).all():
        raise ConfigError(f"checkpoint {directory}: {file} holds keys of another logical shard than {logical}")


def _check_deleted(directory: Path, file: str, deleted: np.ndarray, count: int | None, logical: int) -> None:
    """A logical shard's deleted keys are int64 keys of that logical shard, as many as the
    manifest says (a manifest from before deletions were recorded says nothing)."""
    if deleted.dtype != np.int64 or deleted.ndim != 1 or (count is not None and deleted.shape != (int(count),)):
        raise ConfigError(f"checkpoint {directory}: {file} deleted keys are {deleted.dtype}{list(deleted.shape)}, expected {count} int64")
    if deleted.size and not (LogicalSharding.logical(deleted) == logical).all():
        raise ConfigError(f"checkpoint {directory}: {file} lists deleted keys of another logical shard than {logical}")
