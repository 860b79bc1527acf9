"""An online trainer's checkpoints: one per pass (or every N passes), its position inside.

Trainer 0 saves ``SAVE_DIR/pass-<seq>`` (seq zero-padded, so names sort) with the source's
position in the manifest's ``extra`` under ``"online"``. ``--resume`` takes the newest *complete*
one (every shard present, one save id: a save killed half-way is skipped), has the pservers load
it and continues after its position. The trainer lists the save dir itself, so it must see the
pservers' checkpoint root at the same path (same machine or shared storage), as exports need.
Trainer 0 deletes the pass checkpoints older than the newest ``keep`` complete ones after each
save (``--keep-passes``): a pass checkpoint is a whole copy of the tables, and one per pass
would fill the disk of a job that runs for weeks.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import structlog

from ..checkpoints.shards import read_shard_manifest
from ..errors import ConfigError

log = structlog.get_logger("aps.trainer")

_PASS_DIR = re.compile(r"^pass-(\d+)$")
_SHARD_DIR = re.compile(r"^shard-(\d{5})-of-(\d{5})$")
#: the key of a manifest's ``extra`` that holds the position
KEY = "online"


def pass_checkpoint(save_dir: str, seq: int) -> str:
    """Where the checkpoint after pass ``seq`` goes (relative paths: to the checkpoint root)."""
    return os.path.join(save_dir, f"pass-{seq:06d}")


def _complete_extra(path: str) -> dict[str, Any] | None:
    """The ``extra`` of the checkpoint at ``path`` if every shard is there from one save."""
    try:
        shards = [m for e in os.scandir(path) if e.is_dir() and (m := _SHARD_DIR.match(e.name))]
    except OSError:
        return None
    sizes = {int(m.group(2)) for m in shards}
    if len(sizes) != 1:
        return None
    (n,) = sizes
    if {int(m.group(1)) for m in shards} != set(range(n)):
        return None
    try:
        manifests = [read_shard_manifest(os.path.join(path, f"shard-{k:05d}-of-{n:05d}"), k, n) for k in range(n)]
    except ConfigError:
        return None  # a manifest not written yet: that save did not finish
    if len({m.get("save_id") for m in manifests}) != 1:
        return None
    extra = manifests[0].get("extra") or {}
    return extra if isinstance(extra.get(KEY), dict) else None


def newest_checkpoint(local_dir: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, position)`` of the newest complete pass checkpoint in ``local_dir``, or None."""
    try:
        names = [e.name for e in os.scandir(local_dir) if e.is_dir() and _PASS_DIR.match(e.name)]
    except FileNotFoundError:
        return None
    for name in sorted(names, key=lambda n: int(n[5:]), reverse=True):
        extra = _complete_extra(os.path.join(local_dir, name))
        if extra is not None:
            return name, extra[KEY]
        log.warning("skipping an incomplete checkpoint", path=os.path.join(local_dir, name))
    return None


def prune_checkpoints(local_dir: str, keep: int) -> list[str]:
    """Delete the pass checkpoints in ``local_dir`` older than its newest ``keep`` complete ones
    (complete or not: an older incomplete one is a save that was killed); returns their names.
    Newer incomplete ones are left alone: a save may be writing them."""
    if keep < 1:
        raise ConfigError(f"keep must be >= 1 pass checkpoints, got {keep}")
    try:
        names = sorted((e.name for e in os.scandir(local_dir) if e.is_dir() and _PASS_DIR.match(e.name)), key=lambda n: int(n[5:]))
    except FileNotFoundError:
        return []
    complete = [n for n in names if _complete_extra(os.path.join(local_dir, n)) is not None]
    if len(complete) <= keep:
        return []
    oldest_kept = int(complete[-keep][5:])
    doomed = [n for n in names if int(n[5:]) < oldest_kept]
    for name in doomed:
        shutil.rmtree(os.path.join(local_dir, name), ignore_errors=True)
    return doomed


def local_save_dir(save_dir: str, roots: dict[str, str | None]) -> str:
    """``save_dir`` as this machine sees it: relative paths are the first pserver's checkpoint
    root's (every pserver of a job that resumes from one listing must share it)."""
    if os.path.isabs(save_dir):
        return save_dir
    root = next(iter(roots.values()), None)
    if root is None:
        raise ConfigError("resume: the pservers did not say their checkpoint root; give --save-dir as an absolute path")
    return os.path.join(root, save_dir)
