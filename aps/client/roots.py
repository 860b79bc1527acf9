"""Checkpoint paths against the pservers' checkpoint roots, decided on the client.

A pserver writes a SAVE only inside its checkpoint root (aps-server --checkpoint-root; relative
paths are taken from it) and refuses any other path, but only when the SAVE arrives, which for a
trainer is after its first epoch. Each server names its root in its STATS reply
(:meth:`~aps.client.PSClient.checkpoint_roots`), so a trainer can refuse such a path itself
before it trains: :func:`check_checkpoint_path`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ConfigError

FIX = ("start the pservers with aps-server --checkpoint-root DIR, DIR a directory that holds it "
       '(aps-local: --server-args "--checkpoint-root DIR"), or name a path inside the root (a relative one is '
       "taken from there)")


def outside_root(path: str, root: str) -> str | None:
    """Where a pserver whose (real) root is ``root`` would put ``path``, when that is outside
    it; None when inside. Symlinks are the server's to resolve: a path inside the root as
    written, or as this machine resolves it, counts as inside (the server has the last word)."""
    joined = os.path.normpath(os.path.join(root, path))
    for candidate in (joined, os.path.realpath(joined)):
        if os.path.commonpath([root, candidate]) == root:
            return None
    return joined


def check_checkpoint_path(path: str, roots: Mapping[str, str | None], what: str) -> None:
    """A ConfigError naming the root and the fix when a pserver in ``roots`` (address -> its
    root; None: a server too old to say, which is left to refuse the SAVE itself) would refuse
    to save under ``path``. ``what`` names the setting the path came from."""
    for address, root in roots.items():
        if root is not None and (real := outside_root(path, root)) is not None:
            raise ConfigError(
                f"{what} {path!r} is {real}, outside the checkpoint root {root} of pserver {address}, "
                f"which would refuse to save there: {FIX}"
            )
