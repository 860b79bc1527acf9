"""Each table kind's files in a checkpoint: how one server writes its shard of a table, and
how a server reads its shard back from the saved shards of any cluster size.

A :class:`TableFormat` per kind (fixed rows, dense blocks, hash keys), looked up by the class of
a store or a spec in :class:`TableFormats`: the save and load of a whole shard (shards.py) ask it
and never ``isinstance``. A new table kind's checkpoint is one subclass, added to the formats the
save and load are given.
"""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .. import npyio
from ..errors import ConfigError, ServerError
from ..sharding import DenseBlock, ModuloSharding, dense_blocks
from ..specs import DenseTable, HashTable, SparseTable, TableSpec, spec_to_dict
from ..storage.hash.disk_store import DiskHashStore, new_table_dir
from ..storage.hash.store import HashSparseStore, budget_keys
from ..storage.table_classes import ByTableClass
from ..storage.tables import DenseShard, SparseShard
from .disk_files import (
    SNAPSHOT_KIND,
    apply_disk_delta,
    load_disk_snapshot,
    load_disk_table,
    write_disk_snapshot,
    write_disk_table,
)
from .hash_files import apply_hash_delta, load_hash_table, write_hash_table


@dataclass
class SavedShard:
    """One saved shard directory of a checkpoint: its index, where it is, its manifest."""

    index: int
    directory: Path
    manifest: dict[str, Any]

    def open(self, file: str) -> np.ndarray:
        """Memory-map one saved array (read-only; only the pages we index are read)."""
        try:
            return npyio.load(self.directory / file, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"checkpoint {self.directory}: cannot read {file}: {exc}") from exc


def write_array(path: Path, array: np.ndarray) -> None:
    """Write one array; made durable with the rest of its shard by ``sync_tree`` in ``save_shard``."""
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)


#: run once the shard is in place (a base or delta save resets the delta scores it wrote and
#: forgets the deleted keys it covered)
AfterSave = Callable[[], None]


class TableFormat(ABC):
    """How one kind of table is written to and read from a checkpoint."""

    spec_type: type[TableSpec]
    store_type: type

    def nbytes(self, store: Any) -> int:
        """Bytes a save of ``store`` writes (for a progress bar)."""
        return sum(a.nbytes for a in store.state_arrays().values())

    @abstractmethod
    def write(
        self, directory: Path, prefix: str, store: Any, shard: int, num_shards: int, mode: str, progress: tqdm,
        rows_as: str = "stored",
    ) -> tuple[dict[str, Any], AfterSave | None]:
        """Write server ``shard``'s part of a table under ``directory`` (file names start with
        ``prefix``); returns its manifest entry and what to run once the shard is in place.
        ``rows_as`` (EXPORT_ROWS): what a base or delta save writes a hash table's rows as;
        fixed and dense tables are written as they are held whatever it says (aps-serve serves
        them as exported)."""

    @abstractmethod
    def load(
        self, spec: Any, saved: list[SavedShard], shard: int, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> Any:
        """Server ``shard`` of ``num_shards``'s part of a table, from every saved shard of a
        checkpoint written by ``len(saved)`` servers."""

    @abstractmethod
    def load_own(
        self, spec: Any, own: SavedShard, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> Any:
        """Server ``own.index``'s part of a table from its own saved shard alone (same cluster size)."""

    # a whole table read back as one shard (reader.py): what each kind can answer
    def as_array(self, store: Any) -> np.ndarray | None:
        """The table as one array (a fixed table's rows in id order, a dense table in its
        shape), or None when its rows have no positions (hash)."""
        return None

    def rows(self, store: Any, ids: np.ndarray) -> np.ndarray | None:
        """Rows of ``ids`` (int64), as a pull from the saving pserver answers; None for a kind
        not addressed by ids (dense)."""
        return None

    def keys(self, store: Any) -> np.ndarray | None:
        """The keys held, sorted; None for a kind without keys (fixed, dense)."""
        return None

    def apply_delta(self, current: Any, spec: Any, saved: list[SavedShard], shard: int, num_shards: int) -> Any:
        """``current`` with a delta save's part of the table put over it (deltas.py); returns the
        table to hold. A kind that a delta saves whole (fixed rows, dense blocks) is loaded anew."""
        return self.load(spec, saved, shard, num_shards, 0)


class FixedFormat(TableFormat):
    """A fixed table: one ``.npy`` per array (values and optimizer state) of the server's local
    rows; a load onto another cluster size gathers rows by global id."""

    spec_type = SparseTable
    store_type = SparseShard

    def write(
        self, directory: Path, prefix: str, store: SparseShard, shard: int, num_shards: int, mode: str, progress: tqdm,
        rows_as: str = "stored",
    ) -> tuple[dict[str, Any], AfterSave | None]:
        files = {}
        for name, array in store.state_arrays().items():
            files[name] = f"{prefix}.{name}.npy"
            write_array(directory / files[name], array)
            progress.update(array.nbytes)
        entry = {"spec": spec_to_dict(store.spec), "kind": store.spec.kind, "step": store.step, "rows": store.local_rows, "files": files}
        return entry, None

    def load(
        self, spec: SparseTable, saved: list[SavedShard], shard: int, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> SparseShard:
        old_layout = ModuloSharding(len(saved))  # the saving cluster's
        new = self.store_type(spec, shard, num_shards, initialise=False)
        targets = new.state_arrays()
        global_ids = new.global_ids()
        owner = old_layout.owners(global_ids)
        for o in saved:
            entry = o.manifest["tables"][spec.name]
            expected_rows = old_layout.local_row_count(spec.rows, o.index)
            if set(entry["files"]) != set(targets):
                raise ConfigError(f"checkpoint {o.directory}: table {spec.name!r} has arrays {sorted(entry['files'])}, expected {sorted(targets)}")
            pick = np.flatnonzero(owner == o.index)
            old_local = old_layout.local_rows(global_ids[pick])
            for name, target in targets.items():
                array = o.open(entry["files"][name])
                if array.shape[0] != expected_rows or array.shape[1:] != target.shape[1:] or array.dtype != target.dtype:
                    raise ConfigError(
                        f"checkpoint {o.directory}: {spec.name!r}.{name} is {array.dtype}{list(array.shape)}, "
                        f"expected {expected_rows} rows of {target.dtype}{list(target.shape[1:])}"
                    )
                if old_layout == new.sharding and o.index == shard:  # same layout: a straight copy, no gather
                    target[...] = array
                elif pick.size:
                    target[pick] = array[old_local]
        new.step = max(int(o.manifest["tables"][spec.name]["step"]) for o in saved)
        return new

    def as_array(self, store: SparseShard) -> np.ndarray:
        return np.asarray(store.values)

    def rows(self, store: SparseShard, ids: np.ndarray) -> np.ndarray:
        return np.asarray(store.values)[ids]

    def load_own(
        self, spec: SparseTable, own: SavedShard, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> SparseShard:
        entry = own.manifest["tables"][spec.name]
        table = self.store_type(spec, own.index, num_shards, initialise=False)
        _load_state(own, lambda: table.load_state({key: own.open(file) for key, file in entry["files"].items()}, int(entry["step"])))
        return table


class DenseFormat(TableFormat):
    """A dense table: one ``.npy`` per array of each block the server holds, its element range in
    the manifest; a load onto another cluster size copies the overlapping ranges."""

    spec_type = DenseTable
    store_type = DenseShard

    def write(
        self, directory: Path, prefix: str, store: DenseShard, shard: int, num_shards: int, mode: str, progress: tqdm,
        rows_as: str = "stored",
    ) -> tuple[dict[str, Any], AfterSave | None]:
        blocks = []
        for index in sorted(store.blocks):
            block = store.blocks[index]
            files = {}
            for name, array in {"values": store.values[index], **store.state[index]}.items():
                files[name] = f"{prefix}.b{index}.{name}.npy"
                write_array(directory / files[name], array)
                progress.update(array.nbytes)
            blocks.append({"index": index, "start": block.start, "stop": block.stop, "step": store.steps[index], "files": files})
        return {"spec": spec_to_dict(store.spec), "kind": store.spec.kind, "blocks": blocks}, None

    def load(
        self, spec: DenseTable, saved: list[SavedShard], shard: int, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> DenseShard:
        mine = [b for b in dense_blocks(spec.name, spec.size, num_shards) if b.server == shard]
        new = DenseShard(spec, mine, initialise=False)
        old_blocks = _saved_blocks(spec, saved)
        for index, block in new.blocks.items():
            targets = {"values": new.values[index], **new.state[index]}
            for old_block, o, entry in old_blocks:
                lo, hi = max(block.start, old_block.start), min(block.stop, old_block.stop)
                if old_block.start <= block.start < old_block.stop:
                    new.steps[index] = int(entry["step"])
                if lo >= hi:
                    continue
                if set(entry["files"]) != set(targets):
                    raise ConfigError(f"checkpoint {o.directory}: table {spec.name!r} block {old_block.index} has arrays {sorted(entry['files'])}, expected {sorted(targets)}")
                for name, target in targets.items():
                    array = o.open(entry["files"][name])
                    if array.shape != (old_block.size,) or array.dtype != target.dtype:
                        raise ConfigError(f"checkpoint {o.directory}: {spec.name!r} block {old_block.index} {name} is {array.dtype}{list(array.shape)}, expected {old_block.size} elements")
                    target[lo - block.start : hi - block.start] = array[lo - old_block.start : hi - old_block.start]
        return new

    def as_array(self, store: DenseShard) -> np.ndarray:
        flat = np.empty(store.spec.size, np.float32)
        for index, block in store.blocks.items():
            flat[block.start : block.stop] = store.values[index]
        return flat.reshape(store.spec.shape)

    def load_own(
        self, spec: DenseTable, own: SavedShard, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> DenseShard:
        entry = own.manifest["tables"][spec.name]
        table = DenseShard(spec, [b for b in dense_blocks(spec.name, spec.size, num_shards) if b.server == own.index], initialise=False)
        arrays = {f"b{b['index']}.{key}": own.open(file) for b in entry["blocks"] for key, file in b["files"].items()}
        _load_state(own, lambda: table.load_state(arrays, {int(b["index"]): int(b["step"]) for b in entry["blocks"]}))
        return table


class HashFormat(TableFormat):
    """A hash table: one file per logical shard the server holds (hash_files.py), so a load onto
    another cluster size moves whole files; a base or delta save writes some keys (a delta also
    the keys deleted since the save before it) and, once the shard is in place, resets their
    delta scores and forgets the deleted keys it covered."""

    spec_type = HashTable
    store_type = HashSparseStore

    def nbytes(self, store: HashSparseStore) -> int:
        return store.nbytes

    def write(
        self, directory: Path, prefix: str, store: HashSparseStore, shard: int, num_shards: int, mode: str, progress: tqdm,
        rows_as: str = "stored",
    ) -> tuple[dict[str, Any], AfterSave | None]:
        entry, after = write_hash_table(directory, prefix, store, shard, num_shards, mode, rows_as)
        progress.update(store.nbytes)
        return entry, after

    def load(
        self, spec: HashTable, saved: list[SavedShard], shard: int, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> HashSparseStore:
        sources = {o.index: (o.directory, o.manifest["tables"][spec.name]) for o in saved}
        return load_hash_table(spec, sources, len(saved), shard, num_shards, _key_limit(spec, max_table_bytes))

    def rows(self, store: HashSparseStore, ids: np.ndarray) -> np.ndarray:
        return store.pull(ids)  # a key it lacks reads its initial row

    def keys(self, store: HashSparseStore) -> np.ndarray:
        keys, _ = store.index.items()
        return np.sort(keys)

    def load_own(
        self, spec: HashTable, own: SavedShard, num_shards: int, max_table_bytes: int, data_dir: Path | None = None,
    ) -> HashSparseStore:
        sources = {own.index: (own.directory, own.manifest["tables"][spec.name])}
        return load_hash_table(spec, sources, num_shards, own.index, num_shards, _key_limit(spec, max_table_bytes))

    def apply_delta(
        self, current: HashSparseStore, spec: HashTable, saved: list[SavedShard], shard: int, num_shards: int
    ) -> HashSparseStore:
        """The delta's deleted keys dropped and its keys written over the held ones."""
        sources = {o.index: (o.directory, o.manifest["tables"][spec.name]) for o in saved}
        apply_hash_delta(current, sources, len(saved), shard, num_shards)
        return current


class DiskFormat(HashFormat):
    """A disk table (disk_files.py): a full save is a snapshot (its rows in RAM in one file, its
    rows on disk as RocksDB's hard-linked checkpoint), a base or delta save a hash table's files;
    either loads into a disk store under the server's data directory."""

    spec_tier = "disk"
    store_type = DiskHashStore

    def nbytes(self, store: DiskHashStore) -> int:  # type: ignore[override]
        return store.nbytes + store.disk_nbytes

    def write(  # type: ignore[override]
        self, directory: Path, prefix: str, store: DiskHashStore, shard: int, num_shards: int, mode: str, progress: tqdm,
        rows_as: str = "stored",
    ) -> tuple[dict[str, Any], AfterSave | None]:
        if mode == "full":
            entry, after = write_disk_snapshot(directory, prefix, store), None
        else:
            entry, after = write_disk_table(directory, prefix, store, shard, num_shards, mode, rows_as)
        progress.update(self.nbytes(store))
        return entry, after

    def load(  # type: ignore[override]
        self, spec: HashTable, saved: list[SavedShard], shard: int, num_shards: int, max_table_bytes: int,
        data_dir: Path | None = None,
    ) -> DiskHashStore:
        sources = {o.index: (o.directory, o.manifest["tables"][spec.name]) for o in saved}
        return _load_disk(spec, sources, len(saved), shard, num_shards, data_dir)

    def load_own(  # type: ignore[override]
        self, spec: HashTable, own: SavedShard, num_shards: int, max_table_bytes: int, data_dir: Path | None = None
    ) -> DiskHashStore:
        sources = {own.index: (own.directory, own.manifest["tables"][spec.name])}
        return _load_disk(spec, sources, num_shards, own.index, num_shards, data_dir)

    def rows(self, store: DiskHashStore, ids: np.ndarray) -> np.ndarray:  # type: ignore[override]
        return store.pull(ids)

    def keys(self, store: DiskHashStore) -> np.ndarray:  # type: ignore[override]
        return store.all_rows()

    def apply_delta(  # type: ignore[override]
        self, current: DiskHashStore, spec: HashTable, saved: list[SavedShard], shard: int, num_shards: int
    ) -> DiskHashStore:
        """The delta's deleted keys dropped and its keys written over the held ones, in RAM or on disk."""
        sources = {o.index: (o.directory, o.manifest["tables"][spec.name]) for o in saved}
        apply_disk_delta(current, sources, len(saved), shard, num_shards)
        return current


def _load_disk(
    spec: HashTable, sources: dict[int, tuple[Path, dict[str, Any]]], saved: int, shard: int, num_shards: int,
    data_dir: Path | None,
) -> DiskHashStore:
    """A disk table's shard from its snapshots (a full save) or from a hash table's files."""
    directory = _table_dir(data_dir, spec)
    if any(entry.get("kind") == SNAPSHOT_KIND for _, entry in sources.values()):
        return load_disk_snapshot(spec, sources, saved, shard, num_shards, directory)
    return load_disk_table(spec, sources, saved, shard, num_shards, directory)


def _table_dir(data_dir: Path | None, spec: HashTable) -> Path:
    """A new disk store's own directory under ``data_dir``; a reader without one (``infer.py``,
    ``aps.read_checkpoint``) gets one in the system's temporary directory, removed with the store."""
    return new_table_dir(Path(tempfile.gettempdir()) if data_dir is None else data_dir, spec.name)


class TableFormats(ByTableClass[TableFormat]):
    """The formats a save or load knows, looked up by the class of a store or a spec."""


#: the formats of the tables every pserver holds
DEFAULT_FORMATS = TableFormats((FixedFormat(), DenseFormat(), HashFormat(), DiskFormat()))


def _key_limit(spec: HashTable, max_table_bytes: int) -> int | None:
    """The keys a pserver's size budget lets one shard of ``spec`` hold (None: no budget)."""
    return budget_keys(spec, max_table_bytes) if max_table_bytes else None


def _load_state(own: SavedShard, load: Callable[[], None]) -> None:
    """Run a store's ``load_state``; its refusal of an array names the checkpoint."""
    try:
        load()
    except ServerError as exc:
        raise ConfigError(f"checkpoint {own.directory}: {exc.message}") from None


def _saved_blocks(spec: DenseTable, saved: list[SavedShard]) -> list[tuple[DenseBlock, SavedShard, dict[str, Any]]]:
    """Every saved block of a dense table, sorted by start; checks they tile ``[0, size)``."""
    blocks = []
    for o in saved:
        for b in o.manifest["tables"][spec.name]["blocks"]:
            blocks.append((DenseBlock(int(b["index"]), int(b["start"]), int(b["stop"]), o.index), o, b))
    blocks.sort(key=lambda item: item[0].start)
    position = 0
    for block, o, _ in blocks:
        if block.start != position:
            raise ConfigError(f"checkpoint: dense table {spec.name!r} has no saved data for elements [{position}, {block.start}) (at shard {o.index})")
        position = block.stop
    if position != spec.size:
        raise ConfigError(f"checkpoint: dense table {spec.name!r} saved up to element {position}, size is {spec.size}")
    return blocks
