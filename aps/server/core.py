"""The pserver's request logic: validate a message, run it against the tables, build the reply.

No sockets here (transport/ moves the bytes). Handlers are plain methods returning the reply,
or an awaitable when the request has to wait (a coroutine for barriers, the round's future for
sync pushes), so the common pull/push path runs without creating a task. What differs between
kinds of tables is the kind's (kinds/), so a push of any kind runs one pipeline here; the
tables are the table set's (table_set.py), GEO's changed-row reads changes.py's, saves and
loads core_checkpoints.py's, shrinks and hash tables' growth and eviction hash_upkeep.py's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import structlog

from .. import wire
from ..checkpoints.kinds import DEFAULT_FORMATS, TableFormats
from ..errors import ConfigError, ErrorCode, ServerError
from ..specs import TableSpec, spec_from_dict
from ..storage.tables import TablesBudget
from ..wire.messages import message_op
from .changes import ChangeReads
from .config import ServerConfig
from .coordination import Barriers, SyncRounds
from .core_checkpoints import CheckpointHandlers
from .gate import WriteGate
from .hash_upkeep import HashUpkeep
from .kinds import DEFAULT_KINDS, TableKind, TableKinds
from .lag import UpdateVersions
from .liveness import TrainerLeases
from .scheduled import ScheduledWork
from .stats import ServerStats
from .table_set import Shard, TableSet
from .transport.replay import ReplayCache
from .transport.reply_size import check_float32_reply
from .transport.service import AllDone, Reply

T = TypeVar("T")
R = TypeVar("R")

log = structlog.get_logger("aps.server")

_FINAL = int(wire.Flag.FINAL)
_SYNC = int(wire.Flag.SYNC)
#: the pushes: whether each addresses rows by ids (else dense blocks), and its reply's opcode
_PUSHES: dict[type, tuple[bool, wire.Op]] = {
    wire.PushSparseGrad: (True, wire.Op.PUSH_SPARSE_GRAD),
    wire.PushSparseDelta: (True, wire.Op.PUSH_SPARSE_DELTA),
    wire.PushDenseGrad: (False, wire.Op.PUSH_DENSE_GRAD),
    wire.PushDenseDelta: (False, wire.Op.PUSH_DENSE_DELTA),
}
_NO_VALUES = np.empty(0, np.float32)


class ServerCore:
    """State and request handlers of one pserver: the training service behind the transport
    (it implements :class:`~aps.server.transport.service.RequestCore`)."""

    def __init__(
        self, config: ServerConfig, kinds: tuple[type[TableKind], ...] = DEFAULT_KINDS, formats: TableFormats = DEFAULT_FORMATS,
    ) -> None:
        """``kinds``: the table kinds this server serves; ``formats``: how their checkpoints are
        written and read (a new kind brings one of each)."""
        self.config = config
        #: the shards, their specs and kinds, their budget, and creating new ones (table_set.py)
        self.table_set = TableSet(config, TableKinds(config.server_index, config.num_servers, kinds, config.disk_dir))
        self.stats = ServerStats()
        #: gradient updates applied per table shard / dense block, and lagged pushes dropped
        self.versions = UpdateVersions(config.lag_limit)
        self.replays = ReplayCache(config.dedup_window)
        self.barriers = Barriers(lambda: self.leases.gone)
        self.sync_rounds = SyncRounds(config.num_trainers)
        self.done_trainers: set[int] = set()
        #: trainers declared gone that may not come back (a sync job went on or failed without
        #: them), with what they are told at their next request
        self.dropped: dict[int, str] = {}
        self._sync_seen = False  # a SYNC push came: this is a sync job, a gone trainer is dropped
        #: asks the server to stop once every trainer is done (given by :meth:`start`)
        self._on_all_done: AllDone | None = None
        self._clients: dict[int, int] = {}  # client id -> its open (handshaken) connections
        self._trainer_of: dict[int, int] = {}  # client id -> the trainer its HELLO named (trainers only)
        self._forget_timers: dict[int, asyncio.TimerHandle] = {}
        #: GEO's reads of changed rows and the tracking behind them (changes.py)
        self.changes = ChangeReads(config, self.table_set, lambda: self.resumed is not None)
        self._stopping = False
        #: pushes, creates, saves and loads wait here while a save or load runs off the loop
        self.gate = WriteGate()
        #: SAVE, LOAD, init_model and resume, over this core's tables (core_checkpoints.py)
        self.checkpointing = CheckpointHandlers(config, self, self.gate, self.stats, formats)
        #: SHRINK, the scheduled shrinks, and hash tables' growth and eviction ahead of need (hash_upkeep.py)
        self.hash_upkeep = HashUpkeep(self.table_set, self.gate, self.stats)
        self.leases = TrainerLeases(config.num_trainers, config.trainer_timeout, self._trainers_gone)
        #: periodic checkpoints, scheduled shrinks, leases, warm-up (scheduled.py)
        self.scheduled = ScheduledWork(config, self.checkpointing.save_own_shard, self.hash_upkeep.shrink_all, self.leases)
        self.checkpointing.start()  # the stale saves' clean-up, then init_model or resume

    def start(self, on_all_done: AllDone) -> None:
        """The server listens: start the timers; ``on_all_done(reason)`` once every trainer is done."""
        self._on_all_done = on_all_done
        self.scheduled.start(heard_all=self.resumed is not None)

    async def stop(self, checkpoint: bool) -> None:
        """The requests are drained: stop the timers, then one last checkpoint if ``checkpoint``."""
        await self.scheduled.stop(checkpoint)

    def install(self, shards: dict[str, Shard]) -> None:
        """Serve the tables a load brought instead of those held (core_checkpoints.Tables);
        geo clients' next reads return every row, since all may have changed."""
        self.changes.tracking.drop_all()
        self.table_set.install(shards)

    def quiet_locks(self) -> list[asyncio.Lock]:
        """The locks of the shards whose requests run in threads (core_checkpoints.Tables)."""
        locks = (self.table_set.kinds.of(shard).quiet(shard) for shard in self.table_set.tables.values())
        return [lock for lock in locks if lock is not None]

    # the table set's parts, by the names the checkpoints, the collector and the tests read
    @property
    def tables(self) -> dict[str, Shard]:
        return self.table_set.tables

    @property
    def specs(self) -> dict[str, TableSpec]:
        return self.table_set.specs

    @property
    def budget(self) -> TablesBudget:
        return self.table_set.budget

    @property
    def kinds(self) -> TableKinds:
        return self.table_set.kinds

    @property
    def resumed(self) -> str | None:
        """The shard directory this server resumed from alone (None: it did not)."""
        return self.checkpointing.resumed

    # ----------------------------------------------------------------- dispatch

    def handle(self, client_id: int, msg: wire.Message, flags: int, trainer_id: int = -1) -> Reply:
        """Run one request; raise ServerError for a refusal. ``trainer_id`` is what the
        connection's HELLO said (-1: not a trainer)."""
        if isinstance(msg, wire.WorkerDone):
            return self._worker_done(client_id, msg, flags, trainer_id)
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise ServerError(ErrorCode.UNKNOWN_OPCODE, f"opcode {message_op(msg)} is not served after the handshake")
        if 0 <= trainer_id < self.config.num_trainers:
            if trainer_id in self.leases.gone:
                self._heard_from_gone(trainer_id)
            self.leases.heard(trainer_id)
        if flags & _SYNC:
            self._sync_seen = True
            self._sync_allowed()
        if type(msg) in _WRITES and self.gate.busy:
            return self.gate.after(lambda: self._run_held(handler, client_id, msg, flags))
        return handler(self, client_id, msg, flags)

    def _run_held(self, handler: Callable[..., Reply], client_id: int, msg: wire.Message, flags: int) -> Reply:
        """Run a write that waited behind the gate, unless it is a sync push whose client has
        gone meanwhile: like the chunks withdrawn at its disconnect, it must not join a round."""
        if flags & _SYNC and client_id not in self._clients:
            task = asyncio.current_task()
            if task is not None:
                self.replays.discard(client_id, [task])  # a retry must run it, not replay this refusal
            raise ServerError(ErrorCode.BAD_REQUEST, "withdrawn: the client disconnected while its sync push waited", True)
        return handler(self, client_id, msg, flags)

    def _sync_allowed(self) -> None:
        """Sync mode needs every trainer and every shard from one state: refuse a sync push when
        a trainer is gone or when this shard alone was rolled back to a checkpoint."""
        if self.leases.gone:
            raise self._gone_error("this sync push's round cannot complete")
        if self.resumed is not None:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"server {self.config.server_index} resumed alone from {self.resumed}; sync mode needs every shard "
                "from one save: restart every pserver with --init-model of one complete checkpoint",
            )

    def _gone_error(self, what: str) -> ServerError:
        names = ", ".join(str(t) for t in sorted(self.leases.gone))
        return ServerError(
            ErrorCode.TRAINER_GONE,
            f"trainer {names} is gone (nothing heard from it for over {self.leases.timeout:g} s, "
            f"aps-server --trainer-timeout): {what}",
        )

    def _trainers_gone(self, trainers: list[int]) -> None:
        """Leases expired: fail what waits for these trainers, count them as done for the exit rule.
        In a sync job they are dropped for good (the rounds they were part of failed); else they
        may rejoin (:meth:`_heard_from_gone`)."""
        for trainer in trainers:
            silent = self.leases.silent_for(trainer)
            log.warning(
                "trainer gone: no longer waiting for it", trainer=trainer, silent_seconds=round(silent, 1),
                timeout=self.leases.timeout, connections=self.leases.connections.get(trainer, 0),
                dropped=self._sync_seen,
            )
            if self._sync_seen:
                self.dropped[trainer] = (
                    f"trainer {trainer} was dropped by server {self.config.server_index}: nothing was heard from it for "
                    f"{silent:.1f} s, over aps-server --trainer-timeout {self.leases.timeout:g} s, and a sync job "
                    "cannot take a trainer back (the rounds it was part of failed); restart the job, from its last checkpoint"
                )
        error = self._gone_error("the sync round waiting for it failed")
        for client_id, trainer in list(self._trainer_of.items()):
            if trainer in self.dropped:  # its own waiting pushes learn that it was dropped
                self.sync_rounds.withdraw(client_id, ServerError(ErrorCode.TRAINER_GONE, self.dropped[trainer]))
        self.sync_rounds.fail_all(error)
        self.barriers.retarget(self._barrier_target())
        self._maybe_all_done()

    def _heard_from_gone(self, trainer: int) -> None:
        """A request from a trainer declared gone: a dropped one is told so (TRAINER_GONE, not
        retriable); any other rejoins, and barriers counted in live trainers count it again."""
        reason = self.dropped.get(trainer)
        if reason is not None:
            raise ServerError(ErrorCode.TRAINER_GONE, reason)
        log.warning("trainer back: it rejoins", trainer=trainer, silent_seconds=round(self.leases.silent_for(trainer), 1))
        self.leases.back(trainer)
        self.barriers.retarget(self._barrier_target())

    def _barrier_target(self) -> int:
        """Participants of a default-count barrier: the trainers that are not gone."""
        return max(1, self.config.num_trainers - len(self.leases.gone))

    def _maybe_all_done(self) -> None:
        finished = self.done_trainers | self.leases.gone
        if len(finished) >= self.config.num_trainers and self.config.exit_when_done and self._on_all_done is not None:
            gone = sorted(self.leases.gone)
            if gone:
                log.warning("every trainer is done or gone", done=sorted(self.done_trainers), gone=gone)
            reason = f"every trainer sent worker_done or is gone (gone: {gone})" if gone else "all trainers sent worker_done"
            asyncio.get_running_loop().call_soon(self._on_all_done, reason)

    def fail_waiters(self, error: BaseException) -> None:
        """The server is stopping: fail every waiting request (and keep nothing for later)."""
        self._stopping = True
        self.leases.stop()
        self.hash_upkeep.stop()
        self.barriers.fail_all(error)
        self.sync_rounds.fail_all(error)
        for timer in self._forget_timers.values():
            timer.cancel()
        self._forget_timers.clear()

    # ----------------------------------------------------------------- clients coming and going

    def client_connected(self, client_id: int, trainer_id: int = -1) -> None:
        """A connection of ``client_id`` (trainer ``trainer_id``, -1: none) made its first request
        after the handshake: it counts for its client, and for its trainer's lease."""
        if 0 <= trainer_id < self.config.num_trainers:
            self.leases.connected(trainer_id)
        self._clients[client_id] = self._clients.get(client_id, 0) + 1
        if trainer_id >= 0:
            self._trainer_of[client_id] = trainer_id
        self.changes.tracking.back(client_id)
        timer = self._forget_timers.pop(client_id, None)
        if timer is not None:
            timer.cancel()

    def client_disconnected(self, client_id: int, trainer_id: int = -1) -> None:
        """A handshaken connection of ``client_id`` (trainer ``trainer_id``) closed. When it was the client's last one,
        its barrier arrivals and sync-round chunks are withdrawn at once (they must not count
        toward a barrier or round it is no longer part of; a client that reconnects retries them,
        and they count again), and its change tracking and replay entries are dropped after
        ``client_linger`` seconds unless it comes back (its tracking sooner when the server's
        tracking budget needs the room: gone clients' tracking goes first)."""
        if 0 <= trainer_id < self.config.num_trainers:
            self.leases.disconnected(trainer_id)
        left = self._clients.get(client_id, 0) - 1
        if left > 0:
            self._clients[client_id] = left
            return
        self._clients.pop(client_id, None)
        self._trainer_of.pop(client_id, None)
        self.changes.tracking.gone(client_id)
        error = ServerError(
            ErrorCode.BAD_REQUEST, "withdrawn: the client disconnected before the barrier or sync round completed", True
        )
        withdrawn = self.barriers.withdraw(client_id, error) + self.sync_rounds.withdraw(client_id, error)
        if withdrawn:
            self.replays.discard(client_id, withdrawn)  # a retry must run again, not wait on these
            log.info("withdrew a disconnected client's waiting requests", client=f"{client_id:016x}", requests=len(withdrawn))
        if self._stopping:
            return
        if self.config.client_linger > 0:
            loop = asyncio.get_running_loop()
            self._forget_timers[client_id] = loop.call_later(self.config.client_linger, self._forget_client, client_id)
        else:
            self._forget_client(client_id)

    def _forget_client(self, client_id: int) -> None:
        self._forget_timers.pop(client_id, None)
        if client_id in self._clients:
            return
        self.replays.forget(client_id)
        self.changes.forget(client_id)

    # ----------------------------------------------------------------- tables

    def _create_table(self, client_id: int, msg: wire.CreateTable, flags: int) -> Reply:
        try:
            spec = spec_from_dict(json.loads(msg.spec_json), self.kinds.spec_types())  # only kinds it serves
        except (ValueError, ConfigError, RecursionError) as exc:  # RecursionError: JSON nested absurdly deep
            raise ServerError(ErrorCode.BAD_REQUEST, f"bad table spec: {exc}") from None
        return self.table_set.create(spec)

    def _table_info(self, client_id: int, msg: wire.TableInfo, flags: int) -> wire.Message:
        return wire.TextReply(op=wire.Op.TABLE_INFO, text=json.dumps(self.table_set.info(msg.table, msg.detail)).encode())

    # ----------------------------------------------------------------- sparse

    def _pull_sparse(self, client_id: int, msg: wire.PullSparse, flags: int) -> wire.Message:
        shard, kind = self.table_set.get(msg.table, by_ids=True)
        if msg.ids.ndim == 1:  # else the kind refuses them
            n, dim = len(msg.ids), shard.spec.dim
            check_float32_reply(self.config.max_frame, (n, dim), msg.table)
        values = kind.pull_rows(shard, msg.ids)
        if isinstance(values, Awaitable):  # a kind that reads disk: the rows come from a thread
            return self._pulled(msg.table, values)
        return wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=values, version=self.versions.version(msg.table))

    async def _pulled(self, table: str, values: Awaitable[np.ndarray]) -> wire.Message:
        rows = await values
        return wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=rows, version=self.versions.version(table))

    # ----------------------------------------------------------------- the one push pipeline

    def _push_grad(self, client_id: int, msg: wire.PushSparseGrad | wire.PushDenseGrad, flags: int) -> Reply:
        """A gradient push of any kind: the kind accepts it (every check, once), then it joins
        its sync round (``SYNC``: applied once every trainer's part is in, averaged), is dropped
        as lagged (computed from parameters too old: counted), or is applied now. The last chunk
        of a push (``FINAL``) counts one more update of the table or dense block."""
        by_ids, op = _PUSHES[type(msg)]
        shard, kind = self.table_set.get(msg.table, by_ids)
        push = kind.accept(shard, msg, flags)
        final = bool(flags & _FINAL)
        if flags & _SYNC:
            scale = 1.0 / self.config.num_trainers
            kept = replace(push, ids=None, values=_NO_VALUES)  # the round keeps the values themselves

            def applied(counts: bool) -> None:
                if counts:
                    self.versions.applied(msg.table, kept.part)
                if kind.keyed:
                    self.hash_upkeep.after_push(shard)

            def apply(ids: Any, rows: Any) -> Awaitable[None] | None:
                counts = kind.apply_round(shard, ids, rows, kept, scale, final)
                if isinstance(counts, Awaitable):
                    return _then(counts, applied)
                applied(counts)
                return None

            # the future itself is the reply (and what the replay cache keeps), so a withdrawn
            # chunk can be found and forgotten by identity
            return self.sync_rounds.add(
                push.round_key, client_id, push.ids, kind.round_rows(push), kind.round_final(push, final), apply,
                result=wire.Ok(op=op),
            )
        if self.versions.lagged(msg.table, push.part, msg.based_on):
            return wire.Ok(op=op)  # dropped (counted): computed from parameters too old
        def applied(_: None = None) -> wire.Message:
            if final:
                self.versions.applied(msg.table, push.part)
            if kind.keyed:
                self.hash_upkeep.after_push(shard)
            return wire.Ok(op=op)

        done = kind.apply_grad(shard, push, final, client_id)
        return _then(done, applied) if isinstance(done, Awaitable) else applied()

    def _push_delta(self, client_id: int, msg: wire.PushSparseDelta | wire.PushDenseDelta, flags: int) -> wire.Message:
        """GEO's delta push of any kind: accepted by its kind, then ``param += delta``."""
        by_ids, op = _PUSHES[type(msg)]
        shard, kind = self.table_set.get(msg.table, by_ids)
        def applied(_: None = None) -> wire.Message:
            if kind.keyed:
                self.hash_upkeep.after_push(shard)
            return wire.Ok(op=op)

        done = kind.apply_delta(shard, kind.accept(shard, msg, flags), bool(flags & _FINAL), client_id)
        return _then(done, applied) if isinstance(done, Awaitable) else applied()

    # ----------------------------------------------------------------- dense

    def _pull_dense(self, client_id: int, msg: wire.PullDense, flags: int) -> wire.Message:
        shard, kind = self.table_set.get(msg.table, by_ids=False)
        values = kind.pull_block(shard, msg.block, msg.offset, msg.count, self.config.max_frame)
        return wire.ArrayReply(op=wire.Op.PULL_DENSE, values=values, version=self.versions.version(msg.table, msg.block))

    # ----------------------------------------------------------------- coordination

    def _barrier(self, client_id: int, msg: wire.Barrier, flags: int) -> Reply:
        done = self.barriers.arrive(
            msg.name, client_id, msg.count or self._barrier_target(), msg.value, default=not msg.count,
            trainer=self._trainer_of.get(client_id, -1),
        )

        async def reply() -> wire.Message:
            return wire.BarrierReply(total=await done)

        return reply()

    def _worker_done(self, client_id: int, msg: wire.WorkerDone, flags: int, trainer_id: int = -1) -> wire.Message:
        # only a trainer may say it is done, and only itself: else any client could stop the cluster
        if trainer_id < 0:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"worker_done for trainer {msg.trainer_id} from a client that is not a trainer "
                "(connect(..., trainer_id=i) says which trainer a client is)",
            )
        if msg.trainer_id != trainer_id:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"worker_done for trainer {msg.trainer_id} from trainer {trainer_id}: only a trainer itself may say it is done",
            )
        if msg.trainer_id >= self.config.num_trainers:
            raise ServerError(
                ErrorCode.BAD_REQUEST, f"trainer id {msg.trainer_id} but this cluster has {self.config.num_trainers} trainers"
            )
        self.done_trainers.add(msg.trainer_id)
        log.info("worker done", trainer=msg.trainer_id, done=len(self.done_trainers), of=self.config.num_trainers)
        self._maybe_all_done()
        return wire.Ok(op=wire.Op.WORKER_DONE)

    def _ping(self, client_id: int, msg: wire.Ping, flags: int) -> wire.Message:
        return wire.Ok(op=wire.Op.PING)

    def _stats(self, client_id: int, msg: wire.Stats, flags: int) -> wire.Message:
        body = {
            "server_index": self.config.server_index,
            "num_servers": self.config.num_servers,
            # where SAVE and LOAD paths must lie: a trainer checks its save path at start
            "checkpoint_root": self.checkpointing.root,
            "tables": self.table_set.stats(),
            **self.stats.as_dict(),
            "lagged_grads": self.versions.as_dict(),
            "tables_budget": {"limit": self.budget.limit, "taken": self.budget.taken},
        }
        return wire.TextReply(op=wire.Op.STATS, text=json.dumps(body).encode())

    _handlers: dict[type, Callable[..., Reply]] = {
        wire.CreateTable: _create_table,
        wire.TableInfo: _table_info,
        wire.PullSparse: _pull_sparse,
        wire.PushSparseGrad: _push_grad,
        wire.PushSparseDelta: _push_delta,
        wire.PullSparseChanged: lambda self, client_id, msg, flags: self.changes.read(client_id, msg),
        wire.PullDense: _pull_dense,
        wire.PushDenseGrad: _push_grad,
        wire.PushDenseDelta: _push_delta,
        wire.Barrier: _barrier,
        wire.Ping: _ping,
        wire.Stats: _stats,
        wire.Save: lambda self, client_id, msg, flags: self.checkpointing.save(msg),
        wire.Load: lambda self, client_id, msg, flags: self.checkpointing.load(msg),
        wire.Shrink: lambda self, client_id, msg, flags: self.hash_upkeep.shrink(msg),
    }


async def _then(work: Awaitable[T], after: Callable[[T], R]) -> R:
    """``after(await work)``: the rest of a request whose kind ran it off the loop."""
    return after(await work)


#: requests that change the tables: they wait behind the write gate while a save or load runs
_WRITES = frozenset(
    {
        wire.CreateTable, wire.PushSparseGrad, wire.PushSparseDelta, wire.PushDenseGrad, wire.PushDenseDelta,
        wire.Save, wire.Load, wire.Shrink,
    }
)
