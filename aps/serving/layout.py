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
from ..durable import fsync_dir, write_synced
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
    """Write ``export.json`` then ``DONE`` (holding its SHA-256), each fsync'd with the
    directory, so the marker never exists without a complete manifest before it."""
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    tmp = directory / f".{MANIFEST}.tmp"
    write_synced(tmp, text)
    os.replace(tmp, directory / MANIFEST)
    fsync_dir(directory)
    write_synced(directory / MARKER, bytes_sha256(text).encode())
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
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"export {directory}: format {manifest.get('format')!r} v{manifest.get('format_version')} not supported")
    return manifest  # type: ignore[no-any-return]


def now_fields() -> dict[str, Any]:
    return {"written_at": time.time(), "written_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
