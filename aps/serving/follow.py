"""Following an export root: which export to load next, and loading it.

:meth:`ExportFollower.advance` (blocking: run it in a thread) looks at the root once. A done
base newer than the model served is loaded whole (the deltas before it are skipped); otherwise
the done deltas that continue the served version (each names the version it follows) are
applied in order. An export without its done marker is never read; one that cannot be loaded
(a manifest or a file that fails its SHA-256, a manifest of the wrong shape, a file that does
not parse, or any other error its content raises) is set aside, logged with its reason and
named in :attr:`refused` (it is not read again), and a delta chain stops before it until a
newer base comes. A done delta that does not follow the version served (one before it was
refused) is not applied either: it is named in :attr:`waiting`, logged once, until a newer
base makes it moot. Nothing an export holds ends the follower.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from ..errors import ConfigError
from ..storage.table_classes import BySpecClass
from .layout import ExportEntry, list_exports, read_manifest
from .model import SERVED_TABLES, ServedModel, apply_delta, load_base

log = structlog.get_logger("aps.serving")


class ExportFollower:
    """The newest model an export root gives, one :meth:`advance` at a time."""

    def __init__(self, root: str | os.PathLike[str], served: BySpecClass[Any] = SERVED_TABLES) -> None:
        """``served``: the class each kind of spec is served with (the exports' tables are read
        by it, and a spec of no kind in it refuses the export)."""
        self.root = Path(root)
        self.served = served
        self.model: ServedModel | None = None
        #: export version -> why it was not loaded (for good: it is not read again)
        self.refused: dict[int, str] = {}
        #: delta version -> why it is not applied: it does not follow the version served, and
        #: only a newer base (which makes it moot) gets the store past it
        self.waiting: dict[int, str] = {}

    def advance(self) -> ServedModel | None:
        """The model after what the root holds now, or None when nothing new can be loaded."""
        done = [e for e in list_exports(self.root) if e.done and e.version not in self.refused]
        current = self.model.version if self.model is not None else 0
        model = self.model
        bases = [e for e in done if e.kind == "base" and e.version > current]
        for base in reversed(bases):  # the newest base that loads
            loaded = self._load(base, lambda e: load_base(e.path, read_manifest(e.path), self.served))
            if loaded is not None:
                model = loaded
                break
        if model is None:
            return None
        for delta in (e for e in done if e.kind == "delta" and e.version > model.version):
            applied = self._load(delta, lambda e, m=model: self._apply(m, e))
            if applied is None:
                break  # refused, or not the next one: the chain continues from a newer base only
            model = applied
        if model is self.model:
            return None
        self.model = model
        self.waiting = {v: why for v, why in self.waiting.items() if v > model.version}  # a newer base made them moot
        return model

    def _apply(self, model: ServedModel, delta: ExportEntry) -> ServedModel | None:
        """``model`` with ``delta`` applied, or None (listed in :attr:`waiting`) when the delta
        follows another version than ``model``'s."""
        manifest = read_manifest(delta.path)
        previous = manifest["previous_version"]
        if previous != model.version:
            self._wait(delta.version, previous, model.version)
            return None
        return apply_delta(model, delta.path, manifest, self.served)

    def _load(self, entry: ExportEntry, load: Callable[[ExportEntry], ServedModel | None]) -> ServedModel | None:
        """``load(entry)``, or None with the export refused when it raises. Why so broad: a
        refusal names a ConfigError (the checks of layout.py and model.py); anything else an
        export's content raises is a check missing there, and must still set that export aside,
        not end the follower (CancelledError and KeyboardInterrupt are no Exception: they pass)."""
        try:
            return load(entry)
        except ConfigError as exc:
            self._refuse(entry.version, str(exc))
        except Exception as exc:  # a check missing in layout.py or model.py: refused all the same
            self._refuse(entry.version, f"export {entry.path}: cannot be loaded ({type(exc).__name__}: {exc})", error=exc)
        return None

    def _refuse(self, version: int, reason: str, error: Exception | None = None) -> None:
        self.refused[version] = reason
        self.waiting.pop(version, None)
        log.error("export refused: not loaded", version=version, reason=reason, exc_info=error)

    def _wait(self, version: int, previous: int, served: int) -> None:
        """List a delta that does not follow the version served, and log it once (not every poll)."""
        reason = (
            f"delta {version} follows version {previous}, and the model served is version {served}: "
            f"not applied; the store advances past it with a base newer than {served}"
        )
        if self.waiting.get(version) != reason:
            log.warning("export not applied: the version chain is broken", version=version, follows=previous, served=served)
        self.waiting[version] = reason
