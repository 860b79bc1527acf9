"""A disk table's files in a checkpoint: the very files of a hash table (hash_files.py), one per
logical shard, written from the rows in RAM and on disk alike and read back a logical shard at a
time into the disk store, so a checkpoint of a table larger than RAM never gathers it in RAM.

Because the files are a hash table's, a disk table's checkpoint loads onto any cluster size, and
aps-serve reads its base and delta exports as it reads any hash table's. A base or delta save
selects keys as a hash table's does; once it is in place, the delta scores of the rows it wrote
are reset in RAM and rewritten on disk (a base save of a big table rewrites most of its rows).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..sharding import LOGICAL_SHARDS, LogicalSharding
from ..specs import HashTable, spec_to_dict
from ..storage.hash.disk_store import DiskHashStore
from .hash_files import (
    _COUNTERS,
    _NO_KEYS,
    _PENDING,
    _ByLogical,
    _check_entries,
    _deleted_not_written,
    _logical_files,
    _restore_clocks,
    _write_npz,
)


def write_disk_table(
    directory: Path, prefix: str, store: DiskHashStore, server: int, num_servers: int, mode: str
) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """Write the logical shards ``server`` of ``num_servers`` owns, the keys a save in ``mode``
    selects (as :func:`~.hash_files.write_hash_table`); returns the manifest entry (a hash
    table's) and, for a base or delta save, what to run once the shard is in place (the written
    rows' delta scores reset in RAM and on disk, the covered deleted keys forgotten). Reads the
    store only; the caller holds its requests back."""
    hot = store.hot
    pending = _ByLogical.grouped(*hot.pending_items())
    covered = hot.deleted.keys() if mode != "full" else _NO_KEYS
    files, counts, deleted_counts, written = {}, {}, {}, []
    for shard in LogicalSharding(num_servers).logical_shards_of(server):
        keys, rows = store.logical_rows(shard)
        keep = hot.accessor.saved(rows["show"], rows["click"], rows["delta_score"], mode)
        order = np.argsort(keys[keep], kind="stable")
        shard_keys = keys[keep][order]
        arrays = {"keys": shard_keys, **{name: arr[keep][order] for name, arr in rows.items()},
                  **dict(zip(_PENDING, pending.part(shard)))}
        if mode == "delta":
            mine = covered[LogicalSharding.logical(covered) == shard]
            arrays["deleted_keys"] = _deleted_not_written(mine, shard_keys)
            deleted_counts[str(shard)] = int(arrays["deleted_keys"].shape[0])
        files[str(shard)] = f"{prefix}.l{shard:04d}.npz"
        counts[str(shard)] = int(shard_keys.shape[0])
        written.append(shard_keys)
        _write_npz(directory / files[str(shard)], arrays)
    entry = {
        "spec": spec_to_dict(store.spec), "kind": "hash", "mode": mode, "step": hot.step, "pushes": hot.pushes, "day": hot.day,
        "logical_shards": LOGICAL_SHARDS, "files": files, "keys": counts,
        **({"deleted": deleted_counts} if mode == "delta" else {}), **{name: int(getattr(hot, name)) for name in _COUNTERS},
    }
    if mode == "full":
        return entry, None
    return entry, lambda: store.after_save(np.concatenate(written), covered)


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
