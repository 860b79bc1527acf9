"""The one interface a table kind implements on the server (imitating Paddle's ``ps/table/table.h``:
Pull / Push / Shrink / Save / Load, implemented there by memory sparse, memory dense and SSD
tables): how big a new shard is and how to make it, the checks a push gets once at the server
edge (:meth:`TableKind.accept`), how an accepted push is applied (now, or as one sync round),
how rows are pulled and what TABLE_INFO and STATS say of a shard.

A kind is stateless: the shard (a storage-floor store) is passed in. The core holds one kind
object per kind it serves, for its place in the cluster (server ``index`` of ``servers``), and
asks :meth:`~aps.server.kinds.TableKinds.of` for a store's kind, never ``isinstance``: a new
table kind is one subclass here, added to the kinds the core is built with.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ... import wire
from ...errors import ErrorCode, ServerError
from ...specs import TableSpec
from ...storage.tables import TablesBudget
from ..lag import SPARSE

_SORTED = int(wire.Flag.SORTED)

#: a push message any kind may be asked to accept
Push = wire.PushSparseGrad | wire.PushSparseDelta | wire.PushDenseGrad | wire.PushDenseDelta


@dataclass(frozen=True)
class Accepted:
    """A push that passed every check, in the form the shard applies: ``ids`` (a fixed
    table's local rows, a hash table's keys; None for dense), its ``values``, ``ordered``
    (the ids are ascending: the kernel needs no sort), ``part`` (what the lagged-gradient
    versions count it under: the table, or a dense block) and ``round_key`` (the sync round
    it joins). ``extra``: what else the kind needs (a hash push's shows and clicks, a dense
    push's block and offset)."""

    ids: np.ndarray | None
    values: np.ndarray
    ordered: bool
    part: int
    round_key: tuple[object, ...]
    extra: dict[str, Any]


class TableKind(ABC):
    """What the server does with one kind of table; one object per kind per server."""

    #: the table spec class this kind serves, and the store class its shards are
    spec_type: ClassVar[type[TableSpec]]
    store_type: ClassVar[type]
    #: pulled and pushed by ids (PULL_SPARSE, PUSH_SPARSE_*), else by dense blocks
    by_ids: ClassVar[bool]
    #: shrinkable (SHRINK, the scheduled shrinks) and grown or evicted ahead of need after pushes
    keyed: ClassVar[bool] = False

    #: a second kind for the same spec class, chosen by the spec's ``tier`` (a disk table)
    spec_tier: ClassVar[str | None] = None

    def __init__(self, index: int, servers: int, data_dir: Path | None = None) -> None:
        self.index = index
        self.servers = servers
        #: where a kind that keeps rows on disk keeps them (a directory per table under it)
        self.data_dir = data_dir

    # ---------------------------------------------------------------- making shards

    @abstractmethod
    def new_nbytes(self, spec: Any) -> int:
        """Bytes a new shard of ``spec`` takes on this server (--max-table-bytes)."""

    def holds(self, spec: Any) -> str:
        """What a create over --max-table-bytes says the bytes of :meth:`new_nbytes` are for."""
        return "values and optimizer state"

    def claim_nbytes(self, spec: Any) -> int:
        """Bytes a new shard of ``spec`` claims of --max-tables-bytes at its creation."""
        return self.new_nbytes(spec)

    @abstractmethod
    def create(self, spec: Any, max_table_bytes: int) -> Any:
        """This server's shard of a new table (run in a thread: a big one takes seconds)."""

    def count_in_budget(self, store: Any, budget: TablesBudget) -> None:
        """Count a shard this server now serves against --max-tables-bytes (its bytes, which
        never change; a growing kind claims its growth as it comes)."""
        budget.take(store.nbytes)

    # ---------------------------------------------------------------- requests

    def pull_rows(self, store: Any, ids: np.ndarray) -> np.ndarray | Awaitable[np.ndarray]:
        """PULL_SPARSE's rows (kinds addressed by ids), or for a kind that reads disk an
        awaitable of them (the core awaits it; the same for the applies below)."""
        raise NotImplementedError

    def pull_block(self, store: Any, block: int, offset: int, count: int, max_frame: int) -> np.ndarray:
        """PULL_DENSE's values (dense kinds), refused (TOO_LARGE) when over ``max_frame``."""
        raise NotImplementedError

    @abstractmethod
    def accept(self, store: Any, msg: Push, flags: int) -> Accepted:
        """Every check of a push, once (ownership, range, sortedness, shapes, dtypes), or the
        refusal (ServerError) before anything is applied or joins a round."""

    @abstractmethod
    def apply_grad(self, store: Any, push: Accepted, advance_step: bool, client: int) -> Awaitable[None] | None:
        """Apply an accepted async gradient push; ``advance_step``: the last chunk of a push."""

    @abstractmethod
    def apply_delta(self, store: Any, push: Accepted, advance_step: bool, client: int) -> Awaitable[None] | None:
        """Apply an accepted GEO delta push (``param += delta``)."""

    def round_rows(self, push: Accepted) -> np.ndarray:
        """What a sync round keeps of each chunk (the values; a kind may pack more)."""
        return push.values

    def round_final(self, push: Accepted, final: bool) -> bool:
        """Whether this chunk completes its trainer's part of the round (a push's last chunk)."""
        return final

    @abstractmethod
    def apply_round(
        self, store: Any, ids: np.ndarray | None, rows: np.ndarray, push: Accepted, scale: float, final: bool
    ) -> bool | Awaitable[bool]:
        """Apply a completed sync round (every trainer's rows, ``scale`` = 1 / trainers);
        returns whether it counts as one more update of ``push.part``."""

    def quiet(self, store: Any) -> asyncio.Lock | None:
        """The lock a kind whose requests run in threads holds while one runs, which a save takes
        to read the shard with none running (None: requests run on the loop, between saves)."""
        return None

    # ---------------------------------------------------------------- reports

    @abstractmethod
    def contents(self, store: Any) -> dict[str, int]:
        """A detailed TABLE_INFO's numbers beside the spec: ``keys``, ``bytes``, ``admitted``,
        ``rejected``, ``evicted``, ``over_budget``."""

    @abstractmethod
    def size(self, spec: Any) -> dict[str, Any]:
        """STATS' size fields of a table's spec."""

    @abstractmethod
    def gauges(self, store: Any) -> dict[str, int]:
        """The metrics' numbers of a shard (collector.py): ``values`` (float32 parameters held),
        and where the kind has them ``rows`` (a fixed table's) or ``keys`` with the admission
        events (``admitted``, ``rejected``, ``evicted``, ``over_budget``). Read from
        prometheus-client's thread: only reads."""

    def counts(self, store: Any) -> dict[str, int]:
        """STATS' key counts of a shard (keyed kinds); nothing by default."""
        return {}


def refuse_unsorted(flags: int, name: str, strictly_ascending: bool, what: str) -> None:
    """A push flagged SORTED whose ids are not unique and ascending is refused before anything
    is applied, so a client that lies cannot make a kernel skip a sort it needed."""
    if flags & _SORTED and not strictly_ascending:
        raise ServerError(ErrorCode.BAD_REQUEST, f"table {name!r}: push flagged SORTED but its {what} are not unique and ascending")


def check_rows(name: str, n: int, dim: int, values: np.ndarray) -> None:
    """A push's rows: float32 [n, dim]."""
    if values.dtype != np.float32 or values.shape != (n, dim):
        raise ServerError(
            ErrorCode.SHAPE_MISMATCH,
            f"table {name!r}: values must be float32 [{n}, {dim}], got {values.dtype} {list(values.shape)}",
        )


__all__ = ["Accepted", "Push", "SPARSE", "TableKind", "check_rows", "refuse_unsorted"]
