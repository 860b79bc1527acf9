"""The layout of an export root: versioned exports, each complete once its done marker exists.

::

    ROOT/00000001-base/shard-00000-of-00002/...   a SAVE in mode "base" by every pserver
    ROOT/00000001-base/export.json                 the export's manifest (written by the client)
    ROOT/00000001-base/DONE                        the done marker: the SHA-256 of export.json
    ROOT/00000002-delta/...                        a SAVE in mode "delta", its manifest, its marker

Why this shape: versions are the directory names (fixed width, so a listing sorts by version),
so the next version is found by reading the root, across restarts of trainers and pservers. The
pservers write their shards (each with the SHA-256 of its files in its shard manifest); the
client that asked for the export writes ``export.json`` (every file's SHA-256, the tables, key
counts, the version chain) and then ``DONE``, each fsync'd, only after every shard is in place.
A reader takes an export only once ``DONE`` exists and names the ``export.json`` it finds: an
export killed midway, or still being written, is never read. Nothing here touches the network.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..digests import bytes_sha256
from ..durable import fsync_dir, replace_synced
from ..errors import ConfigError

FORMAT = "aps-export"
FORMAT_VERSION = 1
KINDS = ("base", "delta")
MANIFEST = "export.json"
MARKER = "DONE"
_NAME_RE = re.compile(r"^(\d{8})-(base|delta)$")


def export_dir_name(version: int, kind: str) -> str:
    """``00000007-delta``: fixed width, so a listing sorts by version."""
    return f"{version:08d}-{kind}"


@dataclass(frozen=True)
class ExportEntry:
    """One export directory found in a root; ``done`` when its marker exists."""

    version: int
    kind: str
    path: Path
    done: bool


def list_exports(root: str | os.PathLike[str]) -> list[ExportEntry]:
    """Every export directory under ``root``, by version (empty when ``root`` does not exist)."""
    root = Path(root)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _NAME_RE.match(name)
        if m:
            path = root / name
            found.append(ExportEntry(int(m.group(1)), m.group(2), path, (path / MARKER).exists()))
    found.sort(key=lambda e: e.version)
    return found


def write_done(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``export.json`` then ``DONE`` (holding its SHA-256), each renamed into place whole
    and fsync'd with the directory: the marker never exists without a complete manifest before
    it, and is never seen empty (an aps-serve polling the root found a DONE being written once,
    read no digest in it, and refused that export for good)."""
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    replace_synced(directory / MANIFEST, text)
    fsync_dir(directory)
    replace_synced(directory / MARKER, bytes_sha256(text).encode())
    fsync_dir(directory)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a done export, checked against its marker (ConfigError otherwise)."""
    try:
        marker = (directory / MARKER).read_text(encoding="ascii").strip()
        text = (directory / MANIFEST).read_bytes()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"export {directory}: no complete manifest and done marker: {exc}") from exc
    if bytes_sha256(text) != marker:
        raise ConfigError(f"export {directory}: {MANIFEST} does not match the SHA-256 in its {MARKER} marker")
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"export {directory}: unreadable {MANIFEST}: {exc}") from exc
    return check_manifest(directory, manifest)


#: the keys every export manifest of FORMAT_VERSION holds (aps/client/export.py writes them)
REQUIRED = (
    "format", "format_version", "version", "kind", "base_version", "previous_version", "save_id", "num_shards",
    "tables", "files", "written_at", "written_at_iso",
)
#: the largest version a directory name holds (8 digits)
MAX_VERSION = 10**8 - 1
#: the most shards one export may have (one per pserver of the job that wrote it)
MAX_SHARDS = 1 << 16
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def check_manifest(directory: Path, manifest: Any) -> dict[str, Any]:
    """``manifest`` when it has the shape FORMAT_VERSION gives it, else a ConfigError that says
    what is wrong. Why here: a done marker proves the manifest is the one its writer meant, not
    that it is well formed (a bug, or a hand-edited export re-signed); every field a reader uses
    is checked once, so that no KeyError or TypeError can come out of it later, and the version
    chain is checked against the directory's name. Counts that claim sizes (``keys``) are only
    checked to be counts here: model.py checks them against the files before allocating."""
    where = f"export {directory}: {MANIFEST}"
    if not isinstance(manifest, dict):
        raise ConfigError(f"{where} is a JSON {type(manifest).__name__}, not an object")
    missing = [key for key in REQUIRED if key not in manifest]
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}")
    if manifest["format"] != FORMAT or type(manifest["format_version"]) is not int or manifest["format_version"] != FORMAT_VERSION:
        raise ConfigError(f"export {directory}: format {_short(manifest['format'])} v{_short(manifest['format_version'])} not supported")
    _check_chain(directory, where, manifest)
    _integer(where, "num_shards", manifest["num_shards"], 1, MAX_SHARDS)
    for key in ("save_id", "written_at_iso"):
        if not isinstance(manifest[key], str):
            raise ConfigError(f"{where}: {key} is {_short(manifest[key])}, not a string")
    if isinstance(manifest["written_at"], bool) or not isinstance(manifest["written_at"], (int, float)):
        raise ConfigError(f"{where}: written_at is {_short(manifest['written_at'])}, not a number")
    _check_files(where, manifest["files"])
    _check_tables(where, manifest["tables"])
    return manifest


def _short(value: Any) -> str:
    """A value for an error message, 100 characters at most (a manifest may hold anything)."""
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _integer(where: str, key: str, value: Any, low: int, high: int) -> int:
    """``value`` when it is an int in [low, high] (JSON true is not 1 here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: {key} is {_short(value)}, not an integer in [{low}, {high}]")
    return value


def _check_chain(directory: Path, where: str, manifest: dict[str, Any]) -> None:
    """Version, kind, base and previous version agree with each other and with the directory's
    name: a base is its own base and follows nothing; a delta follows an older version of its base."""
    version = _integer(where, "version", manifest["version"], 1, MAX_VERSION)
    kind = manifest["kind"]
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind is {_short(kind)}, not one of {', '.join(KINDS)}")
    named = _NAME_RE.match(directory.name)
    if named and (int(named.group(1)), named.group(2)) != (version, kind):
        raise ConfigError(f"{where} says {kind} version {version}, its directory {directory.name}")
    base = _integer(where, "base_version", manifest["base_version"], 1, version)
    previous = manifest["previous_version"]
    if kind == "base":
        if base != version or previous is not None:
            raise ConfigError(f"{where}: a base is its own base and follows nothing, not base {base} after {_short(previous)}")
        return
    if base == version:
        raise ConfigError(f"{where}: a delta cannot be its own base ({base})")
    _integer(where, "previous_version", previous, base, version - 1)


def _check_files(where: str, files: Any) -> None:
    """``files``: relative path -> SHA-256 (hex), every file read is checked against."""
    if not isinstance(files, dict) or not files:
        raise ConfigError(f"{where}: files is {_short(files)}, not an object of file -> SHA-256")
    for name, digest in files.items():
        if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
            raise ConfigError(f"{where}: the SHA-256 of {_short(name)} is {_short(digest)}, not 64 hex digits")


def _check_tables(where: str, tables: Any) -> None:
    """``tables``: name -> {"spec": a table spec's dict, "keys": its key count, ...}."""
    if not isinstance(tables, dict):
        raise ConfigError(f"{where}: tables is a {type(tables).__name__}, not an object of name -> table")
    for name, entry in tables.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("spec"), dict):
            raise ConfigError(f"{where}: table {_short(name)} is {_short(entry)}, not an object with a spec")
        _integer(where, f"table {_short(name)} keys", entry.get("keys"), 0, (1 << 63) - 1)


def now_fields() -> dict[str, Any]:
    return {"written_at": time.time(), "written_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
