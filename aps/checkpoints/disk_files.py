"""A disk table's files in a checkpoint: the very files of a hash table (hash_files.py), one per
logical shard, written from the rows in RAM and on disk alike and read back a logical shard at a
time into the disk store, so a checkpoint of a table larger than RAM never gathers it in RAM.

Because the files are a hash table's, a disk table's checkpoint loads onto any cluster size, as
an all-RAM hash table or a disk table, and aps-serve and the checkpoint reader read it as they
read any hash table's. Only full saves are written: a base or delta save's selection and the
reset of the delta scores after it would rewrite the rows on disk, which is not built yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, ErrorCode, ServerError
from ..sharding import LOGICAL_SHARDS, LogicalSharding
from ..specs import HashTable, spec_to_dict
from ..storage.hash.disk_store import DiskHashStore
from .hash_files import _COUNTERS, _PENDING, _ByLogical, _check_entries, _logical_files, _restore_clocks, _write_npz


def write_disk_table(directory: Path, prefix: str, store: DiskHashStore, server: int, num_servers: int, mode: str) -> dict[str, Any]:
    """Write the logical shards ``server`` of ``num_servers`` owns (a full save); returns the
    manifest entry, a hash table's. Reads the store only; the caller holds its requests back."""
    if mode != "full":
        raise ServerError(ErrorCode.BAD_REQUEST, f"table {store.name!r}: a disk table is saved whole (mode 'full'), not {mode!r}")
    hot = store.hot
    pending = _ByLogical.grouped(*hot.pending_items())
    files, counts = {}, {}
    for shard in LogicalSharding(num_servers).logical_shards_of(server):
        keys, rows = store.logical_rows(shard)
        order = np.argsort(keys, kind="stable")
        arrays = {"keys": keys[order], **{name: arr[order] for name, arr in rows.items()}, **dict(zip(_PENDING, pending.part(shard)))}
        files[str(shard)] = f"{prefix}.l{shard:04d}.npz"
        counts[str(shard)] = int(keys.shape[0])
        _write_npz(directory / files[str(shard)], arrays)
    return {
        "spec": spec_to_dict(store.spec), "kind": "hash", "mode": mode, "step": hot.step, "pushes": hot.pushes, "day": hot.day,
        "logical_shards": LOGICAL_SHARDS, "files": files, "keys": counts, **{name: int(getattr(hot, name)) for name in _COUNTERS},
    }


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
