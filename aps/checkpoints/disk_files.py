"""A disk table's files in a checkpoint, two ways.

A full save (a checkpoint to resume from) is a snapshot: the rows in RAM in one file (with which
of them have a copy on disk, and whether it is stale) and RocksDB's checkpoint of the rows on
disk, its files hard-linked: written in about the time the rows in RAM take, however big the
table. Loaded on the same cluster size, the new shard's database starts from those files (linked
again) and its rows in RAM are put back; on another size, each new shard reads its logical
shards' rows out of the old shards' snapshots (opened read-only), a key in an old shard's RAM
taking that row over its copy on disk. The manifest entry's kind is ``hash_disk``.

A base or delta save (an export) writes the very files of a hash table (hash_files.py), one per
logical shard, read from RAM and disk alike, so aps-serve reads them as it reads any hash
table's; it selects keys as a hash table's does, and once it is in place the delta scores of the
rows it wrote are reset in RAM and rewritten on disk (a base save of a big table rewrites most
of its rows). Such files also load into a disk table (a base and its deltas).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import npyio
from ..errors import ConfigError
from ..sharding import LOGICAL_SHARDS, LogicalSharding
from ..specs import HashTable, spec_to_dict
from ..storage.hash.cold import ColdRows
from ..storage.hash.disk_store import DiskHashStore
from .hash_files import (
    _COUNTERS,
    _NO_KEYS,
    _PENDING,
    LogicalFiles,
    _check_entries,
    _logical_files,
    _restore_clocks,
)


def write_disk_table(
    directory: Path, prefix: str, store: DiskHashStore, server: int, num_servers: int, mode: str, rows_as: str = "stored"
) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """Write the logical shards ``server`` of ``num_servers`` owns, the keys a save in ``mode``
    selects, their rows written as ``rows_as`` (as :func:`~.hash_files.write_hash_table`);
    returns the manifest entry (a hash table's) and, for a base or delta save, what to run once
    the shard is in place (the written rows' delta scores reset in RAM and on disk, the covered
    deleted keys forgotten). Reads the store only; the caller holds its requests back."""
    hot = store.hot
    files, written = LogicalFiles(directory, prefix, hot, mode, rows_as), []
    for shard, keys, rows in store.logical_rows(LogicalSharding(num_servers).logical_shards_of(server)):
        keep = hot.accessor.saved(rows["show"], rows["click"], rows["delta_score"], mode)
        order = np.argsort(keys[keep], kind="stable")
        files.write(shard, keys[keep][order], {name: arr[keep][order] for name, arr in rows.items()})
        written.append(keys[keep][order])
    entry = files.entry(store.spec)
    if mode == "full":
        return entry, None
    return entry, lambda: store.after_save(np.concatenate(written), files.covered)


def load_disk_table(
    spec: HashTable, sources: dict[int, tuple[Path, dict[str, Any]]], saved_servers: int, shard: int, num_shards: int,
    data_dir: Path | None,
) -> DiskHashStore:
    """Server ``shard`` of ``num_shards``'s part of a saved hash table, as a disk table whose
    files go under ``data_dir`` (``sources`` as for :func:`~.hash_files.load_hash_table`)."""
    if data_dir is None:
        raise ConfigError(f"checkpoint: table {spec.name!r} is a disk table, and this reader has no data directory for it")
    saved, now = LogicalSharding(saved_servers), LogicalSharding(num_shards)
    _check_entries(spec, sources, saved)
    store = DiskHashStore(spec, data_dir)
    for _directory, arrays in _logical_files(store.hot, sources, saved, now, shard):
        store.restore(arrays["keys"], arrays, (arrays["pending_keys"], arrays["pending_counts"]))
    _restore_clocks(store.hot, sources, saved, now, shard)
    return store


def apply_disk_delta(
    store: DiskHashStore, sources: dict[int, tuple[Path, dict[str, Any]]], saved_servers: int, shard: int, num_shards: int
) -> None:
    """Put a delta save's part of ``store``'s table over it (as
    :func:`~.hash_files.apply_hash_delta`): the keys it lists as deleted go, each saved key's row
    replaces the one held, in RAM or on disk, or is added; the admission counters and the clocks
    and counts become the delta's."""
    saved, now = LogicalSharding(saved_servers), LogicalSharding(num_shards)
    _check_entries(store.spec, sources, saved)
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    names = list(store.hot.slab_arrays())
    for _directory, arrays in _logical_files(store.hot, sources, saved, now, shard):
        store.delete_keys(np.concatenate([arrays["deleted_keys"], arrays["keys"]]))  # counts: the delta's, below
        store.restore(arrays["keys"], {name: arrays[name] for name in names}, (_NO_KEYS, _NO_KEYS))
        pending.append((arrays["pending_keys"], arrays["pending_counts"]))
    store.hot.replace_pending(np.concatenate([k for k, _ in pending]), np.concatenate([c for _, c in pending]))
    _restore_clocks(store.hot, sources, saved, now, shard)


#: the manifest entry kind of a disk table's snapshot (a full save)
SNAPSHOT_KIND = "hash_disk"
#: what a snapshot's file of rows in RAM holds beside the rows by name
_HOT_EXTRA = ("keys", "in_cold", "dirty", *_PENDING)


def write_disk_snapshot(directory: Path, prefix: str, store: DiskHashStore) -> dict[str, Any]:
    """A full save of ``store``: its rows in RAM (``<prefix>.hot.npz``) and a snapshot of its rows
    on disk (``<prefix>.rows``); returns the manifest entry."""
    hot = store.hot
    keys, rows, in_cold, dirty = store.hot_rows()
    pending_keys, pending_counts = hot.pending_items()
    files = {"hot_file": f"{prefix}.hot.npz", "rows_dir": f"{prefix}.rows"}
    npyio.write_npz(directory / files["hot_file"], {"keys": keys, **rows, "in_cold": in_cold, "dirty": dirty,
                                                "pending_keys": pending_keys, "pending_counts": pending_counts})
    store.cold.snapshot(directory / files["rows_dir"])
    return {
        "spec": spec_to_dict(store.spec), "kind": SNAPSHOT_KIND, "mode": "full", "step": hot.step, "pushes": hot.pushes,
        "day": hot.day, "logical_shards": LOGICAL_SHARDS, **files, "keys": len(store), "hot_keys": int(keys.shape[0]),
        "cold_keys": store.cold_keys, **{name: int(getattr(hot, name)) for name in _COUNTERS},
    }


def load_disk_snapshot(
    spec: HashTable, sources: dict[int, tuple[Path, dict[str, Any]]], saved_servers: int, shard: int, num_shards: int,
    data_dir: Path | None,
) -> DiskHashStore:
    """Server ``shard`` of ``num_shards``'s part of a disk table's snapshots (``sources`` as for
    :func:`~.hash_files.load_hash_table`), as a disk table under ``data_dir`` (the module's note)."""
    if data_dir is None:
        raise ConfigError(f"checkpoint: table {spec.name!r} is a disk table's snapshot, and this reader has no data directory for it")
    saved, now = LogicalSharding(saved_servers), LogicalSharding(num_shards)
    if saved == now:
        directory, entry = sources[shard]
        store = DiskHashStore(spec, data_dir, snapshot=_rows_dir(directory, entry))
        hot = _read_hot(directory, entry, store)
        rows = {name: hot[name] for name in store.hot.slab_arrays()}
        store.install_hot(hot["keys"], rows, hot["in_cold"], hot["dirty"], (hot["pending_keys"], hot["pending_counts"]),
                          int(entry["cold_keys"]))
    else:
        store = DiskHashStore(spec, data_dir)
        mine = now.logical_shards_of(shard)
        for index, (directory, entry) in sorted(sources.items()):
            logicals = [logical for logical in mine if saved.server_of(logical) == index]
            if logicals:
                _take_logical_shards(store, directory, entry, logicals)
    _restore_clocks(store.hot, sources, saved, now, shard)
    return store


def _take_logical_shards(store: DiskHashStore, directory: Path, entry: dict[str, Any], logicals: list[int]) -> None:
    """Put the rows of ``logicals`` from one old shard's snapshot into ``store``: those it held in
    RAM first (over their copies on disk), then its rows on disk, record for record."""
    hot = _read_hot(directory, entry, store)
    names = list(store.hot.slab_arrays())
    hot_logical = LogicalSharding.logical(hot["keys"])
    pending_logical = LogicalSharding.logical(hot["pending_keys"])
    at = np.isin(hot_logical, logicals)
    mine = np.isin(pending_logical, logicals)
    store.restore(hot["keys"][at], {name: hot[name][at] for name in names}, (hot["pending_keys"][mine], hot["pending_counts"][mine]))
    held_in_ram = np.sort(hot["keys"][at])
    cold = ColdRows(_rows_dir(directory, entry), store.hot.row_nbytes, 1 << 20, read_only=True)
    try:
        for logical in logicals:
            for keys, records in cold.walk(logical):
                fresh = ~np.isin(keys, held_in_ram, assume_unique=True)
                store.put_records(keys[fresh], records[fresh])
    finally:
        cold.close()


def _rows_dir(directory: Path, entry: dict[str, Any]) -> Path:
    rows = directory / str(entry.get("rows_dir"))
    if not (rows / "CURRENT").is_file():
        raise ConfigError(f"checkpoint {directory}: {rows.name} is not a snapshot of a disk table's rows")
    return rows


def _read_hot(directory: Path, entry: dict[str, Any], store: DiskHashStore) -> dict[str, np.ndarray]:
    """One snapshot's rows in RAM, checked against ``store``'s row shapes and dtypes."""
    file = str(entry.get("hot_file"))
    try:
        with npyio.load(directory / file) as saved:
            arrays = npyio.members(saved, saved.files)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"checkpoint {directory}: cannot read {file}: {exc}") from exc
    expected = {*store.hot.slab_arrays(), *_HOT_EXTRA}
    if set(arrays) != expected:
        raise ConfigError(f"checkpoint {directory}: {file} holds arrays {sorted(arrays)}, expected {sorted(expected)}")
    count = arrays["keys"].shape[0]
    for name, target in store.hot.slab_arrays().items():
        if arrays[name].shape != (count, *target.shape[1:]) or arrays[name].dtype != target.dtype:
            raise ConfigError(f"checkpoint {directory}: {file} {name} is {arrays[name].dtype}{list(arrays[name].shape)}, "
                              f"expected {count} rows of {target.dtype}{list(target.shape[1:])}")
    return arrays
