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
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tqdm import tqdm

from ..digests import dir_sha256
from ..durable import fsync_dir as _fsync_dir
from ..durable import sync_tree
from ..errors import ConfigError
from ..specs import spec_from_dict
from ..storage.hash.accessor import SAVE_MODES, check_export_rows
from ..storage.hash.store import HashSparseStore
from ..storage.tables import DenseShard, SparseShard
from .kinds import DEFAULT_FORMATS, AfterSave, SavedShard, TableFormat, TableFormats
from .stale import remove_stale_saves

Shard = SparseShard | DenseShard | HashSparseStore

FORMAT = "aps-checkpoint"
FORMAT_VERSION = 1
_DIR_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})$")


def shard_dir_name(shard: int, num_shards: int) -> str:
    """``shard-0000k-of-0000n``: fixed width so a listing sorts by shard."""
    return f"shard-{shard:05d}-of-{num_shards:05d}"


# ---------------------------------------------------------------- save


def _progress(what: str, total: int, unit: str) -> tqdm:
    """A progress bar for a person waiting at a terminal on a big save or load; silent when
    stderr is not a terminal (logs, launchers, tests)."""
    return tqdm(total=total, desc=what, unit=unit, unit_scale=True, leave=False, disable=not sys.stderr.isatty())


def check_save_rows(mode: str, rows_as: str) -> None:
    """Refuse (ConfigError) a save mode or rows format that is not one, and int8 rows in a full
    save: a full save is what a pserver resumes from, and int8 rows keep no optimizer state."""
    if mode not in SAVE_MODES:
        raise ConfigError(f"save mode must be one of {', '.join(SAVE_MODES)}, got {mode!r}")
    check_export_rows(rows_as)
    if rows_as != "stored" and mode == "full":
        raise ConfigError(f"{rows_as} rows are for exports (a base or delta save), not a full save that a pserver resumes from")


def save_shard(
    path: str | os.PathLike[str], shards: dict[str, Shard], shard: int, num_shards: int, extra: dict[str, Any],
    save_id: str = "", mode: str = "full", base_save_id: str | None = None, previous_save_id: str | None = None,
    formats: TableFormats = DEFAULT_FORMATS, rows_as: str = "stored",
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
    ``rows_as`` (EXPORT_ROWS): "int8" writes a base or delta save's hash table rows as int8
    codes and a scale a row, for serving only (hash_files.py).
    """
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"checkpoint extra must be JSON-serialisable: {exc}") from exc
    check_save_rows(mode, rows_as)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    final = root / shard_dir_name(shard, num_shards)
    remove_stale_saves([root.parent], final.name, depth=1)  # killed saves' leftovers here and in sibling saves
    tmp = root / f".{final.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    total = sum(formats.of(table).nbytes(table) for table in shards.values())
    after: list[AfterSave] = []
    try:
        tables = {}
        with _progress(f"saving shard {shard}", total, "B") as progress:
            for i, (name, table) in enumerate(sorted(shards.items())):
                # index keeps names distinct even on case-insensitive filesystems; quote makes them safe
                prefix = f"t{i:04d}-{quote(name, safe='')}"
                tables[name], then = formats.of(table).write(tmp, prefix, table, shard, num_shards, mode, progress, rows_as)
                if then is not None:
                    after.append(then)
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
    for then in after:  # the shard is in place (a base or delta save: what it wrote starts a new delta)
        then()
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


def _find_shards(root: Path) -> tuple[int, list[SavedShard]]:
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
    return n, [SavedShard(k, dirs[k], _read_manifest(dirs[k], k, n)) for k in range(n)]


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


def _check_consistent(root: Path, old: list[SavedShard]) -> None:
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


def read_shard_manifest(directory: str | os.PathLike[str], shard: int, num_shards: int) -> dict[str, Any]:
    """The manifest of one saved shard directory (ConfigError if missing, unreadable or another shard's).

    A directory without a manifest is an unfinished save: the manifest is written last."""
    return _read_manifest(Path(directory), shard, num_shards)


def _refuse_delta(where: Path | str, manifest: dict[str, Any]) -> None:
    """A delta holds only the keys that changed since its base: it is no table to load."""
    if manifest.get("mode", "full") == "delta":
        raise ConfigError(
            f"checkpoint {where} is a delta save (keys changed since base save {manifest.get('base_save_id')!r}), "
            "not a whole table: load a full or base checkpoint"
        )


def load_own_shard(
    directory: str | os.PathLike[str], shard: int, num_shards: int, max_table_bytes: int = 0,
    formats: TableFormats = DEFAULT_FORMATS, data_dir: Path | None = None,
) -> tuple[dict[str, Shard], dict[str, Any]]:
    """Server ``shard`` of ``num_shards``'s tables from its own saved shard directory alone
    (``shard-k-of-n``, same cluster size): what a restarted pserver resumes from, without the
    other servers' shards of that save. Returns ``(tables by name, extra)``.
    ``max_table_bytes``: the server's size budget (hash tables are held to the keys it fits);
    ``data_dir``: where disk tables keep their cold rows (a reader without one loads none)."""
    own = SavedShard(shard, Path(directory), _read_manifest(Path(directory), shard, num_shards))
    _refuse_delta(directory, own.manifest)
    tables: dict[str, Shard] = {}
    for name, entry in own.manifest["tables"].items():
        spec = spec_from_dict(entry["spec"], formats.spec_types())
        tables[name] = _format(formats, spec, directory, name, entry).load_own(spec, own, num_shards, max_table_bytes, data_dir)
    return tables, own.manifest.get("extra", {})


def load_shards(
    path: str | os.PathLike[str], shard: int, num_shards: int, max_table_bytes: int = 0,
    only: Collection[str] | None = None, formats: TableFormats = DEFAULT_FORMATS, data_dir: Path | None = None,
) -> tuple[dict[str, Shard], dict[str, Any]]:
    """Server ``shard`` of ``num_shards``'s tables from a checkpoint saved by any number of servers.

    Returns ``(tables by name, extra)``. Raises :class:`ConfigError` naming what is missing or
    inconsistent (absent shard dirs, mixed cluster sizes, differing specs, bad array shapes).
    ``max_table_bytes`` and ``data_dir``: as for :func:`load_own_shard`. ``only``: load just these tables (a
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
        spec = spec_from_dict(entry["spec"], formats.spec_types())
        tables[name] = _format(formats, spec, root, name, entry).load(spec, old, shard, num_shards, max_table_bytes, data_dir)
    return tables, old[0].manifest.get("extra", {})


def _format(formats: TableFormats, spec: Any, where: Path | str, name: str, entry: dict[str, Any]) -> TableFormat:
    found = formats.for_spec(spec)
    if found is None:
        raise ConfigError(f"checkpoint {where}: table {name!r} has an unknown spec {entry['spec']!r}")
    return found
