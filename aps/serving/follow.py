"""Following an export root: which export to load next, and loading it.

:meth:`ExportFollower.advance` (blocking: run it in a thread) looks at the root once. A done
base newer than the model served is loaded whole (the deltas before it are skipped); otherwise
the done deltas that continue the served version (each names the version it follows) are
applied in order. An export without its done marker is never read; one whose manifest or a
file fails its SHA-256, or that does not parse, is set aside and named in :attr:`refused` (it
is not read again), and a delta chain stops before it until a newer base comes.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from ..errors import ConfigError
from .layout import list_exports, read_manifest
from .model import ServedModel, apply_delta, load_base

log = structlog.get_logger("aps.serving")


class ExportFollower:
    """The newest model an export root gives, one :meth:`advance` at a time."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.model: ServedModel | None = None
        #: export version -> why it was not loaded
        self.refused: dict[int, str] = {}

    def advance(self) -> ServedModel | None:
        """The model after what the root holds now, or None when nothing new can be loaded."""
        done = [e for e in list_exports(self.root) if e.done and e.version not in self.refused]
        current = self.model.version if self.model is not None else 0
        model = self.model
        bases = [e for e in done if e.kind == "base" and e.version > current]
        for base in reversed(bases):  # the newest base that loads
            try:
                model = load_base(base.path, read_manifest(base.path))
                break
            except ConfigError as exc:
                self._refuse(base.version, exc)
        if model is None:
            return None
        for delta in (e for e in done if e.kind == "delta" and e.version > model.version):
            try:
                manifest = read_manifest(delta.path)
                if manifest.get("previous_version") != model.version:
                    break  # not the next one (the chain continues from a newer base only)
                model = apply_delta(model, delta.path, manifest)
            except ConfigError as exc:
                self._refuse(delta.version, exc)
                break
        if model is self.model:
            return None
        self.model = model
        return model

    def _refuse(self, version: int, exc: ConfigError) -> None:
        self.refused[version] = str(exc)
        log.error("export refused: not loaded", version=version, reason=str(exc))
