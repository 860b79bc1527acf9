"""aps-serve's request logic: lookups from the model version it serves; every write refused.

A :class:`ServingCore` is a request core (:class:`~aps.server.transport.service.RequestCore`)
that the pserver's transport serves (connections, handshake, token, limits, request stats and
metrics are the transport's, aps/server/transport/); it answers only PULL_SPARSE, PULL_DENSE,
TABLE_INFO, STATS and PING, as server 0 of a cluster of 1, so ``aps.connect([address])`` works
unchanged against it. It holds no tables, timers or trainers of its own: nothing to start, to
wait for or to save, and nothing on disk is written or deleted. Anything else (pushes, CREATE_TABLE, SAVE, LOAD, SHRINK, BARRIER, ...) is
refused with ``READ_ONLY``. Replies are read from one :class:`ServedModel`, swapped whole by
:meth:`install`; a pull with the ``MODEL_VERSION`` flag gets the version in its reply.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

from .. import wire
from ..errors import ErrorCode, ServerError
from ..server.config import ServerConfig
from ..server.stats import ServerStats
from ..server.transport.replay import ReplayCache
from ..server.transport.reply_size import check_float32_reply
from ..server.transport.service import AllDone, Reply
from ..specs import spec_to_dict
from .model import ServedModel

log = structlog.get_logger("aps.serving")

_WITH_VERSION = int(wire.Flag.MODEL_VERSION)


class ServingCore:
    """The read-only core of aps-serve over the exports in ``root``."""

    def __init__(self, config: ServerConfig, root: str) -> None:
        self.config = config
        self.stats = ServerStats()
        #: what the transport asks of every core; never filled, as every mutation is refused
        self.replays = ReplayCache(config.dedup_window)
        self.root = root
        self.model: ServedModel | None = None
        self.installed_at = 0.0
        self.swaps = 0
        #: export version -> why it was not loaded (the follower's)
        self.refused: dict[int, str] = {}
        #: delta version -> why it is not applied: it does not follow the version served (the follower's)
        self.waiting: dict[int, str] = {}

    # the transport's hooks: no trainers, timers or saves, so nothing to count, start or stop
    def client_connected(self, client_id: int, trainer_id: int) -> None:
        pass

    def client_disconnected(self, client_id: int, trainer_id: int) -> None:
        pass

    def start(self, on_all_done: AllDone) -> None:
        pass

    def fail_waiters(self, error: BaseException) -> None:
        pass

    async def stop(self, checkpoint: bool) -> None:
        pass

    def install(self, model: ServedModel) -> None:
        """Serve ``model`` from now on (one assignment: lookups never see half of it)."""
        self.model = model
        self.installed_at = time.time()
        self.swaps += 1
        log.info("serving", version=model.version, base=model.base_version, tables=sorted(model.tables))

    def handle(self, client_id: int, msg: wire.Message, flags: int, trainer_id: int = -1) -> Reply:
        handler = _READS.get(type(msg))
        if handler is None:
            raise ServerError(
                ErrorCode.READ_ONLY,
                f"{type(msg).__name__} refused: aps-serve is a read-only store of the exports in {self.root}",
            )
        return handler(self, client_id, msg, flags)

    def _served(self, name: str) -> tuple[ServedModel, Any]:
        model = self.model
        if model is None:
            raise ServerError(ErrorCode.UNKNOWN_TABLE, f"no table named {name!r}: no export of {self.root} is loaded yet")
        table = model.tables.get(name)
        if table is None:
            raise ServerError(ErrorCode.UNKNOWN_TABLE, f"no table named {name!r} in export version {model.version}")
        return model, table

    def _serve_pull_sparse(self, client_id: int, msg: wire.PullSparse, flags: int) -> wire.Message:
        model, table = self._served(msg.table)
        ids = msg.ids
        if not table.by_ids:
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {msg.table!r} is dense, not sparse")
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise ServerError(ErrorCode.BAD_REQUEST, f"ids must be a 1-d int64 array, got {ids.dtype} {ids.shape}")
        dim = table.spec.dim
        check_float32_reply(self.config.max_frame, (len(ids), dim), msg.table)
        table.check_ids(ids)
        return _rows(wire.Op.PULL_SPARSE, table.pull(ids), model, flags)

    def _serve_pull_dense(self, client_id: int, msg: wire.PullDense, flags: int) -> wire.Message:
        model, table = self._served(msg.table)
        if table.by_ids:
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {msg.table!r} is sparse, not dense")
        size = table.spec.size
        if msg.block != 0 or msg.offset + msg.count > size:
            raise ServerError(
                ErrorCode.ID_OUT_OF_RANGE,
                f"table {msg.table!r}: block {msg.block} [{msg.offset}, {msg.offset + msg.count}) is outside block 0 [0, {size})",
            )
        check_float32_reply(self.config.max_frame, (msg.count,), msg.table)
        return _rows(wire.Op.PULL_DENSE, table.values[msg.offset : msg.offset + msg.count], model, flags)

    def _serve_table_info(self, client_id: int, msg: wire.TableInfo, flags: int) -> wire.Message:
        model, table = self._served(msg.table)
        body: dict[str, Any] = spec_to_dict(model.specs[msg.table])
        if msg.detail:
            body = {"spec": body, "keys": len(table), "bytes": table.nbytes, "admitted": 0, "rejected": 0, "evicted": 0}
        return wire.TextReply(op=wire.Op.TABLE_INFO, text=json.dumps(body).encode())

    def _serve_stats(self, client_id: int, msg: wire.Stats, flags: int) -> wire.Message:
        model = self.model
        body = {
            "server_index": 0,
            "num_servers": 1,
            "serving": {
                "export_dir": self.root,
                "version": None if model is None else model.version,
                "base_version": None if model is None else model.base_version,
                "exports_applied": [] if model is None else model.exports,
                "installed_at": self.installed_at,
                "swaps": self.swaps,
                "refused": {str(v): why for v, why in self.refused.items()},
                "waiting": {str(v): why for v, why in self.waiting.items()},
            },
            "tables": {} if model is None else {  # rows: what a row is held as (a served class of one's own may not say)
                name: {"kind": model.specs[name].kind, "keys": len(t), "bytes": t.nbytes, "rows": getattr(t, "held_dtype", None)}
                for name, t in model.tables.items()
            },
            **self.stats.as_dict(),
        }
        return wire.TextReply(op=wire.Op.STATS, text=json.dumps(body).encode())


def _rows(op: int, values: np.ndarray, model: ServedModel, flags: int) -> wire.Message:
    """An ARRAY reply; its ``version`` is the model version too (what a push would name, were
    pushes served), and ``model_version`` is sent when the request asked (older clients did not)."""
    return wire.ArrayReply(
        op=op, values=values, version=model.version, model_version=model.version if flags & _WITH_VERSION else None
    )


_READS: dict[type, Callable[..., Reply]] = {
    wire.PullSparse: ServingCore._serve_pull_sparse,
    wire.PullDense: ServingCore._serve_pull_dense,
    wire.TableInfo: ServingCore._serve_table_info,
    wire.Stats: ServingCore._serve_stats,
    wire.Ping: lambda core, client_id, msg, flags: wire.Ok(op=wire.Op.PING),
}
