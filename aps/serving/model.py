"""What aps-serve holds: one model version, read-only, built from a base export and the deltas
after it (aps/serving/layout.py).

A :class:`ServedModel` is never changed once it serves: applying a delta builds a new one (a
hash table's index and rows copied, the keys the delta lists as deleted dropped, then its keys
written over them; fixed and dense tables come whole in every export, so they are just
replaced), off the event loop, and the server swaps one reference. A lookup therefore always
reads one version, and a swap holds the loop for no longer than an assignment.

Reads are the pserver's: a hash table's unknown key reads its initial row computed from (table
seed, key) (init_kernels.py), so serving and training agree on keys that were never exported;
a key a shrink deleted before a base is not in that base, nor in what is built from it, and one
deleted after it (a shrink, an eviction, a TTL) is dropped by the next delta, which lists it.

Only the values are read of a shard's files (no optimizer state, no statistics; an export written
with int8 rows holds only its rows' codes and scales, read back as aps-serve --rows int8 reads
them, so either --rows serves such an export's rows alike), and every file
read is checked against the SHA-256 the export's manifest gives for it before it is parsed. A
count a manifest claims (keys, rows) is checked against the bytes of the files that hold them
before anything is allocated for it, and any other error the content raises is a ConfigError:
an export that cannot be loaded is refused, never the end of the follower.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .. import npyio
from ..checkpoints.shards import shard_dir_name
from ..digests import bytes_sha256
from ..errors import ConfigError, ErrorCode, ServerError
from ..sharding import ModuloSharding
from ..specs import DenseTable, HashTable, SparseTable, TableSpec, spec_from_dict
from ..storage.hash.accessor import EXPORT_ROWS
from ..storage.hash.compact import as_stored, decode, storage_dtype, value_row_nbytes
from ..storage.hash.index import HashIndex
from ..storage.hash.slab import RowSlab
from ..storage.init_kernels import init_key_rows, table_seed
from ..storage.int8_kernels import dequantize_rows
from ..storage.table_classes import BySpecClass


class ServedHash:
    """A hash table's exported keys and their rows, for lookups."""

    spec_type: ClassVar[type[TableSpec]] = HashTable
    #: looked up by ids (PULL_SPARSE), not by dense blocks; any key is in range
    by_ids: ClassVar[bool] = True

    def __init__(self, spec: HashTable, capacity: int = 1024) -> None:
        self.spec = spec
        self.seed = table_seed(spec.name, spec.seed)
        # slots for ``capacity`` keys at once: no resize while a base is put in
        self.index = HashIndex(max(1, capacity), slots=2 * capacity)
        #: the rows, values only, grown as a pserver's hash table grows its own (slab.py)
        self.slab = self._new_slab()

    def _new_slab(self) -> RowSlab:
        """The slab of the rows held: float32 values (a float16 table's exported values widened,
        as numba's kernels have no float16)."""
        return RowSlab(self.index, self.spec.dim, name=self.spec.name)

    @classmethod
    def read(cls, files: ExportFiles, name: str, spec: HashTable, entry: dict[str, Any], old: Served | None) -> ServedHash:
        """Table ``name`` as export ``files`` leaves it: a base's keys in a new table, a delta's
        over a copy of the version before's (``old``; the delta's spec is that one's): the keys
        it lists as deleted dropped (they read their initial row again), its keys written."""
        count = files.hash_keys(name, spec, entry["keys"])
        if old is None:
            store = cls(spec, count)
        else:
            store = old.copy()  # type: ignore[union-attr]
        for part in files.hash_parts(name, spec):
            store.delete(part.deleted)
            store.put(part.keys, part.values, part.scales)
        return store

    def __len__(self) -> int:
        return len(self.index)

    @property
    def values(self) -> np.ndarray:
        """Each slab row's value (the rows the index gives keys)."""
        return self.slab.values

    @property
    def nbytes(self) -> int:
        return int(self.slab.nbytes + self.index.nbytes)

    @property
    def held_dtype(self) -> str:
        """What a row is held as (STATS says it)."""
        return str(self.slab.values.dtype)

    def check_ids(self, keys: np.ndarray) -> None:
        """Any int64 is a key (an unknown one reads its initial row)."""

    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys``; an unknown key reads its initial row (as on a pserver)."""
        out = np.empty((keys.shape[0], self.spec.dim), np.float32)
        rows, unknown_count = self.index.gather(keys, self.slab.values, out)  # the pserver's pull kernel
        if unknown_count:
            self._initial_rows(keys, rows, out)
        return out

    def _initial_rows(self, keys: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        """``out[i]``: the initial row of ``keys[i]`` where ``rows[i] < 0`` (a key not held), as
        a pserver reads it (rounded as a compact table stores it)."""
        unknown = np.flatnonzero(rows < 0)
        init_key_rows(self.spec.init, self.seed, keys[unknown], unknown, out)
        if self.spec.dtype != "float32":  # as a pserver's compact table reads it
            out[unknown] = as_stored(out[unknown], self.spec.dtype)

    def put(self, keys: np.ndarray, values: np.ndarray, scales: np.ndarray | None = None) -> None:
        """Set the rows of ``keys`` (unique), inserting the keys not held yet. ``values`` as
        exported: float32, float16 or bfloat16's bits, or int8 codes with a float32 ``scales``
        a row (an export written with int8 rows)."""
        self.slab.fit(keys.shape[0])  # doubles the rows as a pserver's slab does
        self._write(self.index.insert(keys), values, scales)
        if self.index.resizing:  # a version is built off the loop: finish the resize here, not in lookups
            self.index.rehash_step(self.index.slots)

    def _write(self, rows: np.ndarray, values: np.ndarray, scales: np.ndarray | None) -> None:
        """Hold ``values`` (as :meth:`put` takes them) in slab ``rows``, as float32: int8 codes
        read back as ``code * scale``, as ``aps-serve --rows int8`` reads them."""
        if scales is None:
            self.slab.values[rows] = decode(values)
        else:
            read = np.empty(values.shape, np.float32)
            dequantize_rows(values, scales, np.arange(values.shape[0], dtype=np.int64), read)
            self.slab.values[rows] = read

    def delete(self, keys: np.ndarray) -> None:
        """Drop ``keys`` (unknown ones are skipped): they read their initial row again. Their
        rows go back to the index's free list, for the keys put next."""
        if keys.size:
            self.index.delete(keys)

    def copy(self) -> ServedHash:
        twin = copy.copy(self)
        twin.index = copy.deepcopy(self.index)
        twin.slab = self.slab.copy(twin.index)
        return twin


def warm_up(table: type[ServedHash] | None = None) -> None:
    """Load (or compile, on a first run) the kernels that loading rows into a hash table of class
    ``table`` (default :class:`ServedHash`) and looking them up run, so that neither the first
    export loaded nor the first lookup a server answers waits for them."""
    store = (table or ServedHash)(HashTable("warm_up", dim=1), 1)
    store.put(np.zeros(1, np.int64), np.ones((1, 1), np.float32))
    store.pull(np.arange(2, dtype=np.int64))


class _Whole:
    """A table exported whole (fixed and dense tables are, in every export): its values."""

    def __init__(self, spec: Any, values: np.ndarray) -> None:
        self.spec = spec
        self.values = values

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)

    @property
    def held_dtype(self) -> str:
        """What a row is held as: float32, as exported (fixed and dense tables are served as they are)."""
        return str(self.values.dtype)


class ServedFixed(_Whole):
    """A fixed table's rows, ``values[id]``."""

    spec: SparseTable
    spec_type: ClassVar[type[TableSpec]] = SparseTable
    by_ids: ClassVar[bool] = True

    @classmethod
    def read(cls, files: ExportFiles, name: str, spec: SparseTable, entry: dict[str, Any], old: Served | None) -> ServedFixed:
        """Table ``name`` of export ``files``, whole (every export holds it whole)."""
        return cls(spec, files.fixed_rows(name, spec))

    def check_ids(self, ids: np.ndarray) -> None:
        """Refuse (ID_OUT_OF_RANGE) an id outside the table."""
        rows = self.spec.rows
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= rows):
            bad = int(ids[(ids < 0) | (ids >= rows)][0])
            raise ServerError(ErrorCode.ID_OUT_OF_RANGE, f"table {self.spec.name!r}: id {bad} not in [0, {rows})")

    def __len__(self) -> int:
        return int(self.spec.rows)

    def pull(self, ids: np.ndarray) -> np.ndarray:
        return self.values[ids]


class ServedDense(_Whole):
    """A dense table's values, flat (one block: aps-serve is a cluster of one server)."""

    spec: DenseTable
    spec_type: ClassVar[type[TableSpec]] = DenseTable
    #: looked up by element ranges (PULL_DENSE)
    by_ids: ClassVar[bool] = False

    @classmethod
    def read(cls, files: ExportFiles, name: str, spec: DenseTable, entry: dict[str, Any], old: Served | None) -> ServedDense:
        """Table ``name`` of export ``files``, whole and flat (every export holds it whole)."""
        return cls(spec, files.dense_values(name, spec))

    def __len__(self) -> int:
        return int(self.spec.size)


Served = ServedHash | ServedFixed | ServedDense
#: what aps-serve serves each kind of spec with (a new kind of spec: its served class here)
SERVED_TABLES: BySpecClass[Any] = BySpecClass([ServedHash, ServedFixed, ServedDense])


@dataclass(frozen=True)
class ServedModel:
    """One version of the model: ``version`` (the export it was built up to), ``base_version``,
    the tables by name (with ``specs`` as the export wrote them)."""

    version: int
    base_version: int
    tables: dict[str, Served]
    specs: dict[str, TableSpec]
    written_at: float = 0.0
    exports: list[int] = field(default_factory=list)


@contextlib.contextmanager
def _content_errors(directory: Path) -> Iterator[None]:
    """Any error that the content of an export's files raises while it is read (a shard manifest
    without a key, a count that is a string, ...) as the ConfigError that refuses the export:
    what is on disk must never end the follower, only set that export aside (follow.py)."""
    try:
        yield
    except ConfigError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise ConfigError(f"export {directory}: malformed ({type(exc).__name__}: {exc})") from exc


def load_base(directory: Path, manifest: dict[str, Any], served: BySpecClass[Any] = SERVED_TABLES) -> ServedModel:
    """The model of a base export (its manifest read and checked: layout.read_manifest);
    ``served``: the class each kind of spec is served with, and so the specs it may hold."""
    with _content_errors(directory):
        files = ExportFiles(directory, manifest)
        tables: dict[str, Served] = {}
        specs = {name: spec_from_dict(entry["spec"], served.spec_types()) for name, entry in manifest["tables"].items()}
        for name, spec in specs.items():
            tables[name] = _read_table(files, name, spec, manifest["tables"][name], None, served)
        return _model(manifest, tables, specs, [int(manifest["version"])])


def apply_delta(
    model: ServedModel, directory: Path, manifest: dict[str, Any], served: BySpecClass[Any] = SERVED_TABLES
) -> ServedModel:
    """A new model: ``model`` with the delta export written over it (``model`` is unchanged;
    ``served``: as for :func:`load_base`)."""
    if manifest.get("previous_version") != model.version:
        raise ConfigError(f"export {directory} follows version {manifest.get('previous_version')}, not {model.version}")
    with _content_errors(directory):
        files = ExportFiles(directory, manifest)
        tables = dict(model.tables)
        specs = dict(model.specs)
        for name, entry in manifest["tables"].items():
            spec = spec_from_dict(entry["spec"], served.spec_types())
            if name in specs and specs[name] != spec:
                raise ConfigError(f"export {directory}: table {name!r} has another spec than in version {model.version}")
            specs[name] = spec
            tables[name] = _read_table(files, name, spec, entry, tables.get(name), served)
        return _model(manifest, tables, specs, [*model.exports, int(manifest["version"])])


def _read_table(
    files: ExportFiles, name: str, spec: TableSpec, entry: dict[str, Any], old: Served | None, served: BySpecClass[Any]
) -> Served:
    """Table ``name`` as export ``files`` leaves it, read by the served class of its spec
    (``old``: the table in the version the export follows, None for a base)."""
    table = served.for_spec(spec)
    if table is None:
        raise ConfigError(f"export {files.directory}: table {name!r} has an unknown spec {spec!r}")
    return table.read(files, name, spec, entry, old)  # type: ignore[no-any-return]


def _model(manifest: dict[str, Any], tables: dict[str, Served], specs: dict[str, TableSpec], exports: list[int]) -> ServedModel:
    return ServedModel(
        int(manifest["version"]), int(manifest["base_version"]), tables, specs, float(manifest.get("written_at", 0.0)), exports
    )


_NO_KEYS = np.empty(0, np.int64)


class HashPart(NamedTuple):
    """One logical shard file of a hash table in an export: its keys, their values, the keys it
    lists as deleted (a delta's; empty otherwise), and the values' scales when they are int8
    codes (an export written with int8 rows; None otherwise)."""

    keys: np.ndarray
    values: np.ndarray
    deleted: np.ndarray = _NO_KEYS
    scales: np.ndarray | None = None


def _int8_rows(entry: dict[str, Any]) -> bool:
    """Whether a shard manifest's hash table entry says its rows were written as int8 codes
    and a scale a row (aps/checkpoints/hash_files.py); refuses a rows format it does not know."""
    rows_as = entry.get("rows_as", "stored")
    if rows_as not in EXPORT_ROWS:
        raise ConfigError(f"hash table rows written as {rows_as!r}, not one of {', '.join(EXPORT_ROWS)}")
    return bool(rows_as == "int8")


class ExportFiles:
    """Reads an export's shard files, each checked against its SHA-256 in the manifest."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.directory = directory
        self.digests: dict[str, str] = manifest["files"]
        self.num_shards = int(manifest["num_shards"])
        self.shards = []
        for k in range(self.num_shards):
            name = shard_dir_name(k, self.num_shards)
            self.shards.append((name, json.loads(self._read(f"{name}/manifest.json"))))

    def _read(self, relative: str) -> bytes:
        digest = self.digests.get(relative)
        if digest is None:
            raise ConfigError(f"export {self.directory}: {relative} is not in its manifest")
        try:
            data = (self.directory / relative).read_bytes()
        except OSError as exc:
            raise ConfigError(f"export {self.directory}: cannot read {relative}: {exc}") from exc
        if bytes_sha256(data) != digest:
            raise ConfigError(f"export {self.directory}: {relative} does not match its SHA-256 in the manifest")
        return data

    def _size(self, relative: str) -> int:
        """The bytes of a file the manifest names, read from disk before the file is (so that a
        count claimed for it is checked before anything is allocated for it)."""
        if relative not in self.digests:
            raise ConfigError(f"export {self.directory}: {relative} is not in its manifest")
        try:
            return os.stat(self.directory / relative).st_size
        except OSError as exc:
            raise ConfigError(f"export {self.directory}: cannot read {relative}: {exc}") from exc

    def _fits(self, relatives: list[str], nbytes: int, what: str) -> None:
        """Refuse ``what`` when its files are smaller than the ``nbytes`` of values its spec claims
        (files are uncompressed .npy: they are at least that big), before it is allocated."""
        held = sum(self._size(r) for r in relatives)
        if held < nbytes:
            raise ConfigError(f"export {self.directory}: {what} claims {nbytes} bytes of values, its files hold {held} bytes")

    def hash_keys(self, name: str, spec: HashTable, claimed: int) -> int:
        """The keys hash table ``name`` has in this export, checked before its rows are
        allocated: each file's count must fit in the file's bytes (an uncompressed .npz holds
        8 + dim values' bytes a key, and 8 a deleted key) and the manifest's total must be their
        sum."""
        total = 0
        for shard, manifest in self.shards:
            entry = manifest["tables"][name]
            key_bytes = 8 + (spec.dim + 4 if _int8_rows(entry) else value_row_nbytes(spec.dtype, spec.dim))
            for logical, file in entry["files"].items():
                count, deleted = int(entry["keys"][logical]), int(entry.get("deleted", {}).get(logical, 0))
                nbytes = count * key_bytes + deleted * 8
                if count < 0 or deleted < 0 or (nbytes and nbytes > self._size(f"{shard}/{file}")):
                    raise ConfigError(
                        f"export {self.directory}: {shard}/{file} claims {count} keys and {deleted} deleted keys of table "
                        f"{name!r}, more than its bytes hold"
                    )
                total += count
        if claimed != total:
            raise ConfigError(f"export {self.directory}: table {name!r} claims {claimed} keys, its files hold {total}")
        return total

    def _array(self, relative: str, npz_names: tuple[str, ...] = ()) -> Any:
        data = self._read(relative)
        try:
            loaded = npyio.load(io.BytesIO(data))
            if npz_names:
                with loaded:
                    found = npyio.members(loaded, npz_names)
                    return [found[n] for n in npz_names]
            return loaded
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ConfigError(f"export {self.directory}: cannot parse {relative}: {exc}") from exc

    def hash_parts(self, name: str, spec: HashTable) -> Iterator[HashPart]:
        """What each logical shard file of hash table ``name`` holds that changes the table: its
        keys and values, and in a delta the keys it lists as deleted. A file the manifest says
        holds neither is not read (a delta of a few keys leaves most of the 1024 files empty);
        a manifest without ``deleted`` (a base, a delta from before deletions were recorded)
        lists none."""
        for shard, manifest in self.shards:
            entry = manifest["tables"][name]
            int8 = _int8_rows(entry)
            for logical, file in entry["files"].items():
                count, deleted = int(entry["keys"][logical]), int(entry.get("deleted", {}).get(logical, 0))
                if count == 0 and deleted == 0:
                    continue
                names = ("keys", "values", *(("deleted_keys",) if deleted else ()), *(("scales",) if int8 else ()))
                found = dict(zip(names, self._array(f"{shard}/{file}", names)))
                part = HashPart(found["keys"], found["values"], found.get("deleted_keys", _NO_KEYS), found.get("scales"))
                self._check_part(f"{shard}/{file}", part, spec, count, deleted)
                yield part

    def _check_part(self, relative: str, part: HashPart, spec: HashTable, count: int, deleted: int) -> None:
        """A file's arrays have the counts the manifest gives and the table's dtypes (int8 codes
        and float32 scales for int8 rows)."""
        keys, values, gone, scales = part
        dtype = np.int8 if scales is not None else storage_dtype(spec.dtype)
        if keys.dtype != np.int64 or keys.shape != (count,) or values.dtype != dtype or values.shape != (count, spec.dim):
            raise ConfigError(f"export {self.directory}: {relative} holds {keys.dtype}{keys.shape} keys, {values.dtype}{values.shape} values")
        if gone.dtype != np.int64 or gone.shape != (deleted,):
            raise ConfigError(f"export {self.directory}: {relative} lists {gone.dtype}{gone.shape} deleted keys, expected {deleted} int64")
        if scales is not None and (scales.dtype != np.float32 or scales.shape != (count,)):
            raise ConfigError(f"export {self.directory}: {relative} holds {scales.dtype}{scales.shape} scales, expected {count} float32")

    def fixed_rows(self, name: str, spec: SparseTable) -> np.ndarray:
        """A fixed table's rows, put together from every shard's part."""
        sharding = ModuloSharding(self.num_shards)
        self._fits([f"{shard}/{m['tables'][name]['files']['values']}" for shard, m in self.shards], 4 * spec.rows * spec.dim, f"fixed table {name!r}")
        out = np.empty((spec.rows, spec.dim), np.float32)
        for k, (shard, manifest) in enumerate(self.shards):
            part = self._array(f"{shard}/{manifest['tables'][name]['files']['values']}")
            if part.shape != (sharding.local_row_count(spec.rows, k), spec.dim) or part.dtype != np.float32:
                raise ConfigError(f"export {self.directory}: {shard} {name!r} values are {part.dtype}{part.shape}")
            out[sharding.rows_of(k)] = part
        return out

    def dense_values(self, name: str, spec: DenseTable) -> np.ndarray:
        """A dense table's values, flat, put together from every shard's blocks."""
        parts = [f"{shard}/{b['files']['values']}" for shard, m in self.shards for b in m["tables"][name]["blocks"]]
        self._fits(parts, 4 * spec.size, f"dense table {name!r}")
        flat = np.empty(spec.size, np.float32)
        covered = 0
        for shard, manifest in self.shards:
            for block in manifest["tables"][name]["blocks"]:
                part = self._array(f"{shard}/{block['files']['values']}")
                start, stop = int(block["start"]), int(block["stop"])
                if part.shape != (stop - start,) or part.dtype != np.float32 or not 0 <= start <= stop <= spec.size:
                    raise ConfigError(f"export {self.directory}: {shard} {name!r} block [{start}, {stop}) is {part.dtype}{part.shape}")
                flat[start:stop] = part
                covered += stop - start
        if covered != spec.size:
            raise ConfigError(f"export {self.directory}: dense table {name!r} has {covered} of {spec.size} values")
        return flat
