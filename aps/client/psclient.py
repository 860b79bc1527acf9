"""PSClient: the public async API over one or many pservers.

Splits ids by owning shard and dense tensors by block, chunks anything larger than a frame,
keeps many requests in flight on one connection per pserver, and retries with reconnect and
backoff. Every call has one timeout budget covering all of its parts and retries.

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

import asyncio
import json
import os
import ssl as _ssl
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import numpy as np

from .. import wire
from ..errors import ConfigError, ConnectionLost, ErrorCode, RequestTimeout, ServerError
from ..sharding import DenseBlock, dense_blocks, first_bad_id
from ..specs import DenseTable, SparseTable, TableSpec, spec_from_dict, spec_to_dict
from ..tls import client_context
from .coalesce import PullCoalescer
from .lanes import PortPlan, lane_address
from .link import Link

T = TypeVar("T")
#: bytes kept free in a frame for the header and small fields when sizing chunks
_FRAME_SLACK = 4096
#: longest wait between two reconnect attempts: a restarted pserver is found within this
_MAX_BACKOFF = 1.0
DEFAULT_DEADLINE = 120.0
DEFAULT_HEARTBEAT = 5.0


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
    ) -> None:
        if isinstance(addresses, str):
            addresses = [a for a in addresses.split(",") if a]
        if not addresses:
            raise ConfigError("connect() needs at least one pserver address")
        for address in addresses:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"pserver address must be host:port, got {address!r}")
        if retries < 0:
            raise ConfigError("retries must be >= 0")
        for name, value in (("deadline", deadline), ("heartbeat", heartbeat)):
            if not (value >= 0 and value < float("inf")):
                raise ConfigError(f"{name} must be a number of seconds >= 0, got {value}")
        self.addresses = list(addresses)
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
        lanes = len(self.addresses) * self.ports.lanes
        #: connection of lane ``j`` of server ``k`` at ``k * ports.lanes + j``
        self._links: list[Link | None] = [None] * lanes
        self._connecting: list[asyncio.Future[Link] | None] = [None] * lanes
        #: the version each pull reply gave, per (server, table, dense block or -1 for sparse):
        #: the next gradient push to that server names it as what it was computed from
        self._versions: dict[tuple[int, str, int], int] = {}
        self._next_request = 1
        self._specs: dict[str, TableSpec] = {}
        #: per sparse table, the small pulls in flight and those queued behind them
        self._coalescers: dict[str, PullCoalescer] = {}
        self._closed = False
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def num_servers(self) -> int:
        return len(self.addresses)

    # ----------------------------------------------------------------- lifecycle

    async def open(self) -> PSClient:
        """Connect to every pserver (concurrently) and check they agree on the cluster layout."""
        lanes = self.ports.lanes
        try:
            links = await self._budget(self._gather([self._link(k, j) for k in range(self.num_servers) for j in range(lanes)]))
        except BaseException:
            await self.aclose()  # no half-open client: close the links that did open
            raise
        for i, link in enumerate(links):
            k = i // lanes
            if link.num_servers != self.num_servers or link.server_index != k:
                await self.aclose()
                raise ConfigError(
                    f"pserver {link.address} says it is server {link.server_index} of {link.num_servers}, "
                    f"but it is number {k} of the {self.num_servers} addresses given: order or count is wrong"
                )
        if self.trainer_id >= 0 and self.heartbeat > 0 and self._heartbeat is None:
            self._heartbeat = asyncio.ensure_future(self._heartbeats())
        return self

    async def _heartbeats(self) -> None:
        """Ping every open connection each ``heartbeat`` seconds (or a quarter of the shortest
        lease a pserver announced, if less), so the pservers keep this
        trainer's lease while it computes. A ping that fails is not an error here: the link is
        then closed, and the next real call reconnects (within ``deadline``) or fails loudly."""
        while True:
            # four beats per lease, so that one late ping never costs a live trainer its lease
            leases = [link.lease / 4 for link in self._links if link is not None and link.lease > 0]
            interval = min([self.heartbeat, *leases])
            await asyncio.sleep(interval)
            links = [link for link in self._links if link is not None and not link.closed]
            pings = [link.request(wire.Ping(), self._request_id()) for link in links]
            try:
                async with asyncio.timeout(interval):
                    await asyncio.gather(*pings, return_exceptions=True)
            except TimeoutError:
                pass  # a server too busy to answer in time still got the ping: its lease is renewed

    def __await__(self) -> Any:
        return self.open().__await__()

    async def __aenter__(self) -> PSClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None
        for link in self._links:
            if link is not None:
                link.close()
        self._links = [None] * len(self._links)

    # ----------------------------------------------------------------- plumbing

    def _request_id(self, count: int = 1) -> int:
        rid = self._next_request
        self._next_request += count
        return rid

    async def _link(self, k: int, lane: int = 0) -> Link:
        i = k * self.ports.lanes + lane
        link = self._links[i]
        if link is not None and not link.closed:
            return link
        pending = self._connecting[i]
        if pending is None:
            pending = self._connecting[i] = asyncio.ensure_future(self._open_link(k, lane))
        try:
            link = await asyncio.shield(pending)
        finally:
            if pending.done():
                self._connecting[i] = None
        self._links[i] = link
        return link

    async def _open_link(self, k: int, lane: int = 0) -> Link:
        """Connect and handshake, bounded: a peer that accepts TCP but never answers must not
        wedge every later call to this server on one shared, never-finishing connect."""
        address = lane_address(self.addresses[k], lane)
        try:
            async with asyncio.timeout(self.timeout):
                link = await Link.open(
                    address, self.client_id, self.trainer_id, self.token, self.max_frame, self._request_id(2), ssl=self.ssl,
                )
        except TimeoutError:
            raise ConnectionLost(f"pserver {address} did not answer the handshake within {self.timeout} s") from None
        if self._links[k * self.ports.lanes + lane] is not None and (link.server_index, link.num_servers) != (k, self.num_servers):
            link.close()  # a reconnect found another server at this address: never mix shards
            raise ConfigError(
                f"pserver {link.address} now says it is server {link.server_index} of {link.num_servers}, "
                f"but it was server {k} of {self.num_servers}: restart it with the same index"
            )
        return link

    async def _call(
        self, k: int, msg: wire.Message, flags: int = 0, lane: int = 0, deadline: float | None = None, limit: float = 0.0
    ) -> wire.Message:
        """One request to server k (on its port ``lane``), retried on lost connections and
        retriable server errors.

        A lost connection, or a server that says it is shutting down, is retried (reconnecting
        with backoff) until ``deadline`` seconds after the first failure; other retriable
        refusals at most ``retries`` times. The request id stays the same across attempts, so
        the server drops a replayed push it has already applied and answers with the first reply.

        ``deadline`` (loop time; ``limit`` the seconds it stands for): the whole call, retries
        included, fails with :class:`RequestTimeout` once it passes. The link watches it, so a
        one-request call needs no timeout context of its own (see :meth:`_deadline`).
        """
        if self._closed:
            raise ConfigError("this client is closed")
        request_id = self._request_id()
        loop = asyncio.get_running_loop()
        attempt = refusals = 0
        first_failure: float | None = None
        while True:
            try:
                link = self._links[k * self.ports.lanes + lane]
                if link is None or link.closed:
                    link = await self._connect_by(k, lane, deadline, limit)
                return await link.request(msg, request_id, flags, deadline, limit)
            except ConnectionLost as exc:
                if isinstance(exc.__cause__, _ssl.SSLCertVerificationError):
                    raise  # an untrusted certificate stays untrusted: no retry
                error: ConnectionLost | ServerError = exc
            except ServerError as exc:
                if not exc.retriable:
                    raise
                if exc.code != ErrorCode.SHUTTING_DOWN:  # a refusal that may pass later, not a restart
                    refusals += 1
                    if refusals > self.retries:
                        raise
                error = exc
            now = loop.time()
            if deadline is not None and now >= deadline:
                raise RequestTimeout(f"call did not finish within {limit} s (last failure: {error})") from error
            first_failure = now if first_failure is None else first_failure
            waited = now - first_failure
            if waited >= self.deadline:
                if isinstance(error, ServerError):
                    raise error
                raise ConnectionLost(
                    f"pserver {lane_address(self.addresses[k], lane)} still unreachable {waited:.1f} s after the connection was lost "
                    f"(rpc deadline {self.deadline:g} s): {error}"
                ) from (error.__cause__ or error)
            pause = min(self.backoff * 2**attempt, _MAX_BACKOFF, self.deadline - waited)
            await asyncio.sleep(pause if deadline is None else min(pause, deadline - now))
            attempt += 1

    async def _connect_by(self, k: int, lane: int, deadline: float | None, limit: float) -> Link:
        """The link to server k's port ``lane``, (re)connecting if needed before ``deadline``."""
        if deadline is None:
            return await self._link(k, lane)
        try:
            async with asyncio.timeout_at(deadline):
                return await self._link(k, lane)
        except TimeoutError:
            raise RequestTimeout(f"call did not finish within {limit} s (connecting to server {k})") from None

    def _deadline(self, timeout: float | None | bool) -> tuple[float | None, float]:
        """The loop time a call given ``timeout`` must end by (None: no limit), and the limit."""
        limit = self.timeout if timeout is True else timeout
        if limit is None or limit is False:
            return None, 0.0
        return asyncio.get_running_loop().time() + float(limit), float(limit)

    async def _budget(self, work: Awaitable[T], timeout: float | None | bool = True) -> T:
        """Run ``work`` under one timeout budget (the client's default unless given)."""
        limit = self.timeout if timeout is True else timeout
        if limit is None or limit is False:
            return await work
        try:
            async with asyncio.timeout(float(limit)):
                return await work
        except TimeoutError:
            raise RequestTimeout(f"call did not finish within {limit} s") from None

    @staticmethod
    async def _gather(calls: Sequence[Awaitable[T]]) -> list[T]:
        """Run calls concurrently; on the first failure cancel the rest and raise that failure."""
        if len(calls) == 1:
            return [await calls[0]]
        tasks = [asyncio.ensure_future(c) for c in calls]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def _frame_budget(self) -> int:
        limit = min([self.max_frame] + [link.max_frame for link in self._links if link is not None])
        return max(1024, limit - _FRAME_SLACK)

    # ----------------------------------------------------------------- tables

    async def create_table(self, spec: TableSpec, timeout: float | None | bool = True) -> None:
        """Create a table on every pserver; idempotent for an identical spec.

        A table with this name but a different spec raises :class:`ServerError` (TABLE_EXISTS).
        """
        if not isinstance(spec, (SparseTable, DenseTable)):
            raise ConfigError(f"create_table needs a SparseTable or DenseTable, got {spec!r}")
        msg = wire.CreateTable(spec_json=json.dumps(spec_to_dict(spec)))
        await self._budget(self._gather([self._call(k, msg) for k in range(self.num_servers)]), timeout)
        self._specs[spec.name] = spec

    async def table_spec(self, name: str) -> TableSpec:
        """The spec of an existing table (asked from server 0 once, then cached)."""
        spec = self._specs.get(name)
        if spec is None:
            reply = await self._budget(self._call(0, wire.TableInfo(table=name)))
            assert isinstance(reply, wire.TextReply)
            spec = spec_from_dict(json.loads(reply.text))
            self._specs[name] = spec
        return spec

    async def _sparse_spec(self, name: str) -> SparseTable:
        spec = self._specs.get(name)
        if spec is None:
            spec = await self.table_spec(name)
        if not isinstance(spec, SparseTable):
            raise ConfigError(f"table {name!r} is dense; use the dense calls")
        return spec

    async def _dense_spec(self, name: str) -> DenseTable:
        spec = self._specs.get(name)
        if spec is None:
            spec = await self.table_spec(name)
        if not isinstance(spec, DenseTable):
            raise ConfigError(f"table {name!r} is sparse; use the sparse calls")
        return spec

    # ----------------------------------------------------------------- sparse

    def _ids(self, spec: SparseTable, ids: Any) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1 or not (arr.dtype.kind in "iu" or arr.size == 0):
            raise ConfigError(f"table {spec.name!r}: ids must be a 1-d integer array, got {arr.dtype} {arr.shape}")
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        bad = first_bad_id(arr, spec.rows)
        if bad >= 0:
            raise ConfigError(f"table {spec.name!r}: id {int(arr[bad])} not in [0, {spec.rows})")
        return arr

    def _rows(self, spec: SparseTable, ids: np.ndarray, values: Any) -> np.ndarray:
        arr = np.asarray(values)
        if arr.shape != (len(ids), spec.dim):
            raise ConfigError(f"table {spec.name!r}: values must have shape ({len(ids)}, {spec.dim}), got {arr.shape}")
        if arr.dtype.kind != "f":
            raise ConfigError(f"table {spec.name!r}: values must be floating point, got {arr.dtype}")
        return np.ascontiguousarray(arr, dtype=np.float32)

    def _chunks(self, n: int, row_bytes: int) -> list[slice]:
        per = max(1, self._frame_budget() // row_bytes)
        return [slice(i, min(n, i + per)) for i in range(0, n, per)] or [slice(0, 0)]

    async def pull_sparse(self, table: str, ids: Any, timeout: float | None | bool = True) -> np.ndarray:
        """Rows for ``ids`` as float32 [len(ids), dim], in the caller's order (repeats allowed)."""
        spec = self._specs.get(table)
        if not isinstance(spec, SparseTable):
            spec = await self._sparse_spec(table)
        ids = self._ids(spec, ids)
        if self.num_servers == 1 and len(ids):
            max_rows = self._frame_budget() // (spec.dim * 4 + 8)
            if len(ids) <= max_rows:
                # one request to one server (the small, online-serving case): no grouping, no
                # gather, the deadline watched by the link instead of a timeout context, and
                # pulls made while one is in flight sent together behind it (coalesce.py)
                coalescer = self._coalescers.get(spec.name)
                if coalescer is None or coalescer.max_rows != max_rows:
                    coalescer = self._coalescers[spec.name] = PullCoalescer(
                        lambda i, d, lim, s=spec: self._pull_one(s, i, d, lim), max_rows
                    )
                deadline, limit = self._deadline(timeout)
                return await coalescer.pull(ids, deadline, limit)
        return await self._budget(self._pull_sparse(spec, ids), timeout)

    async def _pull_one(self, spec: SparseTable, ids: np.ndarray, deadline: float | None, limit: float) -> np.ndarray:
        """One PULL_SPARSE to the only server (``ids`` validated, fitting one frame)."""
        msg = wire.PullSparse(table=spec.name, ids=ids)
        reply = await self._call(0, msg, lane=self.ports.sparse_lane(0), deadline=deadline, limit=limit)
        assert isinstance(reply, wire.ArrayReply)
        self._versions[(0, spec.name, -1)] = reply.version
        return reply.values

    async def _pull_sparse(self, spec: SparseTable, ids: np.ndarray) -> np.ndarray:
        order, slices = _group_by_server(ids, self.num_servers)
        calls, targets, servers = [], [], []
        for k, part in enumerate(slices):
            shard_ids = ids[order[part]] if self.num_servers > 1 else ids
            lane = self.ports.sparse_lane(k)
            for chunk in self._chunks(len(shard_ids), spec.dim * 4 + 8):
                if chunk.stop > chunk.start:
                    calls.append(self._call(k, wire.PullSparse(table=spec.name, ids=shard_ids[chunk]), lane=lane))
                    targets.append((part, chunk))
                    servers.append(k)
        replies = await self._gather(calls)
        self._note_versions(spec.name, [(k, -1) for k in servers], replies)
        if len(replies) == 1 and len(ids) and self.num_servers == 1:
            return replies[0].values  # type: ignore[attr-defined,no-any-return]
        out = np.empty((len(ids), spec.dim), dtype=np.float32)
        for (part, chunk), reply in zip(targets, replies):
            rows = order[part][chunk]
            out[rows] = reply.values  # type: ignore[attr-defined]
        return out

    async def _push_rows(
        self, table: str, ids: Any, values: Any, delta: bool, flags: int, timeout: float | None | bool
    ) -> None:
        spec = await self._sparse_spec(table)
        ids = self._ids(spec, ids)
        values = self._rows(spec, ids, values)
        if not delta and len(ids) > self._chunks(len(ids), spec.dim * 4 + 8)[0].stop:
            # it will be chunked: a repeated id must still get one optimizer update with the summed
            # gradient, not one per chunk (which differs for Adagrad / Adam)
            ids, values = _sum_duplicates(ids, values)
        order, slices = _group_by_server(ids, self.num_servers)
        calls = []
        for k, part in enumerate(slices):
            rows = order[part] if self.num_servers > 1 else slice(None)
            shard_ids, shard_values = ids[rows], values[rows]
            chunks = self._chunks(len(shard_ids), spec.dim * 4 + 8)
            if delta and len(shard_ids) == 0:
                continue
            lane = self.ports.sparse_lane(k)
            based_on = self._versions.get((k, spec.name, -1), -1)
            for i, chunk in enumerate(chunks):
                last = wire.Flag.FINAL if i == len(chunks) - 1 else 0
                msg: wire.Message
                if delta:
                    msg = wire.PushSparseDelta(table=spec.name, ids=shard_ids[chunk], values=shard_values[chunk])
                else:
                    msg = wire.PushSparseGrad(table=spec.name, ids=shard_ids[chunk], values=shard_values[chunk], based_on=based_on)
                calls.append(self._call(k, msg, flags | last, lane))
        await self._budget(self._gather(calls), timeout)

    async def push_sparse_grad(
        self, table: str, ids: Any, grads: Any, *, sync: bool = False, timeout: float | None | bool = True
    ) -> None:
        """Push gradients; each pserver applies the table's optimizer to its rows.

        A repeated id counts every occurrence (gradients are summed before the update). With
        ``sync=True`` the call returns once every trainer pushed this step and the averaged
        gradient was applied (sync mode).
        """
        await self._push_rows(table, ids, grads, False, wire.Flag.SYNC if sync else 0, timeout)

    async def push_sparse_delta(self, table: str, ids: Any, deltas: Any, timeout: float | None | bool = True) -> None:
        """``param += delta`` for each row (GEO-SGD); repeated ids are summed."""
        await self._push_rows(table, ids, deltas, True, 0, timeout)

    async def pull_sparse_changed(self, table: str, timeout: float | None | bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Rows changed on the servers by other clients since this client's previous call.

        The first call registers this client and returns nothing. Returns (ids, rows).
        """
        spec = await self._sparse_spec(table)
        max_rows = max(1, self._frame_budget() // (spec.dim * 4 + 8))

        async def drain(k: int) -> list[wire.ChangedReply]:
            replies = []
            lane = self.ports.sparse_lane(k)
            while True:
                reply = await self._call(k, wire.PullSparseChanged(table=table, max_rows=max_rows), lane=lane)
                assert isinstance(reply, wire.ChangedReply)
                replies.append(reply)
                if not reply.more:
                    return replies

        per_server = await self._budget(self._gather([drain(k) for k in range(self.num_servers)]), timeout)
        replies = [r for rs in per_server for r in rs]
        ids = np.concatenate([r.ids for r in replies]) if replies else np.zeros(0, np.int64)
        values = np.concatenate([r.values.reshape(-1, spec.dim) for r in replies]) if replies else np.zeros((0, spec.dim), np.float32)
        return ids, values

    # ----------------------------------------------------------------- dense

    def _dense_parts(self, spec: DenseTable) -> list[tuple[DenseBlock, int, int, int]]:
        """(block, offset, count, lane) pieces each of which fits in one frame; every piece of
        one block on the same port of its server (lanes.py)."""
        per = max(1, self._frame_budget() // 4)
        parts = []
        for block in dense_blocks(spec.name, spec.size, self.num_servers):
            lane = self.ports.dense_lane(block.server)
            for offset in range(0, block.size, per):
                parts.append((block, offset, min(per, block.size - offset), lane))
        return parts

    def _note_versions(self, table: str, keys: Sequence[tuple[int, int]], replies: Sequence[wire.Message]) -> None:
        """Remember the version each pull reply read, per (server, block); of several replies
        for one key the oldest, as values read at it are part of what was pulled."""
        seen: dict[tuple[int, str, int], int] = {}
        for (k, block), reply in zip(keys, replies):
            version = reply.version  # type: ignore[attr-defined]
            key = (k, table, block)
            seen[key] = min(version, seen.get(key, version))
        self._versions.update(seen)

    async def pull_dense(self, table: str, timeout: float | None | bool = True) -> np.ndarray:
        """The whole dense table as float32 with the table's shape."""
        spec = await self._dense_spec(table)
        parts = self._dense_parts(spec)
        calls = [
            self._call(b.server, wire.PullDense(table=table, block=b.index, offset=off, count=cnt), lane=lane)
            for b, off, cnt, lane in parts
        ]
        replies = await self._budget(self._gather(calls), timeout)
        self._note_versions(table, [(b.server, b.index) for b, _, _, _ in parts], replies)
        out = np.empty(spec.size, dtype=np.float32)
        for (block, offset, count, _), reply in zip(parts, replies):
            out[block.start + offset : block.start + offset + count] = reply.values  # type: ignore[attr-defined]
        return out.reshape(spec.shape)

    async def _push_dense(self, table: str, values: Any, delta: bool, flags: int, timeout: float | None | bool) -> None:
        spec = await self._dense_spec(table)
        arr = np.asarray(values)
        if arr.size != spec.size or (arr.shape != spec.shape and arr.ndim != 1):
            raise ConfigError(f"table {table!r}: values must have shape {spec.shape}, got {arr.shape}")
        if arr.dtype.kind != "f":
            raise ConfigError(f"table {table!r}: values must be floating point, got {arr.dtype}")
        flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
        calls = []
        for block, offset, count, lane in self._dense_parts(spec):
            last = wire.Flag.FINAL if offset + count == block.size else 0
            piece = flat[block.start + offset : block.start + offset + count]
            msg: wire.Message
            if delta:
                msg = wire.PushDenseDelta(table=table, block=block.index, offset=offset, values=piece)
            else:
                based_on = self._versions.get((block.server, table, block.index), -1)
                msg = wire.PushDenseGrad(table=table, block=block.index, offset=offset, values=piece, based_on=based_on)
            calls.append(self._call(block.server, msg, flags | last, lane))
        await self._budget(self._gather(calls), timeout)

    async def push_dense_grad(self, table: str, grad: Any, *, sync: bool = False, timeout: float | None | bool = True) -> None:
        """Push a gradient of the whole dense table; the pservers apply its optimizer."""
        await self._push_dense(table, grad, False, wire.Flag.SYNC if sync else 0, timeout)

    async def push_dense_delta(self, table: str, delta: Any, timeout: float | None | bool = True) -> None:
        """``param += delta`` on the whole dense table (GEO-SGD)."""
        await self._push_dense(table, delta, True, 0, timeout)

    # ----------------------------------------------------------------- coordination

    async def barrier(self, name: str, count: int = 0, value: int = 0, timeout: float | None | bool = True) -> int:
        """Wait until ``count`` clients (default: the cluster's trainers) reached barrier ``name``.

        Returns the sum of every participant's ``value`` (trainers use it to agree, e.g. "does
        anyone still have data?"). Counted on server 0; a retried arrival counts once. Raises
        RequestTimeout if the others do not arrive in time: a barrier never silently passes.
        """
        reply = await self._budget(self._call(0, wire.Barrier(name=name, count=count, value=value)), timeout)
        assert isinstance(reply, wire.BarrierReply)
        return reply.total

    async def save(self, path: str, timeout: float | None | bool = None) -> None:
        """Every pserver writes its shard under ``path`` (a directory on the pservers' disks), all
        tagged with one new save id: a later load refuses shards of different saves."""
        save = wire.Save(path=path, save_id=uuid.uuid4().hex)
        await self._budget(self._gather([self._call(k, save) for k in range(self.num_servers)]), timeout)

    async def load(self, path: str, timeout: float | None | bool = None) -> None:
        """Every pserver replaces its tables with those of a checkpoint (re-sharded as needed)."""
        await self._budget(self._gather([self._call(k, wire.Load(path=path)) for k in range(self.num_servers)]), timeout)
        self._specs.clear()

    async def stats(self, timeout: float | None | bool = True) -> dict[str, Any]:
        """Per-pserver statistics keyed by address: tables, requests, bytes, per-op latency."""
        replies = await self._budget(self._gather([self._call(k, wire.Stats()) for k in range(self.num_servers)]), timeout)
        return {addr: json.loads(r.text) for addr, r in zip(self.addresses, replies)}  # type: ignore[attr-defined]

    async def ping(self, timeout: float | None | bool = True) -> None:
        await self._budget(self._gather([self._call(k, wire.Ping()) for k in range(self.num_servers)]), timeout)

    async def worker_done(self, trainer_id: int | None = None, timeout: float | None | bool = True) -> None:
        """Tell every pserver this trainer finished; they exit when all trainers have.

        Only a trainer may say so, and only of itself: the pservers refuse (BAD_REQUEST) another
        id than the ``trainer_id`` this client connected with."""
        tid = self.trainer_id if trainer_id is None else trainer_id
        if tid < 0:
            raise ConfigError("worker_done needs a trainer id (connect(..., trainer_id=i))")
        await self._budget(self._gather([self._call(k, wire.WorkerDone(trainer_id=tid)) for k in range(self.num_servers)]), timeout)


def _group_by_server(ids: np.ndarray, num_servers: int) -> tuple[np.ndarray, list[slice]]:
    """``ids[order]`` grouped by owning server, ``slices[k]`` selecting server k's part.

    The client sends global ids (each server validates and maps them to its rows once, at its
    edge), so no local ids are computed here. With one server the order is the identity."""
    if num_servers == 1:
        return np.arange(len(ids), dtype=np.int64), [slice(0, len(ids))]
    owner = ids % num_servers
    order = np.argsort(owner, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(owner, minlength=num_servers))))
    return order, [slice(int(bounds[k]), int(bounds[k + 1])) for k in range(num_servers)]


def _sum_duplicates(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per distinct id, the rows of repeated ids summed."""
    if len(ids) == 0:
        return ids, values
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    if len(starts) == len(ids):
        return ids, values
    return sorted_ids[starts], np.add.reduceat(values[order], starts, axis=0)


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
    """
    return PSClient(
        addresses, token=token, timeout=timeout, retries=retries, trainer_id=trainer_id, max_frame=max_frame, backoff=backoff,
        ssl=ssl, deadline=deadline, heartbeat=heartbeat, ports_num=ports_num, ports_num_for_sparse=ports_num_for_sparse,
    )

