"""The newest complete copy of one shard under a directory: what ``--resume`` loads and what the
launcher looks for before it restarts a pserver with ``--resume``.

A pserver's periodic checkpoints (``DIR/auto-<ms>-shard-<k>-of-<n>/``) and whole-cluster saves
(``DIR/epoch_3/shard-...``) count alike; they are ranked by the time their manifest was written,
and a copy without a readable manifest (a save that was killed) or a base/delta save (which lacks
keys) is skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from ..errors import ConfigError
from .shards import read_shard_manifest, shard_dir_name

log = structlog.get_logger("aps.checkpoints")


def latest_checkpoint(directory: str | Path, shard: int, num_shards: int) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete copy of shard ``shard`` of ``num_shards`` in ``directory``: its own
    periodic checkpoints and whole-cluster saves (``DIR/epoch_3/shard-...``) alike, ranked by the
    time their manifest was written. A shard directory without a readable manifest (a save that
    was killed) is skipped. Returns ``(shard directory, manifest)`` or None."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"checkpoint directory {root} does not exist")
    name = shard_dir_name(shard, num_shards)
    best: tuple[float, Path, dict[str, Any]] | None = None
    for parent in [root, *sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))]:
        candidate = parent / name
        if not candidate.is_dir():
            continue
        try:
            manifest = read_shard_manifest(candidate, shard, num_shards)
        except ConfigError as exc:
            log.warning("skipping an incomplete checkpoint", path=str(candidate), reason=str(exc))
            continue
        if manifest.get("mode", "full") != "full":  # a base or delta save lacks some keys
            continue
        written = float(manifest.get("written_at", 0.0))
        if best is None or written > best[0]:
            best = (written, candidate, manifest)
    return None if best is None else (best[1], best[2])
