"""The tables one pserver holds: each shard by name with its spec and kind, the budget they
share, and the creation of new ones.

Why an object of its own: a load replaces every shard at once (:meth:`TableSet.install`), a
create is sized by the table's kind against two budgets and built in a thread while the loop
serves, and every request finds its shard and kind here, refused when it addresses a table the
wrong way. The request handlers (core.py) then only run the push pipeline and the replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import structlog

from .. import wire
from ..errors import ErrorCode, ServerError
from ..specs import TableSpec, spec_to_dict
from ..storage.tables import TablesBudget
from .config import ServerConfig
from .kinds import TableKind, TableKinds
from .transport.service import Reply

log = structlog.get_logger("aps.server")

#: a shard of any kind (a storage-floor store; its kind says what it is)
Shard = Any


class TableSet:
    """This server's shards, specs and kinds, and the --max-tables-bytes budget they share."""

    def __init__(self, config: ServerConfig, kinds: TableKinds) -> None:
        self.config = config
        #: what this server does with each kind of table (kinds/): the only place that tells them apart
        self.kinds = kinds
        self.tables: dict[str, Shard] = {}
        self.specs: dict[str, TableSpec] = {}
        #: --max-tables-bytes: what the tables take, hash tables' growth included (storage/tables.py)
        self.budget = TablesBudget(config.max_tables_bytes)
        #: creates running in a thread: a second create of the same table waits for the first
        self.creating: dict[str, tuple[TableSpec, asyncio.Future[None]]] = {}

    def install(self, shards: dict[str, Shard]) -> None:
        """Hold the shards a load brought instead of those held, counted afresh."""
        self.tables = shards
        self.specs = {name: shard.spec for name, shard in shards.items()}
        self.budget = TablesBudget(self.config.max_tables_bytes)  # the tables it counted are gone
        for shard in shards.values():
            self.kinds.of(shard).count_in_budget(shard, self.budget)

    def create(self, spec: TableSpec) -> Reply:
        """CREATE_TABLE: an existing table of the same spec is fine; a create of one being
        created shares that create's outcome; else the kind sizes it against --max-table-bytes
        and --max-tables-bytes, and it is built in a thread (:meth:`_build`)."""
        kind = self.kinds.for_spec(spec)
        if kind is None:
            raise ServerError(ErrorCode.BAD_REQUEST, "spec is not a table")
        existing = self.specs.get(spec.name)
        if existing is not None:
            self._same_spec(existing, spec)
            return wire.Ok(op=wire.Op.CREATE_TABLE)
        creating = self.creating.get(spec.name)
        if creating is not None:  # another client's create of it is running: share its outcome
            self._same_spec(creating[0], spec)
            return _after(asyncio.shield(creating[1]), wire.Ok(op=wire.Op.CREATE_TABLE))
        index, servers = self.config.server_index, self.config.num_servers
        need = kind.new_nbytes(spec)
        limit = self.config.max_table_bytes
        if limit and need > limit:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {spec.name!r} would take {need} bytes ({_gib(need)}) on server {index} of {servers} "
                f"({kind.holds(spec)}), over this server's limit of {limit} bytes ({_gib(limit)}; aps-server --max-table-bytes)",
            )
        self._tables_fit(spec, kind.claim_nbytes(spec))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.creating[spec.name] = (spec, done)
        return self._build(kind, spec, need, done)

    def _tables_fit(self, spec: TableSpec, need: int) -> None:
        """Refuse (BAD_REQUEST) the table that would take this server's tables, with those being
        created, past --max-tables-bytes: a limit per table alone let one client create many.
        ``need``, and what the tables hold, as the budget counts them (:meth:`_claim_nbytes`)."""
        limit = self.config.max_tables_bytes
        if not limit:
            return
        held = self.budget.taken + sum(self._claim_nbytes(other) for other, _ in self.creating.values())
        if held + need > limit:
            raise ServerError(
                ErrorCode.BAD_REQUEST,
                f"table {spec.name!r} would take {need} bytes ({_gib(need)}) on server {self.config.server_index}, "
                f"whose {len(self.tables) + len(self.creating)} tables hold {held} ({_gib(held)}): over its limit "
                f"for all tables of {limit} bytes ({_gib(limit)}; aps-server --max-tables-bytes)",
            )

    def _claim_nbytes(self, spec: TableSpec) -> int:
        kind = self.kinds.for_spec(spec)
        assert kind is not None  # refused before it was counted as being created
        return kind.claim_nbytes(spec)

    @staticmethod
    def _same_spec(existing: TableSpec, spec: TableSpec) -> None:
        if existing != spec:
            raise ServerError(
                ErrorCode.TABLE_EXISTS, f"table {spec.name!r} exists with a different spec: {spec_to_dict(existing)}"
            )

    async def _build(self, kind: TableKind, spec: TableSpec, need: int, done: asyncio.Future[None]) -> wire.Message:
        """Allocate and initialise a shard in a thread (a 5 GB one takes seconds): the loop keeps
        serving meanwhile; creates of the same table that arrive in between wait for this one."""
        index = self.config.server_index
        try:
            try:
                shard = await asyncio.to_thread(kind.create, spec, self.config.max_table_bytes)
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
                kind.count_in_budget(shard, self.budget)
                log.info("table created", table=spec.name, kind=spec.kind, bytes=shard.nbytes)
        except BaseException as exc:
            done.set_exception(exc if isinstance(exc, ServerError) else ServerError(ErrorCode.INTERNAL, f"create failed: {exc!r}"))
            done.exception()  # read: nobody may be waiting, and that is not an error
            raise
        else:
            done.set_result(None)
        finally:
            self.creating.pop(spec.name, None)
        return wire.Ok(op=wire.Op.CREATE_TABLE)

    def info(self, name: str, detail: bool) -> dict[str, Any]:
        """TABLE_INFO's body: the spec, and with ``detail`` what the shard holds (its kind's contents)."""
        body: dict[str, Any] = spec_to_dict(self.spec(name))
        if detail:
            shard = self.tables[name]
            body = {"spec": body, **self.kinds.of(shard).contents(shard)}
        return body

    def stats(self) -> dict[str, dict[str, Any]]:
        """STATS' tables: each one's kind, bytes, size and (keyed kinds) key counts."""
        out = {}
        for name, spec in self.specs.items():
            shard = self.tables[name]
            kind = self.kinds.of(shard)
            out[name] = {"kind": spec.kind, "bytes": shard.nbytes, **kind.size(spec), **kind.counts(shard)}
        return out

    def spec(self, name: str) -> TableSpec:
        spec = self.specs.get(name)
        if spec is None:
            raise ServerError(ErrorCode.UNKNOWN_TABLE, f"no table named {name!r} on this server")
        return spec

    def get(self, name: str, by_ids: bool) -> tuple[Shard, TableKind]:
        """Table ``name``'s shard and kind, refused (UNKNOWN_TABLE) when there is none and
        (BAD_REQUEST) when the request addresses it the other way (by ids or by dense blocks)."""
        shard = self.tables.get(name)
        if shard is None:
            raise ServerError(ErrorCode.UNKNOWN_TABLE, f"no table named {name!r} on this server")
        kind = self.kinds.of(shard)
        if kind.by_ids != by_ids:
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {name!r} is {'dense, not sparse' if by_ids else 'sparse, not dense'}")
        return shard, kind

    def keyed(self, name: str) -> tuple[Shard, TableKind]:
        """Hash table ``name``'s shard and kind (SHRINK), refused unless it is one."""
        shard, kind = self.get(name, by_ids=True)
        if not kind.keyed:
            raise ServerError(ErrorCode.BAD_REQUEST, f"table {name!r} is not a hash table")
        return shard, kind


async def _after(done: Awaitable[Any], reply: wire.Message) -> wire.Message:
    await done
    return reply


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"
