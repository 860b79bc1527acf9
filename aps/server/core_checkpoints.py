"""The pserver's checkpoint requests: SAVE and LOAD from clients, ``init_model`` and ``resume``
at start, the shard the periodic checkpoints write. An object the core holds
(:class:`~aps.server.core.ServerCore` ``.checkpointing``), kept apart because it is a
responsibility of its own: paths confined to the checkpoint root, the write gate held while a
save or load runs in a thread, and the save ids a base or delta save chains. It reads the
core's tables through :class:`Tables`, the one narrow view it needs, and hands a loaded set
back through it: what else a load resets (change tracking) stays the core's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol

import structlog

from .. import wire
from ..checkpoints.deltas import load_with_deltas
from ..checkpoints.kinds import DEFAULT_FORMATS, TableFormats
from ..checkpoints.latest import latest_checkpoint
from ..checkpoints.shards import check_save_rows, load_own_shard, load_shards, save_shard, shard_dir_name
from ..checkpoints.stale import remove_stale_saves
from ..errors import ApsError, ConfigError, ErrorCode, ServerError
from ..storage.tables import Shard
from .config import ServerConfig
from .gate import WriteGate
from .stats import ServerStats

log = structlog.get_logger("aps.server")


class Tables(Protocol):
    """The server's tables as a checkpoint sees them: read for a save, replaced by a load."""

    tables: dict[str, Shard]

    def quiet_locks(self) -> list[asyncio.Lock]:
        """The locks of the shards whose requests run in threads: a save holds them all."""
        ...

    def install(self, shards: dict[str, Shard]) -> None:
        """Serve ``shards`` from now on, instead of every table held so far."""


class CheckpointHandlers:
    """Save, load, resume of one server's shard; the tables are the core's (:class:`Tables`)."""

    def __init__(
        self, config: ServerConfig, held: Tables, gate: WriteGate, stats: ServerStats, formats: TableFormats = DEFAULT_FORMATS,
    ) -> None:
        self.config = config
        #: how each kind of table is written and read (checkpoints/kinds.py)
        self.formats = formats
        self.held = held
        self.gate = gate
        self.stats = stats
        #: where client-named SAVE and LOAD paths must lie (its real path)
        self.root = checkpoint_root(config.checkpoint_root)
        #: the manifest keys a load brought, written again by every save
        self.extra: dict[str, Any] = {}
        #: the shard directory this server resumed from (None: it did not): its shard may be
        #: older than the others', which sync mode cannot accept
        self.resumed: str | None = None
        #: the save id of the last base save this server wrote or loaded (None: none yet), which
        #: a delta save names as the base it follows
        self.base_save_id: str | None = None
        #: the save id of the last base or delta save this server wrote (None: none since it
        #: started or loaded); the next one's manifest names it, so an export sees a save between two
        self.previous_save_id: str | None = None

    def start(self) -> None:
        """The tables a pserver starts with: ``init_model``'s or ``resume``'s, else none. The
        leftovers of saves killed midway (a shard's size each) go before anything is loaded."""
        config = self.config
        tops = {self.root, config.checkpoint_dir, config.resume, config.init_model}
        remove_stale_saves([Path(p) for p in tops if p], shard_dir_name(config.server_index, config.num_servers), depth=2)
        if config.init_model:
            self._load_at_start(config.init_model)
        elif config.resume:
            self._resume(config.resume)

    def _confine(self, path: str) -> str:
        """The real path of a checkpoint directory a client named, refused outside the root."""
        if not path or "\0" in path:
            raise ServerError(ErrorCode.BAD_REQUEST, f"bad checkpoint path {path!r}")
        real = os.path.realpath(os.path.join(self.root, path))
        if os.path.commonpath([self.root, real]) != self.root:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"checkpoint path {path!r} is {real}, outside this pserver's checkpoint root {self.root} "
                "(aps-server --checkpoint-root)",
            )
        return real

    def save(self, msg: wire.Save) -> Awaitable[wire.Message]:
        """A client's SAVE: refused at once, or the save's reply to await (writes wait meanwhile)."""
        path = self._confine(msg.path)
        mode, rows_as = msg.mode or "full", msg.rows_as or "stored"
        try:
            check_save_rows(mode, rows_as)
        except ConfigError as exc:
            raise ServerError(ErrorCode.BAD_REQUEST, str(exc)) from None
        if mode == "delta" and self.base_save_id is None:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"a delta save follows a base save, and server {self.config.server_index} has written or loaded none: save mode='base' first",
            )
        extra = _client_extra(msg.extra)
        return self.gate.hold(lambda: self.write_checkpoint(path, msg.save_id, msg.path, mode, extra, rows_as))

    async def save_own_shard(self, path: str, save_id: str) -> float | None:
        """Write this server's shard at ``path`` once the writes already queued are applied (its
        own periodic and shutdown checkpoints, autosave.py); the seconds it took, or None (and
        nothing written) when the server holds no tables."""
        if not self.held.tables:
            return None
        await self.gate.after(lambda: self.gate.hold(lambda: self.write_checkpoint(path, save_id)))
        return self.stats.last_save_seconds

    async def write_checkpoint(
        self, path: str, save_id: str, shown: str | None = None, mode: str = "full", extra: dict[str, Any] | None = None,
        rows_as: str = "stored",
    ) -> wire.Message:
        """Write this server's shard under ``path`` from a thread; the caller holds the write
        gate, so the tables do not change until it is done (a consistent snapshot). ``mode``:
        "full", "base" or "delta" (hash_checkpoint.py). ``extra``: a client's keys for this
        save's manifest, over the server's own, for this save only (an online trainer's
        position describes the tables as they are now, not as a later save finds them).
        ``rows_as``: what hash tables' rows are written as (shards.save_shard)."""
        tables, extra = dict(self.held.tables), {**self.extra, **(extra or {})}
        index, servers = self.config.server_index, self.config.num_servers
        started = time.monotonic()
        try:
            async with contextlib.AsyncExitStack() as quiet:
                for lock in self.held.quiet_locks():  # requests that run in threads (disk tables) finish first
                    await quiet.enter_async_context(lock)
                await asyncio.to_thread(
                    save_shard, path, tables, index, servers, extra, save_id=save_id, mode=mode, base_save_id=self.base_save_id,
                    previous_save_id=self.previous_save_id, formats=self.formats, rows_as=rows_as,
                )
        except OSError as exc:
            raise ServerError(ErrorCode.IO_ERROR, f"save to {shown or path!r} failed: {exc}") from None
        if mode == "base":
            self.base_save_id = save_id
        if mode != "full":
            self.previous_save_id = save_id
        self.stats.last_save_seconds = time.monotonic() - started
        self.stats.saves += 1
        log.info("saved", path=path, tables=len(tables), save_id=save_id, mode=mode, seconds=round(self.stats.last_save_seconds, 3))
        return wire.Ok(op=wire.Op.SAVE)

    def load(self, msg: wire.Load) -> Awaitable[wire.Message]:
        """A client's LOAD: refused at once, or the load's reply to await (writes wait meanwhile)."""
        path = self._confine(msg.path)
        deltas = [self._confine(d) for d in _delta_paths(msg.deltas)]
        return self.gate.hold(lambda: self._load_off_loop(path, msg.path, deltas))

    async def _load_off_loop(self, path: str, shown: str, deltas: list[str]) -> wire.Message:
        index, servers = self.config.server_index, self.config.num_servers
        try:
            shards, extra = await asyncio.to_thread(
                load_with_deltas, path, deltas, index, servers, self.config.max_table_bytes, formats=self.formats,
                data_dir=self.config.disk_dir,
            )
        except OSError as exc:
            raise ServerError(ErrorCode.IO_ERROR, f"load from {shown!r} failed: {exc}") from None
        except ApsError as exc:
            raise ServerError(ErrorCode.BAD_REQUEST, f"load from {shown!r} failed: {exc}") from None
        self._install(path, shards, extra)
        return wire.Ok(op=wire.Op.LOAD)

    def _load_at_start(self, path: str) -> None:
        """Load at start (``init_model``), before anything is served."""
        shards, extra = load_shards(
            path, self.config.server_index, self.config.num_servers, self.config.max_table_bytes, formats=self.formats,
            data_dir=self.config.disk_dir,
        )
        self._install(path, shards, extra)

    def _resume(self, directory: str) -> None:
        """Load this shard alone from the newest complete checkpoint of it in ``directory``."""
        index, servers = self.config.server_index, self.config.num_servers
        found = latest_checkpoint(directory, index, servers)
        if found is None:
            raise ConfigError(
                f"resume: no complete checkpoint of shard {index} of {servers} in {directory} "
                "(a server saves its own with --checkpoint-every, or on SIGTERM with --checkpoint-dir)"
            )
        path, manifest = found
        shards, extra = load_own_shard(
            path, index, servers, self.config.max_table_bytes, formats=self.formats, data_dir=self.config.disk_dir
        )
        self._install(str(path), shards, extra)
        self.resumed = str(path)
        log.warning(
            "resumed: this shard is rolled back to its checkpoint", path=str(path), save_id=manifest.get("save_id"),
            written_at=manifest.get("written_at_iso"), age_seconds=round(time.time() - float(manifest.get("written_at", 0)), 1),
        )

    def _install(self, path: str, shards: dict[str, Shard], extra: dict[str, Any]) -> None:
        self.held.install(dict(shards))
        self.extra = dict(extra)
        self.base_save_id = None  # a delta follows a base this server wrote since
        self.previous_save_id = None
        log.info("loaded", path=os.path.abspath(path), tables=sorted(shards))


def _client_extra(text: str | None) -> dict[str, Any] | None:
    """A SAVE's ``extra``: a JSON object, else BAD_REQUEST."""
    if text is None:
        return None
    try:
        extra = json.loads(text)
    except ValueError as exc:
        raise ServerError(ErrorCode.BAD_REQUEST, f"save extra is not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise ServerError(ErrorCode.BAD_REQUEST, f"save extra must be a JSON object, got {type(extra).__name__}")
    return extra


def _delta_paths(text: str | None) -> list[str]:
    """A LOAD's ``deltas``: a JSON list of paths, else BAD_REQUEST."""
    if text is None:
        return []
    try:
        paths = json.loads(text)
    except ValueError as exc:
        raise ServerError(ErrorCode.BAD_REQUEST, f"load deltas are not JSON: {exc}") from None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ServerError(ErrorCode.BAD_REQUEST, f"load deltas must be a JSON list of paths, got {text[:200]!r}")
    return paths


def checkpoint_root(root: str | None) -> str:
    """The real path of the directory client-named checkpoints must lie in (default: the cwd)."""
    real = os.path.realpath(root if root is not None else os.getcwd())
    if not os.path.isdir(real):
        raise ConfigError(f"checkpoint root {root}: no such directory")
    return real
