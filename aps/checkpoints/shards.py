"""Checkpoints: each pserver saves its own shard; any cluster size can load them back.

Layout under ``path``::

    shard-00000-of-00002/manifest.json      format, shard, num_shards, extra, written_at, tables
    shard-00000-of-00002/t0000-emb.values.npy
    shard-00000-of-00002/t0000-emb.m.npy     (optimizer state, one .npy per array)
    shard-00000-of-00002/t0001-fc%2Fw.b1.values.npy   (dense: per block, start/stop in manifest)
    shard-00000-of-00002/t0002-ctr.l0000.npz  (hash: one file per logical shard, hash_checkpoint.py)

Why this shape:

* Atomic per shard: everything is written into a hidden temp dir next to the final one, every
  file made durable (one syncfs on Linux, aps/durable.py), the manifest written last, the dir fsync'd, then renamed into place. A crash
  mid-save leaves the previous checkpoint (or nothing), never a half-written shard that loads.
* No pickle anywhere (``allow_pickle=False`` both ways): a checkpoint is data, not code.
* Re-sharding on load: sparse rows move by global id (aps/sharding.py), dense elements by
  flat range, optimizer state with them, reading old files through ``mmap`` so no server reads a
  whole large table it will mostly not keep.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from tqdm import tqdm

from ..digests import dir_sha256
from ..durable import fsync_dir as _fsync_dir
from ..durable import sync_tree
from ..errors import ConfigError, ServerError
from ..sharding import DenseBlock, ModuloSharding, dense_blocks
from ..specs import DenseTable, HashTable, SparseTable, spec_from_dict, spec_to_dict
from ..storage.hash.store import HashSparseStore, budget_keys
from ..storage.tables import DenseShard, SparseShard, make_shard
from .hash_files import SAVE_MODES, load_hash_table, write_hash_table
from .stale import remove_stale_saves

Shard = SparseShard | DenseShard | HashSparseStore

FORMAT = "aps-checkpoint"
FORMAT_VERSION = 1
_DIR_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})$")


def shard_dir_name(shard: int, num_shards: int) -> str:
    """``shard-0000k-of-0000n``: fixed width so a listing sorts by shard."""
    return f"shard-{shard:05d}-of-{num_shards:05d}"


# ---------------------------------------------------------------- save


def _write_array(path: Path, array: np.ndarray) -> None:
    """Write one array; made durable with the rest of its shard by ``sync_tree`` in :func:`save_shard`."""
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)


def _progress(what: str, total: int, unit: str) -> tqdm:
    """A progress bar for a person waiting at a terminal on a big save or load; silent when
    stderr is not a terminal (logs, launchers, tests)."""
    return tqdm(total=total, desc=what, unit=unit, unit_scale=True, leave=False, disable=not sys.stderr.isatty())


def _table_nbytes(shard: Shard) -> int:
    if isinstance(shard, HashSparseStore):
        return shard.nbytes
    return sum(a.nbytes for a in shard.state_arrays().values())


def _write_table(directory: Path, prefix: str, shard: Shard, progress: tqdm | None = None) -> dict[str, Any]:
    """Write one fixed or dense table's arrays; return its manifest entry."""
    entry: dict[str, Any] = {"spec": spec_to_dict(shard.spec), "kind": shard.spec.kind}
    if isinstance(shard, SparseShard):
        files = {}
        for name, array in shard.state_arrays().items():
            files[name] = f"{prefix}.{name}.npy"
            _write_array(directory / files[name], array)
            if progress is not None:
                progress.update(array.nbytes)
        entry.update(step=shard.step, rows=shard.local_rows, files=files)
        return entry
    blocks = []
    for index in sorted(shard.blocks):
        block = shard.blocks[index]
        arrays = {"values": shard.values[index], **shard.state[index]}
        files = {}
        for name, array in arrays.items():
            files[name] = f"{prefix}.b{index}.{name}.npy"
            _write_array(directory / files[name], array)
            if progress is not None:
                progress.update(array.nbytes)
        blocks.append({"index": index, "start": block.start, "stop": block.stop, "step": shard.steps[index], "files": files})
    entry["blocks"] = blocks
    return entry


def save_shard(
    path: str | os.PathLike[str], shards: dict[str, Shard], shard: int, num_shards: int, extra: dict[str, Any],
    save_id: str = "", mode: str = "full", base_save_id: str | None = None, previous_save_id: str | None = None,
) -> Path:
    """Atomically write server ``shard`` of ``num_shards``'s tables under ``path``; returns the dir.

    ``extra`` (JSON-able, e.g. the global step) and ``save_id`` (drawn by the client for each
    save, the same on every server) must be the same on every server of one save:
    :func:`load_shards` refuses shards that differ, e.g. when a save was killed after some
    servers had replaced their shard of an older checkpoint and others had not.

    ``mode`` (hash_checkpoint.py): "full", or "base" / "delta", which write only some of a hash
    table's keys (fixed and dense tables whole) and then reset the delta score of the keys they
    wrote; a delta names the save id of the base it follows (``base_save_id``). A base or delta
    manifest also holds the SHA-256 of every file of the shard (``sha256``, by file name) and the
    save id of the base or delta save this server wrote before it (``previous_save_id``; None:
    none since it started or loaded): an export (aps/client/export.py) checks that no other such
    save came between two of its own, since each resets the delta scores of the keys it wrote.
    """
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"checkpoint extra must be JSON-serialisable: {exc}") from exc
    if mode not in SAVE_MODES:
        raise ConfigError(f"save mode must be one of {', '.join(SAVE_MODES)}, got {mode!r}")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    final = root / shard_dir_name(shard, num_shards)
    remove_stale_saves([root.parent], final.name, depth=1)  # killed saves' leftovers here and in sibling saves
    tmp = root / f".{final.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    total = sum(_table_nbytes(table) for table in shards.values())
    written: list[tuple[HashSparseStore, np.ndarray]] = []
    try:
        tables = {}
        with _progress(f"saving shard {shard}", total, "B") as progress:
            for i, (name, table) in enumerate(sorted(shards.items())):
                # index keeps names distinct even on case-insensitive filesystems; quote makes them safe
                prefix = f"t{i:04d}-{quote(name, safe='')}"
                if isinstance(table, HashSparseStore):
                    tables[name], rows = write_hash_table(tmp, prefix, table, shard, num_shards, mode)
                    written.append((table, rows))
                    progress.update(table.nbytes)
                else:
                    tables[name] = _write_table(tmp, prefix, table, progress)
        sync_tree(tmp)  # every table file durable before the manifest that names them
        digests = {"sha256": dir_sha256(tmp), "previous_save_id": previous_save_id} if mode != "full" else {}
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "shard": shard,
            "num_shards": num_shards,
            "extra": extra,
            "save_id": save_id,
            "mode": mode,
            **({"base_save_id": base_save_id} if mode == "delta" else {}),
            **digests,
            "written_at": time.time(),
            "written_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tables": tables,
        }
        with open(tmp / "manifest.json", "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        _swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if mode != "full":  # in place: what it wrote starts a new delta
        for store, rows in written:
            store.delta_score[rows] = 0.0
    return final


def _swap_into_place(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``, replacing an older ``final`` (rename(2) cannot replace a full dir).

    The old dir is first moved aside under a hidden name and deleted only once the new one is in
    place, so at every instant either the old or the new shard is complete on disk.
    """
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex}")
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    _fsync_dir(final.parent)
    # the new shard is durable: drop the old copy and leftovers of earlier crashed saves
    for stale in final.parent.glob(f".{final.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)


# ---------------------------------------------------------------- load


@dataclass
class _OldShard:
    index: int
    directory: Path
    manifest: dict[str, Any]

    def open(self, file: str) -> np.ndarray:
        """Memory-map one saved array (read-only; only the pages we index are read)."""
        try:
            return np.load(self.directory / file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"checkpoint {self.directory}: cannot read {file}: {exc}") from exc


def _find_shards(root: Path) -> tuple[int, list[_OldShard]]:
    """The saved shards under ``root``, all N of them, in order; loud error if any is missing."""
    if not root.is_dir():
        raise ConfigError(f"checkpoint {root} does not exist or is not a directory")
    found: dict[int, dict[int, Path]] = {}
    for entry in root.iterdir():
        m = _DIR_RE.match(entry.name)
        if m and entry.is_dir():
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = entry
    if not found:
        raise ConfigError(f"checkpoint {root}: no shard-*-of-* directories")
    if len(found) > 1:
        raise ConfigError(f"checkpoint {root}: shards of different cluster sizes {sorted(found)} are mixed; remove the stale ones")
    (n, dirs), = found.items()
    missing = sorted(set(range(n)) - set(dirs))
    if missing:
        names = [shard_dir_name(k, n) for k in missing]
        hint = ""
        aside = [p.name for name in names for p in root.glob(f".{name}.old-*")]
        if aside:  # a save crashed between its two renames: the previous copy is complete
            hint = f" (previous copies set aside by an interrupted save: {', '.join(aside)}; rename them back)"
        raise ConfigError(f"checkpoint {root}: {len(missing)} of {n} shards missing: {', '.join(names)}{hint}")
    extras = sorted(set(dirs) - set(range(n)))
    if extras:
        raise ConfigError(f"checkpoint {root}: unexpected shard indices {extras} for num_shards={n}")
    return n, [_OldShard(k, dirs[k], _read_manifest(dirs[k], k, n)) for k in range(n)]


def _read_manifest(directory: Path, shard: int, num_shards: int) -> dict[str, Any]:
    file = directory / "manifest.json"
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint {directory}: unreadable manifest.json: {exc}") from exc
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise ConfigError(f"checkpoint {directory}: format {manifest.get('format')!r} v{manifest.get('version')} not supported")
    if manifest.get("shard") != shard or manifest.get("num_shards") != num_shards:
        raise ConfigError(f"checkpoint {directory}: manifest says shard {manifest.get('shard')} of {manifest.get('num_shards')}")
    return manifest


def _check_consistent(root: Path, old: list[_OldShard]) -> None:
    """All shards must describe the same tables (same specs) and the same ``extra``."""
    first = old[0].manifest
    for o in old[1:]:
        m = o.manifest
        if sorted(m["tables"]) != sorted(first["tables"]):
            raise ConfigError(f"checkpoint {root}: shard {o.index} has tables {sorted(m['tables'])}, shard 0 has {sorted(first['tables'])}")
        for name, entry in m["tables"].items():
            if entry["spec"] != first["tables"][name]["spec"]:
                raise ConfigError(f"checkpoint {root}: table {name!r} has a different spec on shard {o.index} than on shard 0")
        if m.get("save_id", "") != first.get("save_id", "") or m.get("mode", "full") != first.get("mode", "full"):
            raise ConfigError(
                f"checkpoint {root}: shard {o.index} comes from save {m.get('save_id')!r}, shard 0 from save "
                f"{first.get('save_id')!r}: a save was interrupted or two saves were mixed; use a complete checkpoint"
            )
        if m.get("extra") != first.get("extra"):
            raise ConfigError(f"checkpoint {root}: shard {o.index} comes from a different save (extra {m.get('extra')} != {first.get('extra')})")


def _load_sparse(spec: SparseTable, old: list[_OldShard], shard: int, num_shards: int) -> SparseShard:
    """Server ``shard``'s rows, gathered from the old shards by global id."""
    n = len(old)
    old_layout = ModuloSharding(n)  # the saving cluster's
    new = SparseShard(spec, shard, num_shards, initialise=False)
    targets = new.state_arrays()
    global_ids = new.global_ids()
    owner = old_layout.owners(global_ids)
    for o in old:
        entry = o.manifest["tables"][spec.name]
        expected_rows = old_layout.local_row_count(spec.rows, o.index)
        if set(entry["files"]) != set(targets):
            raise ConfigError(f"checkpoint {o.directory}: table {spec.name!r} has arrays {sorted(entry['files'])}, expected {sorted(targets)}")
        pick = np.flatnonzero(owner == o.index)
        old_local = old_layout.local_rows(global_ids[pick])
        for name, target in targets.items():
            saved = o.open(entry["files"][name])
            if saved.shape[0] != expected_rows or saved.shape[1:] != target.shape[1:] or saved.dtype != target.dtype:
                raise ConfigError(
                    f"checkpoint {o.directory}: {spec.name!r}.{name} is {saved.dtype}{list(saved.shape)}, "
                    f"expected {expected_rows} rows of {target.dtype}{list(target.shape[1:])}"
                )
            if old_layout == new.sharding and o.index == shard:  # same layout: a straight copy, no gather
                target[...] = saved
            elif pick.size:
                target[pick] = saved[old_local]
    new.step = max(int(o.manifest["tables"][spec.name]["step"]) for o in old)
    return new


def _old_blocks(spec: DenseTable, old: list[_OldShard]) -> list[tuple[DenseBlock, _OldShard, dict[str, Any]]]:
    """Every saved block of a dense table, sorted by start; checks they tile ``[0, size)``."""
    blocks = []
    for o in old:
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


def _load_dense(spec: DenseTable, old: list[_OldShard], shard: int, num_shards: int) -> DenseShard:
    """This server's new blocks, filled from the overlapping ranges of the old blocks."""
    mine = [b for b in dense_blocks(spec.name, spec.size, num_shards) if b.server == shard]
    new = DenseShard(spec, mine, initialise=False)
    saved = _old_blocks(spec, old)
    for index, block in new.blocks.items():
        targets = {"values": new.values[index], **new.state[index]}
        for old_block, o, entry in saved:
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


def read_shard_manifest(directory: str | os.PathLike[str], shard: int, num_shards: int) -> dict[str, Any]:
    """The manifest of one saved shard directory (ConfigError if missing, unreadable or another shard's).

    A directory without a manifest is an unfinished save: the manifest is written last."""
    return _read_manifest(Path(directory), shard, num_shards)


def _key_limit(spec: HashTable, max_table_bytes: int) -> int | None:
    """The keys a pserver's size budget lets one shard of ``spec`` hold (None: no budget)."""
    return budget_keys(spec, max_table_bytes) if max_table_bytes else None


def _refuse_delta(where: Path | str, manifest: dict[str, Any]) -> None:
    """A delta holds only the keys that changed since its base: it is no table to load."""
    if manifest.get("mode", "full") == "delta":
        raise ConfigError(
            f"checkpoint {where} is a delta save (keys changed since base save {manifest.get('base_save_id')!r}), "
            "not a whole table: load a full or base checkpoint"
        )


def load_own_shard(
    directory: str | os.PathLike[str], shard: int, num_shards: int, max_table_bytes: int = 0
) -> tuple[dict[str, Shard], dict[str, Any]]:
    """Server ``shard`` of ``num_shards``'s tables from its own saved shard directory alone
    (``shard-k-of-n``, same cluster size): what a restarted pserver resumes from, without the
    other servers' shards of that save. Returns ``(tables by name, extra)``.
    ``max_table_bytes``: the server's size budget (hash tables are held to the keys it fits)."""
    own = _OldShard(shard, Path(directory), _read_manifest(Path(directory), shard, num_shards))
    _refuse_delta(directory, own.manifest)
    tables: dict[str, Shard] = {}
    for name, entry in own.manifest["tables"].items():
        spec = spec_from_dict(entry["spec"])
        if isinstance(spec, HashTable):
            sources = {shard: (own.directory, entry)}
            tables[name] = load_hash_table(spec, sources, num_shards, shard, num_shards, _key_limit(spec, max_table_bytes))
            continue
        if not isinstance(spec, (SparseTable, DenseTable)):
            raise ConfigError(f"checkpoint {directory}: table {name!r} has an unknown spec {entry['spec']!r}")
        table = make_shard(spec, shard, num_shards, initialise=False)
        try:
            if isinstance(table, SparseShard):
                table.load_state({key: own.open(file) for key, file in entry["files"].items()}, int(entry["step"]))
            else:
                arrays = {f"b{b['index']}.{key}": own.open(file) for b in entry["blocks"] for key, file in b["files"].items()}
                table.load_state(arrays, {int(b["index"]): int(b["step"]) for b in entry["blocks"]})
        except ServerError as exc:
            raise ConfigError(f"checkpoint {directory}: {exc.message}") from None
        tables[name] = table
    return tables, own.manifest.get("extra", {})


def load_shards(
    path: str | os.PathLike[str], shard: int, num_shards: int, max_table_bytes: int = 0,
    only: Collection[str] | None = None,
) -> tuple[dict[str, Shard], dict[str, Any]]:
    """Server ``shard`` of ``num_shards``'s tables from a checkpoint saved by any number of servers.

    Returns ``(tables by name, extra)``. Raises :class:`ConfigError` naming what is missing or
    inconsistent (absent shard dirs, mixed cluster sizes, differing specs, bad array shapes).
    ``max_table_bytes``: as for :func:`load_own_shard`. ``only``: load just these tables (a
    reader that needs one table of many reads no other's files); one the checkpoint lacks is a
    ConfigError naming those it has.
    """
    if not 0 <= shard < num_shards:
        raise ConfigError(f"shard {shard} is not in [0, {num_shards})")
    root = Path(path)
    n, old = _find_shards(root)
    _check_consistent(root, old)
    _refuse_delta(root, old[0].manifest)
    tables: dict[str, Shard] = {}
    entries = list(old[0].manifest["tables"].items())
    if only is not None:
        missing = sorted(set(only) - set(old[0].manifest["tables"]))
        if missing:
            raise ConfigError(f"checkpoint {root} has no table {missing[0]!r} (has {sorted(old[0].manifest['tables'])})")
        entries = [(name, entry) for name, entry in entries if name in only]
    for name, entry in tqdm(entries, desc=f"loading {root.name}", unit="table", leave=False, disable=not sys.stderr.isatty()):
        spec = spec_from_dict(entry["spec"])
        if isinstance(spec, SparseTable):
            tables[name] = _load_sparse(spec, old, shard, num_shards)
        elif isinstance(spec, DenseTable):
            tables[name] = _load_dense(spec, old, shard, num_shards)
        elif isinstance(spec, HashTable):
            sources = {o.index: (o.directory, o.manifest["tables"][name]) for o in old}
            tables[name] = load_hash_table(spec, sources, n, shard, num_shards, _key_limit(spec, max_table_bytes))
        else:
            raise ConfigError(f"checkpoint {root}: table {name!r} has an unknown spec {entry['spec']!r}")
    return tables, old[0].manifest.get("extra", {})
