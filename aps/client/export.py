"""Versioned exports of a model for serving: ``await ps.export(root, kind="base"|"delta")``.

An export is a SAVE (mode "base" or "delta", aps/checkpoints/hash_files.py) into
``root/<version>-<kind>/`` by every pserver, then a manifest and a done marker written by this
client once every shard is in place (aps/serving/layout.py). Who writes what, and why:

* Each pserver writes its own shard directory and puts the SHA-256 of each of its files in its
  shard manifest: the pservers may run on other machines, and hashing where the bytes are
  written costs no second read over the network.
* The client then reads the shard manifests (the export root must be storage that the
  pservers, the exporting client and the serving processes all see at the same path: serving
  reads it anyway), checks they come from this save and that no other base or delta save came
  between this export and the one before it, writes ``export.json`` (tables, key counts, every
  file's SHA-256, the version chain) and last ``DONE``. A reader never sees half an export: an
  export that fails midway has no marker, and the next delta is refused until a base is
  written (the keys that failed delta reset on some pservers would otherwise be lost).
* The version is one more than the highest export directory in the root, done or not, so
  versions increase across restarts of the trainer and of the pservers. The version directory
  is created first (an atomic mkdir), so two exporters cannot take the same version.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import wire
from ..digests import file_sha256
from ..errors import ConfigError
from ..serving.layout import (
    FORMAT,
    FORMAT_VERSION,
    KINDS,
    export_dir_name,
    list_exports,
    now_fields,
    read_manifest,
    write_done,
)
from ..specs import TABLE_SPECS, spec_from_dict
from ..storage.hash.accessor import check_export_rows

#: sends one SAVE to every pserver, under the export's timeout, and waits for every reply
SaveAll = Callable[[wire.Save], Awaitable[object]]
#: server 0's address and its checkpoint root as its STATS reply says (None: it does not)
FirstRoot = Callable[[], Awaitable[tuple[str, str | None]]]


@dataclass(frozen=True)
class ExportInfo:
    """What :meth:`PSClient.export` wrote: ``version`` (the export's), ``kind``, ``base_version``
    (the base a delta applies to; a base's own version), ``path`` (the export directory as
    this client sees it) and ``keys`` (key counts by table: a hash table's keys written, a fixed
    table's rows, a dense table's elements)."""

    version: int
    kind: str
    base_version: int
    path: str
    keys: dict[str, int]


async def export(
    save_all: SaveAll, first_root: FirstRoot, num_servers: int, root: str, kind: str, specs: Sequence[type[Any]] = TABLE_SPECS,
    rows: str = "stored",
) -> ExportInfo:
    """See :meth:`PSClient.export`. It is handed the two requests it makes, not the client:
    the client's module is the one that imports this. ``specs``: the spec classes the client
    knows, which the tables' specs are read back as (to write each table's shape); ``rows``:
    what hash tables' rows are written as (EXPORT_ROWS)."""
    if kind not in KINDS:
        raise ConfigError(f"export kind must be one of {', '.join(KINDS)}, got {kind!r}")
    check_export_rows(rows)
    if not isinstance(root, (str, os.PathLike)) or not str(root):
        raise ConfigError(f"export root must be a directory path, got {root!r}")
    root = os.fspath(root)
    local = await _local_root(first_root, root)
    version, base_version, previous = await asyncio.to_thread(_plan, local, kind)
    name = export_dir_name(version, kind)
    save_id = uuid.uuid4().hex
    # rows_as is sent only when it is not the default (a pserver from before it keeps taking
    # plain exports); it follows extra on the wire, so extra is then sent too, empty
    wire_rows = (None, None) if rows == "stored" else ("{}", rows)
    await save_all(wire.Save(path=os.path.join(root, name), save_id=save_id, mode=kind, extra=wire_rows[0], rows_as=wire_rows[1]))
    manifest = await asyncio.to_thread(
        _finish, local / name, num_servers, save_id, kind, version, base_version, previous, specs
    )
    keys = {table: entry["keys"] for table, entry in manifest["tables"].items()}
    return ExportInfo(version, kind, base_version, str(local / name), keys)


async def _local_root(first_root: FirstRoot, root: str) -> Path:
    """The export root on this machine: an absolute path as it is; a relative one, as the
    pservers take it, from server 0's checkpoint root."""
    if os.path.isabs(root):
        return Path(root)
    address, base = await first_root()
    if base is None:
        raise ConfigError(f"export root {root!r} is relative and pserver {address} does not say its checkpoint root: pass an absolute path")
    return Path(base) / root


def _plan(local: Path, kind: str) -> tuple[int, int, dict[str, Any] | None]:
    """(this export's version, its base version, the manifest of the export it follows (a
    delta's), None for a base); creates the version's directory, which reserves the version."""
    local.mkdir(parents=True, exist_ok=True)
    exports = list_exports(local)
    latest = exports[-1] if exports else None
    previous = None
    if kind == "delta":
        if latest is None:
            raise ConfigError(f"export root {local} holds no export: a delta follows a base, export kind='base' first")
        if not latest.done:
            raise ConfigError(
                f"export {latest.path} was not completed (no done marker), so a delta after it would miss the keys it "
                "reset on some pservers: export kind='base' now"
            )
        previous = read_manifest(latest.path)
    version = (latest.version if latest else 0) + 1
    try:
        (local / export_dir_name(version, kind)).mkdir()
    except FileExistsError:
        raise ConfigError(f"export version {version} in {local} is being written by another exporter") from None
    base_version = version if previous is None else int(previous["base_version"])
    return version, base_version, previous


def _finish(
    directory: Path, num_shards: int, save_id: str, kind: str, version: int, base_version: int, previous: dict[str, Any] | None,
    specs: Sequence[type[Any]] = TABLE_SPECS,
) -> dict[str, Any]:
    """Check every shard of the save, then write the export's manifest and done marker."""
    from ..checkpoints.shards import read_shard_manifest, shard_dir_name  # server code only when exporting

    files: dict[str, str] = {}
    tables: dict[str, dict[str, Any]] = {}
    for k in range(num_shards):
        shard_dir = directory / shard_dir_name(k, num_shards)
        if not shard_dir.is_dir():
            raise ConfigError(
                f"export {directory}: the pservers wrote their shards but {shard_dir} is not visible here: the export root "
                "must be storage shared by the pservers, this client and aps-serve, at the same path"
            )
        manifest = read_shard_manifest(shard_dir, k, num_shards)
        if manifest.get("save_id") != save_id or manifest.get("mode") != kind or "sha256" not in manifest:
            raise ConfigError(f"export {directory}: shard {k} is not from this export's save ({save_id}, {kind})")
        if previous is not None and manifest.get("previous_save_id") != previous["save_id"]:
            raise ConfigError(
                f"export {directory}: pserver {k} wrote another base or delta save (or restarted) since export "
                f"{previous['version']}, so this delta would miss keys: export kind='base' now"
            )
        for file, digest in manifest["sha256"].items():
            files[f"{shard_dir.name}/{file}"] = digest
        files[f"{shard_dir.name}/manifest.json"] = file_sha256(shard_dir / "manifest.json")
        for name, entry in manifest["tables"].items():
            table = tables.setdefault(name, {"spec": entry["spec"], "keys": 0})
            if entry["spec"] != table["spec"]:
                raise ConfigError(f"export {directory}: table {name!r} has a different spec on shard {k} than on shard 0")
            if entry.get("kind") == "hash":
                table["keys"] += sum(int(n) for n in entry["keys"].values())
                table["rows_as"] = entry.get("rows_as", "stored")
    for name, table in tables.items():
        spec = spec_from_dict(table["spec"], specs)
        table["kind"] = spec.kind
        # the keys a hash table's shards wrote; a fixed table's rows, a dense table's elements
        table["keys"] = spec.entries(table["keys"])
        table["shape"] = list(spec.values_shape(table["keys"]))
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "version": version, "kind": kind,
        "base_version": base_version, "previous_version": None if previous is None else int(previous["version"]),
        "save_id": save_id, "num_shards": num_shards, "tables": tables, "files": files, **now_fields(),
    }
    write_done(directory, manifest)
    return manifest
