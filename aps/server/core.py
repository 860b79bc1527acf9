"""The pserver's request logic: validate a message, run it against the tables, build the reply.

No sockets here (connection.py moves the bytes). Handlers are plain methods returning the reply,
or an awaitable when the request has to wait (a coroutine for barriers, the round's future for
sync pushes), so the common pull/push path runs without creating a task.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import structlog

from .. import wire
from ..errors import ConfigError, ErrorCode, ServerError
from ..specs import DenseTable, HashTable, SparseTable, TableSpec, spec_from_dict, spec_to_dict
from ..storage.hash.store import HashSparseStore, budget_keys, claim_nbytes, planned_nbytes
from ..storage.optim import scan_ids
from ..storage.tables import DenseShard, SparseShard, TablesBudget, make_shard, shard_nbytes
from ..storage.tracking import TrackingBudget
from ..wire.messages import message_op
from .config import ServerConfig
from .coordination import Barriers, SyncRounds
from .core_checkpoints import CheckpointHandlers
from .core_hash import HashHandlers
from .gate import WriteGate
from .lag import SPARSE, UpdateVersions
from .liveness import TrainerLeases
from .scheduled import ScheduledWork
from .stats import ServerStats
from .transport.replay import ReplayCache
from .transport.reply_size import check_float32_reply
from .transport.service import AllDone, Reply

log = structlog.get_logger("aps.server")

_FINAL = int(wire.Flag.FINAL)
_SYNC = int(wire.Flag.SYNC)
_SORTED = int(wire.Flag.SORTED)
_STRICTLY_ASCENDING = 2  # scan_ids' order for unique, ascending ids
Shard = SparseShard | DenseShard | HashSparseStore
#: slab rows a hash table without max_keys starts with (it doubles as keys come)
_HASH_START_ROWS = 1024


class ServerCore(HashHandlers):
    """State and request handlers of one pserver: the training service behind the transport
    (it implements :class:`~aps.server.transport.service.RequestCore`)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.tables: dict[str, Shard] = {}
        self.specs: dict[str, TableSpec] = {}
        #: --max-tables-bytes: what the tables take, hash tables' growth included (tables.py)
        self.budget = TablesBudget(config.max_tables_bytes)
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
        #: change tracking over all sparse tables, bounded by max_tracking_bytes (tracking.py)
        self.tracking = TrackingBudget(config.max_tracking_bytes)
        self._stopping = False
        #: pushes, creates, saves and loads wait here while a save or load runs off the loop
        self.gate = WriteGate()
        #: SAVE, LOAD, init_model and resume, over this core's tables (core_checkpoints.py)
        self.checkpointing = CheckpointHandlers(config, self, self.gate, self.stats)
        self._creating: dict[str, tuple[TableSpec, asyncio.Future[None]]] = {}
        #: per hash table, the slab growth or cap eviction running ahead of need (core_hash.py)
        self._upkeep: dict[str, asyncio.Task[None]] = {}
        self.leases = TrainerLeases(config.num_trainers, config.trainer_timeout, self._trainers_gone)
        #: periodic checkpoints, scheduled shrinks, leases, warm-up (scheduled.py)
        self.scheduled = ScheduledWork(config, self.checkpointing.save_own_shard, self.shrink_all, self.leases)
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
        self.tracking.drop_all()
        self.tables = shards
        self.specs = {name: shard.spec for name, shard in shards.items()}
        self.budget = TablesBudget(self.config.max_tables_bytes)  # the tables it counted are gone
        for shard in shards.values():
            self._count_in_budget(shard)

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
        self.stop_upkeep()
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
        self.tracking.back(client_id)
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
        self.tracking.gone(client_id)
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
        for table in self.tracking.tables_of(client_id):
            self._drop_tracking(client_id, table, over_budget=False)

    def _drop_tracking(self, client_id: int, table: str, *, over_budget: bool) -> None:
        """Stop tracking ``table``'s changes for ``client_id``; its next read of changes returns
        every row (the drop is remembered in ``self.tracking``), so nothing is missed."""
        shard = self.tables.get(table)
        if isinstance(shard, (SparseShard, HashSparseStore)):
            shard.untrack(client_id)
        self.tracking.dropped(client_id, table, over_budget=over_budget)

    # ----------------------------------------------------------------- tables

    def _create_table(self, client_id: int, msg: wire.CreateTable, flags: int) -> Reply:
        try:
            spec = spec_from_dict(json.loads(msg.spec_json))
        except (ValueError, ConfigError, RecursionError) as exc:  # RecursionError: JSON nested absurdly deep
            raise ServerError(ErrorCode.BAD_REQUEST, f"bad table spec: {exc}") from None
        if not isinstance(spec, (SparseTable, DenseTable, HashTable)):
            raise ServerError(ErrorCode.BAD_REQUEST, "spec is not a table")
        existing = self.specs.get(spec.name)
        if existing is not None:
            self._same_spec(existing, spec)
            return wire.Ok(op=wire.Op.CREATE_TABLE)
        creating = self._creating.get(spec.name)
        if creating is not None:  # another client's create of it is running: share its outcome
            self._same_spec(creating[0], spec)
            return _after(asyncio.shield(creating[1]), wire.Ok(op=wire.Op.CREATE_TABLE))
        index, servers = self.config.server_index, self.config.num_servers
        need = self._table_nbytes(spec)
        limit = self.config.max_table_bytes
        if limit and need > limit:
            what = (
                f"{spec.max_keys or _HASH_START_ROWS} keys x (row, optimizer state, statistics and index)" if isinstance(spec, HashTable)
                else "values and optimizer state"
            )
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {spec.name!r} would take {need} bytes ({_gib(need)}) on server {index} of {servers} "
                f"({what}), over this server's limit of {limit} bytes ({_gib(limit)}; aps-server --max-table-bytes)",
            )
        self._tables_fit(spec, self._claim_nbytes(spec))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._creating[spec.name] = (spec, done)
        return self._build_table(spec, need, done)

    def _tables_fit(self, spec: TableSpec, need: int) -> None:
        """Refuse (BAD_REQUEST) the table that would take this server's tables, with those being
        created, past --max-tables-bytes: a limit per table alone let one client create many.
        ``need``, and what the tables hold, as the budget counts them (:meth:`_claim_nbytes`)."""
        limit = self.config.max_tables_bytes
        if not limit:
            return
        held = self.budget.taken + sum(self._claim_nbytes(other) for other, _ in self._creating.values())
        if held + need > limit:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {spec.name!r} would take {need} bytes ({_gib(need)}) on server {self.config.server_index}, "
                f"whose {len(self.tables) + len(self._creating)} tables hold {held} ({_gib(held)}): over its limit "
                f"for all tables of {limit} bytes ({_gib(limit)}; aps-server --max-tables-bytes)",
            )

    def _table_nbytes(self, spec: TableSpec) -> int:
        """Bytes a new shard of ``spec`` takes, for the --max-table-bytes budget: a hash table
        with ``max_keys`` counts that many keys (hash_table.planned_nbytes); one without counts
        its first slab, and is then held to the keys that fit the budget (:meth:`_new_shard`)."""
        if isinstance(spec, HashTable):
            return planned_nbytes(spec, spec.max_keys or _HASH_START_ROWS)
        return shard_nbytes(spec, self.config.server_index, self.config.num_servers)

    def _claim_nbytes(self, spec: TableSpec) -> int:
        """Bytes a new shard of ``spec`` claims of the --max-tables-bytes budget: a hash table's
        first slab (all of ``max_keys``) and its index at its peak (hash_table.claim_nbytes); its
        growth claims more, as it comes."""
        if isinstance(spec, HashTable):
            return claim_nbytes(spec, spec.max_keys or _HASH_START_ROWS)
        return shard_nbytes(spec, self.config.server_index, self.config.num_servers)

    def _count_in_budget(self, shard: Shard) -> None:
        """Count a shard this server now serves against --max-tables-bytes: a hash shard
        claims its slab and index and then its growth; another counts its bytes, which never
        change."""
        if isinstance(shard, HashSparseStore):
            shard.share_budget(self.budget)
        else:
            self.budget.take(shard.nbytes)

    def _new_shard(self, spec: TableSpec) -> Shard:
        """This server's part of a new table (run in a thread: a big one takes seconds)."""
        if isinstance(spec, HashTable):
            limit = self.config.max_table_bytes
            return HashSparseStore(spec, key_limit=budget_keys(spec, limit) if limit else None)
        return make_shard(spec, self.config.server_index, self.config.num_servers)

    @staticmethod
    def _same_spec(existing: TableSpec, spec: TableSpec) -> None:
        if existing != spec:
            raise ServerError(
                ErrorCode.TABLE_EXISTS, f"table {spec.name!r} exists with a different spec: {spec_to_dict(existing)}"
            )

    async def _build_table(self, spec: TableSpec, need: int, done: asyncio.Future[None]) -> wire.Message:
        """Allocate and initialise a shard in a thread (a 5 GB one takes seconds): the loop keeps
        serving meanwhile; creates of the same table that arrive in between wait for this one."""
        index, servers = self.config.server_index, self.config.num_servers
        try:
            try:
                shard = await asyncio.to_thread(self._new_shard, spec)
            except MemoryError:
                raise ServerError(
                    ErrorCode.BAD_REQUEST, f"table {spec.name!r}: cannot allocate {need} bytes ({_gib(need)}) on server {index}"
                ) from None
            existing = self.specs.get(spec.name)
            if existing is not None:  # a LOAD that ran meanwhile brought a table of this name
                self._same_spec(existing, spec)
            else:
                self.tables[spec.name] = shard
                self.specs[spec.name] = spec
                self._count_in_budget(shard)
                log.info("table created", table=spec.name, kind=spec.kind, bytes=shard.nbytes)
        except BaseException as exc:
            done.set_exception(exc if isinstance(exc, ServerError) else ServerError(ErrorCode.INTERNAL, f"create failed: {exc!r}"))
            done.exception()  # read: nobody may be waiting, and that is not an error
            raise
        else:
            done.set_result(None)
        finally:
            self._creating.pop(spec.name, None)
        return wire.Ok(op=wire.Op.CREATE_TABLE)

    def _table_info(self, client_id: int, msg: wire.TableInfo, flags: int) -> wire.Message:
        spec = self._spec(msg.table)
        body: dict[str, Any] = spec_to_dict(spec)
        if msg.detail:
            body = {"spec": body, **_contents(self.tables[msg.table])}
        return wire.TextReply(op=wire.Op.TABLE_INFO, text=json.dumps(body).encode())

    def _spec(self, name: str) -> TableSpec:
        spec = self.specs.get(name)
        if spec is None:
            raise ServerError(ErrorCode.UNKNOWN_TABLE, f"no table named {name!r} on this server")
        return spec

    def _sparse_or_hash(self, name: str) -> SparseShard | HashSparseStore:
        return self._shard(name, (SparseShard, HashSparseStore), "is dense, not sparse")  # type: ignore[no-any-return]

    def _dense(self, name: str) -> DenseShard:
        return self._shard(name, DenseShard, "is sparse, not dense")  # type: ignore[no-any-return]

    def _shard(self, name: str, kinds: type | tuple[type, ...], refusal: str) -> Any:
        """Table ``name``'s shard, refused (UNKNOWN_TABLE) when there is none and (BAD_REQUEST,
        "table 'name' <refusal>") when it is not of ``kinds``."""
        shard = self.tables.get(name)
        if shard is None:
            raise ServerError(ErrorCode.UNKNOWN_TABLE, f"no table named {name!r} on this server")
        if not isinstance(shard, kinds):
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {name!r} {refusal}")
        return shard

    def _local_ids(self, shard: SparseShard, ids: np.ndarray) -> np.ndarray:
        """Global ids -> this server's local rows, refusing ids that are not ours or out of range.

        The one validation of a request's ids (the server edge): the shard is told they are
        checked and does not look at them again."""
        return self._scan(shard, ids)[0]

    def _scan(self, shard: SparseShard, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(local rows, order) of a request's global ids, in one compiled pass (:func:`scan_ids`),
        or the refusal of the first id that is out of range or not this server's."""
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise ServerError(ErrorCode.BAD_REQUEST, f"ids must be a 1-d int64 array, got {ids.dtype} {ids.shape}")
        n, k = self.config.num_servers, self.config.server_index
        local = np.empty(len(ids), np.int64) if n > 1 else ids
        bad, order = scan_ids(ids, shard.spec.rows, n, k, local)
        if bad >= 0:
            raise self._bad_id(shard, int(ids[bad]))
        return local, order

    def _bad_id(self, shard: SparseShard, r: int) -> ServerError:
        """The refusal of id ``r``, which is out of the table or not owned by this server."""
        n, k = self.config.num_servers, self.config.server_index
        if not 0 <= r < shard.spec.rows:
            return ServerError(ErrorCode.ID_OUT_OF_RANGE, f"table {shard.spec.name!r}: id {r} not in [0, {shard.spec.rows})")
        return ServerError(ErrorCode.BAD_REQUEST, f"id {r} sent to server {k} of {n}, which does not own it")

    def _push_ids(self, shard: SparseShard, ids: np.ndarray, flags: int) -> tuple[np.ndarray, bool]:
        """A push's global ids -> (local rows, whether they are ascending), in one compiled pass.

        The same refusals as :meth:`_local_ids`; besides, a push flagged ``SORTED`` whose ids
        are not unique and ascending is refused (BAD_REQUEST) before anything is applied, so a
        client that lies cannot make the optimizer kernel skip a sort it needed. Ascending ids
        (flagged or not) go to the kernel as ``ordered``: no second check, no sort."""
        local, order = self._scan(shard, ids)
        if flags & _SORTED and order != _STRICTLY_ASCENDING:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {shard.spec.name!r}: push flagged SORTED but its ids are not unique and ascending",
            )
        return local, order > 0

    def _check_rows(self, shard: SparseShard, ids: np.ndarray, values: np.ndarray) -> None:
        if values.dtype != np.float32 or values.shape != (len(ids), shard.spec.dim):
            raise ServerError(
                ErrorCode.SHAPE_MISMATCH,
                f"table {shard.spec.name!r}: values must be float32 [{len(ids)}, {shard.spec.dim}], "
                f"got {values.dtype} {list(values.shape)}",
            )

    # ----------------------------------------------------------------- sparse

    def _pull_sparse(self, client_id: int, msg: wire.PullSparse, flags: int) -> wire.Message:
        shard = self.tables.get(msg.table)
        if type(shard) is not SparseShard:
            shard = self._sparse_or_hash(msg.table)
        if msg.ids.ndim == 1:  # else _local_ids / _hash_keys refuses it
            n, dim = len(msg.ids), shard.spec.dim
            check_float32_reply(self.config.max_frame, (n, dim), msg.table, f"{n} rows of {dim} float32")
        if type(shard) is HashSparseStore:
            return self._pull_hash(shard, msg)
        values = shard.pull(self._local_ids(shard, msg.ids), checked=True)
        return wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=values, version=self.versions.version(msg.table))

    def _push_sparse_grad(self, client_id: int, msg: wire.PushSparseGrad, flags: int) -> Reply:
        shard = self.tables.get(msg.table)
        if type(shard) is not SparseShard:
            hashed = self._sparse_or_hash(msg.table)
            if type(hashed) is HashSparseStore:
                return self._push_hash(client_id, hashed, msg, flags)
            shard = hashed
        if msg.shows is not None or msg.clicks is not None:
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {msg.table!r}: shows and clicks are for hash tables only")
        local, ordered = self._push_ids(shard, msg.ids, flags)
        self._check_rows(shard, msg.ids, msg.values)
        final = bool(flags & _FINAL)
        if flags & _SYNC:
            scale = 1.0 / self.config.num_trainers

            def apply(ids: np.ndarray | None, values: np.ndarray) -> None:
                assert ids is not None
                shard.push_grad(ids, values, scale=scale, advance_step=True, client=None, checked=True)
                self.versions.applied(shard.spec.name)

            # the future itself is the reply (and what the replay cache keeps), so a withdrawn
            # chunk can be found and forgotten by identity
            return self.sync_rounds.add(
                (msg.table,), client_id, local, msg.values, final, apply, result=wire.Ok(op=wire.Op.PUSH_SPARSE_GRAD)
            )
        if self.versions.lagged(msg.table, SPARSE, msg.based_on):
            return wire.Ok(op=wire.Op.PUSH_SPARSE_GRAD)  # dropped (counted): computed from parameters too old
        shard.push_grad(local, msg.values, advance_step=final, client=client_id, checked=True, ordered=ordered)
        if final:
            self.versions.applied(msg.table)
        return wire.Ok(op=wire.Op.PUSH_SPARSE_GRAD)

    def _push_sparse_delta(self, client_id: int, msg: wire.PushSparseDelta, flags: int) -> wire.Message:
        shard = self._sparse_or_hash(msg.table)
        if type(shard) is HashSparseStore:
            return self._push_hash_delta(client_id, shard, msg, flags)
        local, ordered = self._push_ids(shard, msg.ids, flags)
        self._check_rows(shard, msg.ids, msg.values)
        shard.push_delta(local, msg.values, client=client_id, checked=True, ordered=ordered)
        return wire.Ok(op=wire.Op.PUSH_SPARSE_DELTA)

    def _pull_sparse_changed(self, client_id: int, msg: wire.PullSparseChanged, flags: int) -> wire.Message:
        shard = self._sparse_or_hash(msg.table)  # local: a fixed table's local rows, a hash table's slab rows
        new_client = not shard.is_tracked(client_id)
        local = shard.changed(client_id)
        if new_client and (self.tracking.was_dropped(client_id, msg.table) or self.resumed is not None):
            # its change tracking was dropped (it was away too long, or over the tracking budget),
            # or this shard was rolled back to a checkpoint under it (a resumed server): any row
            # may have changed
            local = shard.all_rows()
        # at most what fits in one frame (ids int64 + rows float32 + headers); the rest is "more":
        # marked again in the client's own bitmap, so its next read sends them (with newer changes)
        fit = max(0, (self.config.max_frame - 64) // (8 + 4 * shard.spec.dim))
        limit = min(msg.max_rows or len(local), fit)
        more = len(local) > limit
        if more:
            shard.mark_for(client_id, local[limit:])
        self._charge_tracking(client_id, shard)
        if more:
            if not limit:  # not even one row fits: refuse, keeping the rows for a later call
                raise ServerError(
                    ErrorCode.TOO_LARGE,
                    f"table {msg.table!r}: one row of {shard.spec.dim} float32 does not fit in the max frame of "
                    f"{self.config.max_frame}",
                )
            local = local[:limit]
        ids, values = shard.changed_rows(local)
        return wire.ChangedReply(ids=ids, values=values, more=int(more))

    def _charge_tracking(self, client_id: int, shard: SparseShard | HashSparseStore) -> None:
        """Charge ``client_id``'s bitmap on ``shard`` to the tracking budget (once; a read makes
        it the most recently used) and drop the tracking the budget says to."""
        victims = self.tracking.read(client_id, shard.name, shard.tracking_bytes)
        for victim in victims:
            self._drop_tracking(*victim, over_budget=True)
        if victims:
            log.info("change tracking dropped over the tracking budget (those clients get every row next time)",
                     pairs=len(victims), budget=self.config.max_tracking_bytes, held=self.tracking.bytes)

    # ----------------------------------------------------------------- dense

    def _pull_dense(self, client_id: int, msg: wire.PullDense, flags: int) -> wire.Message:
        shard = self._dense(msg.table)
        block = shard.blocks.get(msg.block)
        if block is not None and msg.offset + msg.count <= block.size:  # else pull names the bad range
            check_float32_reply(self.config.max_frame, (msg.count,), msg.table, f"{msg.count} float32")
        values = shard.pull(msg.block, msg.offset, msg.count)
        return wire.ArrayReply(op=wire.Op.PULL_DENSE, values=values, version=self.versions.version(msg.table, msg.block))

    def _check_dense_values(self, msg: wire.PushDenseGrad | wire.PushDenseDelta) -> None:
        if msg.values.dtype != np.float32 or msg.values.ndim != 1:
            raise ServerError(
                ErrorCode.SHAPE_MISMATCH, f"dense values must be a 1-d float32 array, got {msg.values.dtype} {msg.values.shape}"
            )

    def _push_dense_grad(self, client_id: int, msg: wire.PushDenseGrad, flags: int) -> Reply:
        shard = self._dense(msg.table)
        self._check_dense_values(msg)
        final = bool(flags & _FINAL)
        if flags & _SYNC:
            shard.pull(msg.block, msg.offset, len(msg.values))  # validates the range before waiting
            scale = 1.0 / self.config.num_trainers

            block, offset = msg.block, msg.offset  # not msg: the round keeps its own copy of the values

            def apply(_: np.ndarray | None, values: np.ndarray) -> None:
                shard.push_grad(block, offset, values, scale=scale, advance_step=final)
                if final:
                    self.versions.applied(shard.spec.name, block)

            key = (msg.table, msg.block, msg.offset)
            return self.sync_rounds.add(key, client_id, None, msg.values, True, apply, result=wire.Ok(op=wire.Op.PUSH_DENSE_GRAD))
        if self.versions.lagged(msg.table, msg.block, msg.based_on):
            shard.pull(msg.block, msg.offset, len(msg.values))  # a bad range is refused, dropped or not
            return wire.Ok(op=wire.Op.PUSH_DENSE_GRAD)  # dropped (counted): computed from parameters too old
        shard.push_grad(msg.block, msg.offset, msg.values, advance_step=final)
        if final:
            self.versions.applied(msg.table, msg.block)
        return wire.Ok(op=wire.Op.PUSH_DENSE_GRAD)

    def _push_dense_delta(self, client_id: int, msg: wire.PushDenseDelta, flags: int) -> wire.Message:
        shard = self._dense(msg.table)
        self._check_dense_values(msg)
        shard.push_delta(msg.block, msg.offset, msg.values)
        return wire.Ok(op=wire.Op.PUSH_DENSE_DELTA)

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
            "tables": {
                name: {"kind": spec.kind, "bytes": self.tables[name].nbytes, **_size(spec), **_hash_counts(self.tables[name])}
                for name, spec in self.specs.items()
            },
            **self.stats.as_dict(),
            "lagged_grads": self.versions.as_dict(),
            "tables_budget": {"limit": self.budget.limit, "taken": self.budget.taken},
        }
        return wire.TextReply(op=wire.Op.STATS, text=json.dumps(body).encode())

    def _save(self, client_id: int, msg: wire.Save, flags: int) -> Reply:
        return self.checkpointing.save(msg)

    def _load(self, client_id: int, msg: wire.Load, flags: int) -> Reply:
        return self.checkpointing.load(msg)

    _handlers: dict[type, Callable[..., Reply]] = {
        wire.CreateTable: _create_table,
        wire.TableInfo: _table_info,
        wire.PullSparse: _pull_sparse,
        wire.PushSparseGrad: _push_sparse_grad,
        wire.PushSparseDelta: _push_sparse_delta,
        wire.PullSparseChanged: _pull_sparse_changed,
        wire.PullDense: _pull_dense,
        wire.PushDenseGrad: _push_dense_grad,
        wire.PushDenseDelta: _push_dense_delta,
        wire.Barrier: _barrier,
        wire.Ping: _ping,
        wire.Stats: _stats,
        wire.Save: _save,
        wire.Load: _load,
        wire.Shrink: HashHandlers._shrink,
    }


#: requests that change the tables: they wait behind the write gate while a save or load runs
_WRITES = frozenset(
    {
        wire.CreateTable, wire.PushSparseGrad, wire.PushSparseDelta, wire.PushDenseGrad, wire.PushDenseDelta,
        wire.Save, wire.Load, wire.Shrink,
    }
)


async def _after(done: Awaitable[Any], reply: wire.Message) -> wire.Message:
    await done
    return reply


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def _size(spec: TableSpec) -> dict[str, Any]:
    if isinstance(spec, SparseTable):
        return {"rows": spec.rows, "dim": spec.dim}
    if isinstance(spec, HashTable):
        return {"dim": spec.dim, "max_keys": spec.max_keys}
    return {"shape": list(spec.shape), "size": spec.size}


def _hash_counts(shard: Shard) -> dict[str, int]:
    """A hash table shard's keys held, admitted, rejected (over_budget: of them, for a size
    budget) and evicted (STATS); nothing for others."""
    if isinstance(shard, HashSparseStore):
        return {k: v for k, v in shard.counts().items() if k != "bytes"}
    return {}


def _contents(shard: Shard) -> dict[str, int]:
    """What a detailed TABLE_INFO reports of a shard beside its spec: ``keys`` (rows held, for
    a fixed table; dense tables: values held), ``bytes``, and for hash tables ``admitted``,
    ``rejected`` (``over_budget``: those for a size budget) and ``evicted``."""
    if isinstance(shard, HashSparseStore):
        return shard.counts()
    keys = shard.local_rows if isinstance(shard, SparseShard) else sum(b.size for b in shard.blocks.values())
    return {"keys": keys, "bytes": shard.nbytes, "admitted": 0, "rejected": 0, "evicted": 0, "over_budget": 0}
