"""PSClient: the public async API over one or many pservers.

Splits ids by owning shard and dense tensors by block, chunks anything larger than a frame
(fanout.py), keeps many requests in flight on one connection per pserver port (pool.py), and
retries with reconnect and backoff (retry.py). Every call has one timeout budget covering all
of its parts and retries; what a caller passes is checked before anything is sent (args.py).

A lost pserver is retried for a time, not a count: a call that loses its connection (or is
told the server is shutting down) reconnects with backoff until ``deadline`` seconds after its
first failure, long enough by default for a pserver to be restarted (docs/operations.md). A
trainer's client also sends a heartbeat ping every ``heartbeat`` seconds so that the pservers
can tell a quiet trainer from a dead one (aps-server --trainer-timeout).

With the v2 launch parameters (``ports_num`` / ``ports_num_for_sparse``) each pserver has several
ports and the client one connection per port, dense and sparse traffic on their own ports
(lanes.py). Pull replies say which version of the parameters they read; the next gradient push
to that server names it, so a pserver can drop gradients computed from parameters too old
(aps-server --async-lagged-grad-discard-ratio).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from .. import wire
from ..errors import ConfigError, RequestTimeout
from ..sharding import SparseSharding
from ..specs import (
    MAX_DAYS,
    TABLE_SPECS,
    DenseTable,
    HashTable,
    SparseTable,
    TableSpec,
    is_table_spec,
    spec_from_dict,
    spec_to_dict,
)
from ..storage.hash.accessor import SAVE_MODES
from ..tls import client_context
from ..validate import seconds
from .args import addresses_of, check_access, check_timing, dense_values, occurrence_counts, sparse_ids, sparse_rows
from .coalesce import PullCoalescer
from .export import ExportInfo, export
from .fanout import Versions, caller_rows, chunks, dense_parts, gather, row_bytes, shares, sum_duplicates
from .info import TableInfo, merge_info
from .lanes import PortPlan
from .link import Link
from .pool import LinkPool
from .retry import DEFAULT_DEADLINE, DEFAULT_HEARTBEAT, RetryPolicy, Timeout, call_deadline, call_limit, within

T = TypeVar("T")
Sparse = SparseTable | HashTable
#: save modes a client may name; only "full" is written so far
#: sends one request: (server, message, flags, lane, deadline, limit) -> reply (LinkPool.call)
Call = Callable[..., Awaitable[wire.Message]]
#: pulls ask for the model version (aps-serve answers with it; pservers ignore the bit)
_MODEL_VERSION = int(wire.Flag.MODEL_VERSION)


class PSClient:
    """Client of a parameter-server cluster. Create with :func:`aps.connect`."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        token: str | None = None,
        timeout: float | None = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        trainer_id: int = -1,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        ssl: Any = None,
        deadline: float = DEFAULT_DEADLINE,
        heartbeat: float = DEFAULT_HEARTBEAT,
        ports_num: int = 1,
        ports_num_for_sparse: int = 0,
        busy_poll: float = 0.0,
        specs: Sequence[type[Any]] = TABLE_SPECS,
    ) -> None:
        addresses = addresses_of(addresses)
        check_timing(timeout=timeout, retries=retries, backoff=backoff, deadline=deadline, heartbeat=heartbeat)
        seconds("busy_poll", busy_poll, "never spin")
        self.addresses = addresses
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline
        self.heartbeat = heartbeat
        self.trainer_id = trainer_id
        self.max_frame = max_frame
        self.ssl = client_context(ssl)
        self.client_id = int.from_bytes(os.urandom(8), "little") or 1
        #: which of each pserver's ports a request goes to (aps/client/lanes.py)
        self.ports = PortPlan(len(self.addresses), ports_num, ports_num_for_sparse)
        self._pool = LinkPool(
            self.addresses, self.ports, RetryPolicy(retries, backoff, deadline), client_id=self.client_id,
            trainer_id=trainer_id, token=token, max_frame=max_frame, ssl=self.ssl, timeout=timeout, heartbeat=heartbeat,
            busy_poll=busy_poll,
        )
        #: one request to server k, retried by the client's policy (bound once: the hot path)
        self._call: Call = self._pool.call
        self._versions = Versions()
        self._specs: dict[str, TableSpec] = {}
        #: the table spec classes this client creates tables of and reads specs back as (a
        #: pserver's TABLE_INFO, an export's manifest): ``specs``, and the class of each spec it
        #: is given to create, so a kind defined outside aps needs naming only where this client
        #: reads a table it did not create
        self._spec_types: tuple[type[Any], ...] = tuple(specs)
        #: per sparse table, the small pulls in flight and those queued behind them
        self._coalescers: dict[str, PullCoalescer] = {}
        #: who owns which ids (aps/sharding.py), by spec type: built once per kind of table
        self._shardings: dict[type, SparseSharding] = {}
        self._model_version: int | None = None

    @property
    def model_version(self) -> int | None:
        """The model version (export) of the newest pull reply that carried one: aps-serve tags
        every reply with the version it read; pservers do not (None until such a reply came).
        With concurrent pulls, ``pull_sparse(..., with_version=True)`` says which of them
        read which version."""
        return self._model_version

    @property
    def num_servers(self) -> int:
        return len(self.addresses)

    @property
    def _links(self) -> list[Link | None]:
        """The open links, lane ``j`` of server ``k`` at ``k * ports.lanes + j``."""
        return self._pool.links

    # ----------------------------------------------------------------- lifecycle

    async def open(self) -> PSClient:
        """Connect to every pserver (concurrently) and check they agree on the cluster layout."""
        await self._pool.open()
        return self

    def __await__(self) -> Any:
        return self.open().__await__()

    async def __aenter__(self) -> PSClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()

    # ----------------------------------------------------------------- plumbing

    async def _budget(self, work: Awaitable[T], timeout: Timeout = True) -> T:
        """Run ``work`` under one timeout budget (the client's default unless given); a call
        that runs out of it while a pserver is unreachable names that pserver."""
        try:
            return await within(work, call_limit(timeout, self.timeout))
        except RequestTimeout as exc:
            raise self._pool.outages.explain(exc) from exc

    def unreachable(self) -> list[dict[str, Any]]:
        """The pservers this client cannot reach right now, each as ``address``, ``since``
        (local time of the first failure), ``seconds``, ``waiting`` (the requests retrying
        toward it) and ``last_error`` (the last connect error); empty when all are reachable."""
        return self._pool.outages.report()

    async def _all(self, msg: wire.Message, timeout: Timeout) -> list[wire.Message]:
        """The same request to every pserver, under one timeout budget."""
        return await self._budget(gather([self._call(k, msg) for k in range(self.num_servers)]), timeout)

    def _rows_per_frame(self, row_bytes: int) -> int:
        return max(1, self._pool.frame_budget() // row_bytes)

    # ----------------------------------------------------------------- tables

    async def create_table(self, spec: TableSpec, timeout: Timeout = True) -> None:
        """Create a table on every pserver; idempotent for an identical spec.

        A table with this name but a different spec raises :class:`ServerError` (TABLE_EXISTS).
        """
        if not is_table_spec(spec, self._spec_types):
            raise ConfigError(f"create_table needs a SparseTable, HashTable or DenseTable, got {spec!r}")
        await self._all(wire.CreateTable(spec_json=json.dumps(spec_to_dict(spec))), timeout)
        self._specs[spec.name] = spec
        if type(spec) not in self._spec_types:  # a subclass of a known kind: read back as itself
            self._spec_types = (*self._spec_types, type(spec))

    async def table_spec(self, name: str) -> TableSpec:
        """The spec of an existing table (asked from server 0 once, then cached)."""
        spec = self._specs.get(name)
        if spec is None:
            reply = await self._budget(self._call(0, wire.TableInfo(table=name)))
            assert isinstance(reply, wire.TextReply)
            spec = spec_from_dict(json.loads(reply.text), self._spec_types)
            self._specs[name] = spec
        return spec

    async def table_info(self, name: str, timeout: Timeout = True) -> TableInfo:
        """Table ``name``'s spec and contents summed over every pserver: ``.keys`` held (a hash
        table's keys), ``.bytes``, and a hash table's ``.admitted``, ``.rejected``, ``.evicted``."""
        replies = await self._all(wire.TableInfo(table=name, detail=1), timeout)
        return merge_info([r.text for r in replies], self._spec_types)  # type: ignore[attr-defined]

    async def _sparse_spec(self, name: str) -> Sparse:
        spec = await self.table_spec(name)
        check_access(spec, by_ids=True)
        return spec  # type: ignore[return-value]

    def _sharding(self, spec: Sparse) -> SparseSharding:
        sharding = self._shardings.get(type(spec))
        if sharding is None:
            sharding = self._shardings[type(spec)] = SparseSharding.of(spec, self.num_servers)
        return sharding

    async def _dense_spec(self, name: str) -> DenseTable:
        spec = await self.table_spec(name)
        check_access(spec, by_ids=False)
        return spec  # type: ignore[return-value]

    # ----------------------------------------------------------------- sparse

    async def pull_sparse(self, table: str, ids: Any, timeout: Timeout = True, *, with_version: bool = False) -> Any:
        """Rows for ``ids`` as float32 [len(ids), dim], in the caller's order (repeats allowed).
        A hash table's keys are any int64 (or uint64 feature signs); an unknown key reads its
        initial row and is not inserted.

        ``with_version=True``: ``(rows, model version)``, every row read from that one version
        (aps-serve; a pull split over several requests that saw a new version arrive is pulled
        again); the version is None from pservers, which have none."""
        spec = self._specs.get(table)
        if spec is None or not spec.by_ids:
            spec = await self._sparse_spec(table)
        ids = sparse_ids(spec, ids)
        if with_version:
            return await self._budget(self._one_version(lambda: self._pull_sparse_parts(spec, ids)), timeout)
        if self.num_servers == 1 and len(ids):
            max_rows = self._pool.frame_budget() // (row_bytes(spec.dim))
            if len(ids) <= max_rows:
                # one request to one server (the small, online-serving case): no grouping, no
                # gather, the deadline watched by the link instead of a timeout context, and
                # pulls made while one is in flight sent together behind it (coalesce.py)
                coalescer = self._coalescers.get(spec.name)
                if coalescer is None or coalescer.max_rows != max_rows:
                    coalescer = self._coalescers[spec.name] = PullCoalescer(
                        lambda i, d, lim, s=spec: self._pull_one(s, i, d, lim), max_rows
                    )
                deadline, limit = call_deadline(timeout, self.timeout)
                return await coalescer.pull(ids, deadline, limit)
        return await self._budget(self._pull_sparse(spec, ids), timeout)

    def coalescing(self, table: str) -> tuple[int, int]:
        """(requests sent, pulls served) so far by ``table``'s small-pull path: under concurrent
        callers one request serves several pulls (coalesce.py); alone, each pull is a request."""
        coalescer = self._coalescers.get(table)
        return (coalescer.requests, coalescer.pulls) if coalescer is not None else (0, 0)

    async def _pull_one(self, spec: Sparse, ids: np.ndarray, deadline: float | None, limit: float) -> np.ndarray:
        """One PULL_SPARSE to the only server (``ids`` validated, fitting one frame)."""
        msg = wire.PullSparse(table=spec.name, ids=ids)
        reply = await self._call(0, msg, _MODEL_VERSION, self.ports.sparse_lane(0), deadline, limit)
        assert isinstance(reply, wire.ArrayReply)
        self._versions.read(0, spec.name, reply.version)
        if reply.model_version is not None:
            self._model_version = reply.model_version
        return reply.values

    def _model_versions(self, replies: list[Any]) -> set[int | None]:
        """The model versions ``replies`` carry (None for a pserver's); notes the newest."""
        seen = {r.model_version for r in replies}
        known = [v for v in seen if v is not None]
        if known:
            self._model_version = max(known)
        return seen

    async def _one_version(self, pull: Callable[[], Awaitable[tuple[np.ndarray, set[int | None]]]]) -> tuple[np.ndarray, int | None]:
        """``pull()`` again until all its parts come from one model version (a new version may
        arrive between the requests of a split pull; the caller's timeout bounds the tries)."""
        while True:
            values, seen = await pull()
            if len(seen) <= 1:
                return values, next(iter(seen), None)

    async def _pull_sparse(self, spec: Sparse, ids: np.ndarray) -> np.ndarray:
        return (await self._pull_sparse_parts(spec, ids))[0]

    async def _pull_sparse_parts(self, spec: Sparse, ids: np.ndarray) -> tuple[np.ndarray, set[int | None]]:
        """The rows of ``ids`` and the model versions their replies carried."""
        per = self._rows_per_frame(row_bytes(spec.dim))
        calls, targets, servers = [], [], []
        for share in shares(ids, self._sharding(spec)):
            lane = self.ports.sparse_lane(share.server)
            for chunk in chunks(len(share.ids), per):
                if chunk.stop > chunk.start:
                    msg = wire.PullSparse(table=spec.name, ids=share.ids[chunk])
                    calls.append(self._call(share.server, msg, _MODEL_VERSION, lane))
                    targets.append(caller_rows(share.rows, chunk))
                    servers.append(share.server)
        replies = await gather(calls)
        self._versions.note(spec.name, [(k, -1) for k in servers], replies)
        seen = self._model_versions(replies)
        if len(replies) == 1 and len(ids) and self.num_servers == 1:
            return replies[0].values, seen  # type: ignore[attr-defined]
        out = np.empty((len(ids), spec.dim), dtype=np.float32)
        for rows, reply in zip(targets, replies):
            out[rows] = reply.values  # type: ignore[attr-defined]
        return out, seen

    async def _push_rows(
        self, table: str, ids: Any, values: Any, delta: bool, flags: int, timeout: Timeout, shows: Any = None, clicks: Any = None
    ) -> None:
        spec = await self._sparse_spec(table)
        ids = sparse_ids(spec, ids)
        values = sparse_rows(spec, ids, values)
        counts = _counts(spec, ids, shows, clicks)
        per = self._rows_per_frame(row_bytes(spec.dim) + (8 if counts is not None else 0))
        if flags & wire.Flag.SORTED:
            pass  # unique already; each server's share and each chunk of it stays ascending
        elif not delta and len(ids) > per:
            # it will be chunked: a repeated id must still get one optimizer update with the summed
            # gradient, not one per chunk (which differs for Adagrad / Adam); a hash table's
            # occurrences then travel as shows (and clicks), summed with them
            if spec.keyed and counts is None:
                counts = _counts(spec, ids, np.ones(len(ids), np.float32), None)
                per = self._rows_per_frame(row_bytes(spec.dim) + 8)
            merged = values if counts is None else np.hstack([values, counts])
            ids, merged = sum_duplicates(ids, merged)
            values, counts = (merged, None) if counts is None else (merged[:, : spec.dim], merged[:, spec.dim :])
        calls = []
        for k, rows, shard_ids in shares(ids, self._sharding(spec)):
            if delta and len(shard_ids) == 0:
                continue
            shard_values = values[rows]
            shard_counts = counts[rows] if counts is not None else None
            parts = chunks(len(shard_ids), per)
            lane = self.ports.sparse_lane(k)
            based_on = self._versions.based_on(k, spec.name)
            for i, chunk in enumerate(parts):
                last = wire.Flag.FINAL if i == len(parts) - 1 else 0
                msg: wire.PushSparseDelta | wire.PushSparseGrad
                if delta:
                    msg = wire.PushSparseDelta(table=spec.name, ids=shard_ids[chunk], values=shard_values[chunk])
                else:
                    msg = wire.PushSparseGrad(table=spec.name, ids=shard_ids[chunk], values=shard_values[chunk], based_on=based_on)
                if shard_counts is not None:
                    msg.shows = np.ascontiguousarray(shard_counts[chunk, 0])
                    msg.clicks = np.ascontiguousarray(shard_counts[chunk, 1]) if shard_counts.shape[1] > 1 else None
                calls.append(self._call(k, msg, flags | last, lane))
        await self._budget(gather(calls), timeout)

    async def push_sparse_grad(
        self,
        table: str,
        ids: Any,
        grads: Any,
        *,
        shows: Any = None,
        clicks: Any = None,
        sync: bool = False,
        sorted_unique: bool = False,
        timeout: Timeout = True,
    ) -> None:
        """Push gradients; each pserver applies the table's optimizer to its rows.

        A repeated id counts every occurrence (gradients are summed before the update). With
        ``sync=True`` the call returns once every trainer pushed this step and the averaged
        gradient was applied (sync mode). ``sorted_unique=True`` promises the ids are unique
        and ascending (a trainer's merged push): the servers then skip their sort, and refuse
        the push (BAD_REQUEST, nothing applied) if the promise is broken.

        Hash tables: unknown keys are admitted by the table's rules first (the gradients of keys
        not admitted are dropped); ``shows`` and ``clicks`` (one number per id; default one
        show and no click per occurrence) feed the keys' statistics that ``shrink`` and a
        ``max_keys`` cap evict by.
        """
        await self._push_rows(table, ids, grads, False, _push_flags(sync, sorted_unique), timeout, shows, clicks)

    async def push_sparse_delta(
        self, table: str, ids: Any, deltas: Any, *, shows: Any = None, clicks: Any = None, sorted_unique: bool = False,
        timeout: Timeout = True,
    ) -> None:
        """``param += delta`` for each row (GEO-SGD); repeated ids are summed.
        ``sorted_unique``: as for :meth:`push_sparse_grad`. Hash tables: unknown keys are
        admitted as by a gradient push; ``shows`` and ``clicks`` (one number per id: what the
        local steps behind each delta saw; default one show and no click per id) feed the keys'
        statistics."""
        await self._push_rows(table, ids, deltas, True, _push_flags(False, sorted_unique), timeout, shows, clicks)

    async def pull_sparse_changed(self, table: str, timeout: Timeout = True) -> tuple[np.ndarray, np.ndarray]:
        """Rows changed on the servers by other clients since this client's previous call.

        The first call registers this client and returns nothing. Returns (ids, rows).
        """
        spec = await self._sparse_spec(table)
        max_rows = self._rows_per_frame(row_bytes(spec.dim))

        async def drain(k: int) -> list[wire.ChangedReply]:
            replies = []
            lane = self.ports.sparse_lane(k)
            while True:
                reply = await self._call(k, wire.PullSparseChanged(table=table, max_rows=max_rows), lane=lane)
                assert isinstance(reply, wire.ChangedReply)
                replies.append(reply)
                if not reply.more:
                    return replies

        per_server = await self._budget(gather([drain(k) for k in range(self.num_servers)]), timeout)
        replies = [r for rs in per_server for r in rs]
        ids = np.concatenate([r.ids for r in replies]) if replies else np.zeros(0, np.int64)
        values = np.concatenate([r.values.reshape(-1, spec.dim) for r in replies]) if replies else np.zeros((0, spec.dim), np.float32)
        return ids, values

    # ----------------------------------------------------------------- dense

    async def pull_dense(
        self, table: str, timeout: Timeout = True, *, with_version: bool = False, out: np.ndarray | None = None
    ) -> Any:
        """The whole dense table as float32 with the table's shape; ``with_version=True``:
        ``(values, model version)`` as for :meth:`pull_sparse`. ``out``: a C-contiguous float32
        array of the table's shape that the values are written into once every server's reply
        is in (returned; none allocated): a trainer's parameter buffer, so that its megabytes
        are not copied twice a round. A failed pull leaves it as it was."""
        spec = await self._dense_spec(table)
        if out is not None and (out.dtype != np.float32 or out.shape != spec.shape or not out.flags.c_contiguous):
            raise ConfigError(f"pull_dense {table!r}: out must be C-contiguous float32 of shape {list(spec.shape)}, "
                              f"got {out.dtype} {list(out.shape)}")
        if with_version:
            return await self._budget(self._one_version(lambda: self._pull_dense(spec, out)), timeout)
        return (await self._budget(self._pull_dense(spec, out), timeout))[0]

    async def _pull_dense(self, spec: DenseTable, into: np.ndarray | None = None) -> tuple[np.ndarray, set[int | None]]:
        table = spec.name
        parts = dense_parts(spec, self.num_servers, self.ports, self._rows_per_frame(4))
        calls = [
            self._call(
                p.block.server, wire.PullDense(table=table, block=p.block.index, offset=p.offset, count=p.count), _MODEL_VERSION, p.lane
            )
            for p in parts
        ]
        replies = await gather(calls)
        self._versions.note(table, [(p.block.server, p.block.index) for p in parts], replies)
        out = np.empty(spec.size, dtype=np.float32) if into is None else into.reshape(-1)
        for p, reply in zip(parts, replies):
            out[p.start : p.start + p.count] = reply.values  # type: ignore[attr-defined]
        return out.reshape(spec.shape) if into is None else into, self._model_versions(replies)

    async def _push_dense(self, table: str, values: Any, delta: bool, flags: int, timeout: Timeout) -> None:
        spec = await self._dense_spec(table)
        flat = dense_values(spec, values)
        calls = []
        for p in dense_parts(spec, self.num_servers, self.ports, self._rows_per_frame(4)):
            block = p.block
            last = wire.Flag.FINAL if p.offset + p.count == block.size else 0
            piece = flat[p.start : p.start + p.count]
            msg: wire.Message
            if delta:
                msg = wire.PushDenseDelta(table=table, block=block.index, offset=p.offset, values=piece)
            else:
                based_on = self._versions.based_on(block.server, table, block.index)
                msg = wire.PushDenseGrad(table=table, block=block.index, offset=p.offset, values=piece, based_on=based_on)
            calls.append(self._call(block.server, msg, flags | last, p.lane))
        await self._budget(gather(calls), timeout)

    async def push_dense_grad(self, table: str, grad: Any, *, sync: bool = False, timeout: Timeout = True) -> None:
        """Push a gradient of the whole dense table; the pservers apply its optimizer."""
        await self._push_dense(table, grad, False, wire.Flag.SYNC if sync else 0, timeout)

    async def push_dense_delta(self, table: str, delta: Any, timeout: Timeout = True) -> None:
        """``param += delta`` on the whole dense table (GEO-SGD)."""
        await self._push_dense(table, delta, True, 0, timeout)

    # ----------------------------------------------------------------- coordination

    async def barrier(self, name: str, count: int = 0, value: int = 0, timeout: Timeout = True) -> int:
        """Wait until ``count`` clients (default: the cluster's trainers) reached barrier ``name``.

        Returns the sum of every participant's ``value`` (trainers use it to agree, e.g. "does
        anyone still have data?"). Counted on server 0; a retried arrival counts once. Raises
        RequestTimeout if the others do not arrive in time: a barrier never silently passes.
        """
        reply = await self._budget(self._call(0, wire.Barrier(name=name, count=count, value=value)), timeout)
        assert isinstance(reply, wire.BarrierReply)
        return reply.total

    async def save(self, path: str, mode: str = "full", timeout: Timeout = None, *, extra: dict[str, Any] | None = None) -> None:
        """Every pserver writes its shard under ``path`` (a directory on the pservers' disks), all
        tagged with one new save id: a later load refuses shards of different saves.

        ``mode``: "full" (every table, every key). "base": a hash table's keys whose score is
        at least its ``base_threshold``; "delta": those whose delta score reached its
        ``delta_threshold`` since a base or delta save last wrote them (a delta needs a base
        saved first; its manifest names that base's save id). Fixed and dense tables are saved
        whole in every mode (docs/operations.md).

        ``extra``: a JSON-able dict written into this save's manifests (their ``extra``), such
        as an online trainer's position; loading the checkpoint gives it back."""
        if mode not in SAVE_MODES:
            raise ConfigError(f"save mode must be one of {', '.join(SAVE_MODES)}, got {mode!r}")
        text = None
        if extra is not None:
            try:
                text = json.dumps(extra)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"save extra must be JSON-serialisable: {exc}") from exc
        wire_mode = None if mode == "full" and text is None else mode  # a present extra needs the mode before it
        await self._all(wire.Save(path=path, save_id=uuid.uuid4().hex, mode=wire_mode, extra=text), timeout)

    async def export(self, root: str, kind: str, timeout: Timeout = None, *, rows: str = "stored") -> ExportInfo:
        """Write export ``root/<version>-<kind>/`` for serving (aps-serve) and return its
        :class:`~aps.client.export.ExportInfo` (version, base version, path, key counts).

        ``kind`` "base": every table, a hash table's keys whose score is at least its
        ``base_threshold``; "delta": a hash table's keys whose delta score reached its
        ``delta_threshold`` since the last base or delta export (fixed and dense tables whole in
        both). The version is one more than the highest in ``root`` (relative: from the pservers'
        checkpoint root); the export is complete once its manifest and done marker are written,
        after every pserver's shard. ``root`` must be storage the pservers and this client see
        at the same path (aps/client/export.py, docs/operations.md "Exports and serving").

        ``rows``: "stored" (the default) writes hash tables' rows as the tables store them, with
        their optimizer state and statistics (a pserver can load the export); "int8" writes
        each row as int8 codes and a float32 scale (dim + 4 bytes a key's row instead of 4 x dim
        with its state), for aps-serve only: each coordinate within half its row's scale."""
        async def first_root() -> tuple[str, str | None]:
            return self.addresses[0], (await self.checkpoint_roots()).get(self.addresses[0])

        return await export(lambda msg: self._all(msg, timeout), first_root, self.num_servers, root, kind, self._spec_types, rows)

    async def shrink(
        self, table: str, *, decay: float = 0.98, threshold: float = 0.8, ttl: int | None = None, days: int = 0,
        timeout: Timeout = None,
    ) -> int:
        """Evict a hash table's keys on every pserver; returns how many keys were deleted in all.

        The table's day first advances by ``days`` (a daily job passes 1: the reference's day
        tick). Then each key's show and click decay by ``decay``, and keys whose score ``0.1
        (show - click) + click`` is under ``threshold``, that no push reached in more than
        ``ttl`` of their shard's steps (None: no TTL), or unseen for more than the table's
        ``ttl_days`` days, are deleted (Paddle's CtrCommonAccessor rule and defaults). A retried
        call is not applied twice. Runs off each pserver's event loop."""
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0):
            raise ConfigError(f"shrink ttl must be None or a non-negative int, got {ttl!r}")
        if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days <= MAX_DAYS:
            raise ConfigError(f"shrink days must be an int in [0, {MAX_DAYS}], got {days!r}")
        if not 0.0 < decay <= 1.0 or not np.isfinite(threshold):
            raise ConfigError(f"shrink needs decay in (0, 1] and a finite threshold, got {decay}, {threshold}")
        msg = wire.Shrink(table=table, decay=float(decay), threshold=float(threshold), ttl=-1 if ttl is None else ttl,
                          days=days or None)  # absent: 0, so a frame without it means what it did
        replies = await self._all(msg, timeout)
        return sum(r.evicted for r in replies)  # type: ignore[attr-defined]

    async def load(self, path: str, timeout: Timeout = None, *, deltas: Sequence[str] = ()) -> None:
        """Every pserver replaces its tables with those of a checkpoint (re-sharded as needed).

        ``deltas``: delta saves to put over ``path`` (then a ``base`` save), in the order they
        were written: each hash table key a save wrote gets its row from the last one that
        wrote it; fixed and dense tables come from the last delta. Refused unless they are that
        base's deltas, each following the one before (aps/checkpoints/deltas.py)."""
        if isinstance(deltas, str) or not all(isinstance(d, str) and d for d in deltas):
            raise ConfigError(f"load deltas must be a list of paths, got {deltas!r}")
        await self._all(wire.Load(path=path, deltas=json.dumps(list(deltas)) if deltas else None), timeout)
        self._specs.clear()

    async def stats(self, timeout: Timeout = True) -> dict[str, Any]:
        """Per-pserver statistics keyed by address: tables, requests, bytes, per-op latency."""
        replies = await self._all(wire.Stats(), timeout)
        return {addr: json.loads(r.text) for addr, r in zip(self.addresses, replies)}  # type: ignore[attr-defined]

    async def checkpoint_roots(self, timeout: Timeout = True) -> dict[str, str | None]:
        """Each pserver's checkpoint root by address (SAVE and LOAD paths must lie in it;
        relative ones are taken from it), from its STATS reply; None for a server too old to
        say. :func:`aps.client.roots.check_checkpoint_path` checks a path against them."""
        return {addr: s.get("checkpoint_root") for addr, s in (await self.stats(timeout)).items()}

    async def ping(self, timeout: Timeout = True) -> None:
        await self._all(wire.Ping(), timeout)

    async def worker_done(self, trainer_id: int | None = None, timeout: Timeout = True) -> None:
        """Tell every pserver this trainer finished; they exit when all trainers have.

        Only a trainer may say so, and only of itself: the pservers refuse (BAD_REQUEST) another
        id than the ``trainer_id`` this client connected with."""
        tid = self.trainer_id if trainer_id is None else trainer_id
        if tid < 0:
            raise ConfigError("worker_done needs a trainer id (connect(..., trainer_id=i))")
        await self._all(wire.WorkerDone(trainer_id=tid), timeout)


def _counts(spec: Sparse, ids: np.ndarray, shows: Any, clicks: Any) -> np.ndarray | None:
    """A push's shows and clicks as float32 columns [n, 1] (shows) or [n, 2]; None when neither
    is given. Clicks without shows get one show per occurrence (the server's default)."""
    s = occurrence_counts(spec, ids, "shows", shows)
    c = occurrence_counts(spec, ids, "clicks", clicks)
    if s is None and c is None:
        return None
    if s is None:
        s = np.ones(len(ids), np.float32)
    return s[:, None] if c is None else np.column_stack([s, c])


def _push_flags(sync: bool, sorted_unique: bool) -> int:
    return (wire.Flag.SYNC if sync else 0) | (wire.Flag.SORTED if sorted_unique else 0)


def connect(
    addresses: Sequence[str] | str,
    token: str | None = None,
    timeout: float | None = 30.0,
    *,
    retries: int = 3,
    trainer_id: int = -1,
    max_frame: int = wire.DEFAULT_MAX_FRAME,
    backoff: float = 0.1,
    ssl: Any = None,
    deadline: float = DEFAULT_DEADLINE,
    heartbeat: float = DEFAULT_HEARTBEAT,
    ports_num: int = 1,
    ports_num_for_sparse: int = 0,
    busy_poll: float = 0.0,
    specs: Sequence[type[Any]] = TABLE_SPECS,
) -> PSClient:
    """A client for the pservers at ``addresses`` (``host:port``, in server-index order).

    Use as ``async with aps.connect([...]) as ps:`` or ``ps = await aps.connect([...])``.
    ``ssl``: None for plain TCP (the default), True for TLS verified against the system's CAs,
    or an :class:`ssl.SSLContext` (e.g. ``ssl.create_default_context(cafile="pserver.pem")``).
    ``deadline``: seconds a lost pserver is retried (reconnecting) before a call fails, 0 for no
    retry; ``retries``: how often other retriable refusals are; ``heartbeat``: seconds between
    the pings a trainer's client (``trainer_id >= 0``) sends to keep its lease, 0 for none.
    ``ports_num`` / ``ports_num_for_sparse``: the pservers' v2 launch parameters (each listens
    on that many consecutive ports from its address); this client then spreads dense-table
    traffic over the dense ports and sparse-table traffic over the sparse ones (aps/client/lanes.py).
    ``busy_poll``: seconds (e.g. 0.0002) to spin on the socket for the reply to a request sent
    while no other is in flight, instead of sleeping in the event loop; 0 (the default) never
    spins. It cuts a one-at-a-time caller's latency by the kernel's (and a virtual machine's)
    wake-up time, at the cost of a busy CPU while it waits, and briefly blocks the event loop
    (aps/client/link.py, ``Link.busy_poll``). Not over TLS.
    ``specs``: the table spec classes this client reads back (TABLE_INFO, an export's
    manifest): the package's; add a kind of spec defined outside aps to read a table of it
    that this client did not create (one it creates is read back as its own class).
    """
    return PSClient(
        addresses, token=token, timeout=timeout, retries=retries, trainer_id=trainer_id, max_frame=max_frame, backoff=backoff,
        ssl=ssl, deadline=deadline, heartbeat=heartbeat, ports_num=ports_num, ports_num_for_sparse=ports_num_for_sparse,
        busy_poll=busy_poll, specs=specs,
    )

