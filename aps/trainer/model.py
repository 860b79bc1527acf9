"""The model plug-in contract.

A model says three things and the runtime does the rest (files, workers, modes, pservers):

1. :meth:`Model.tables` - its sparse and dense tables;
2. :meth:`Model.batches` - how a chunk of input lines becomes batches (runs in a worker process,
   should parse with numba);
3. :meth:`Model.compute` - a batch's loss and gradients, given the parameters (a numba kernel).

Gradients are of the loss *as the model defines it* (say so in its docstring: mean or sum over
the batch); the runtime never rescales them, so a learning rate means the same locally and on
the pservers.

A model object is pickled once to start each worker process, so keep only settings in it;
per-process objects (buffers, lookup tables) go through :meth:`Model.local`, which never pickles them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from ..errors import ConfigError
from ..specs import DenseTable, HashTable, SparseTable, TableSpec
from .reader import Chunk


@dataclass
class Batch:
    """What a model's ``batches`` yields.

    ``sparse_ids[table]`` are the *unique* row ids the batch reads or updates; the runtime pulls
    exactly those rows before ``compute`` and expects gradients for exactly those rows. (With
    ``WorkerContext.local_sgd`` and a model that overrides :meth:`Model.local_sgd`, nothing is
    pulled nor gathered by id: the model may leave it empty.) ``data``
    is anything else the model needs (index arrays, labels), untouched by the runtime.
    """

    sparse_ids: dict[str, np.ndarray]
    examples: int
    data: Any = None
    #: per hash table (:class:`aps.HashTable`), float32 ``[len(sparse_ids[table]), 2]``: each
    #: id's shows and clicks in this batch, pushed with its gradient so that the pservers' shrink
    #: can score keys; a hash table without an entry pushes no statistics
    stats: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Params:
    """Parameters as the worker sees them: dense tensors; sparse tables indexed by global id, except
    hash tables (:class:`aps.HashTable`), whose keys are any int64: for those ``sparse[table]`` holds
    the rows of the batch's ids only, row ``i`` for ``batch.sparse_ids[table][i]``, so a model
    indexes it by position among the batch's unique ids (docs/concepts.md, "Fixed or hash")."""

    sparse: dict[str, np.ndarray]
    dense: dict[str, np.ndarray]


@dataclass
class Grads:
    """Gradient buffers, zeroed by the runtime before each ``compute``.

    ``sparse[table][i]`` is the gradient of row ``batch.sparse_ids[table][i]``;
    ``dense[table]`` has the table's shape.
    """

    sparse: dict[str, np.ndarray] = field(default_factory=dict)
    dense: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class WorkerContext:
    """Facts a model may use while making batches: who and where this worker is."""

    trainer_id: int
    worker_id: int
    num_trainers: int
    num_workers: int
    rng: np.random.Generator
    skip_bad_lines: bool = False
    bad_lines: int = 0
    #: the worker trains with the model's own :meth:`Model.local_sgd` (geo), never with
    #: :meth:`Model.compute`: a model whose local step works on global ids may then leave a
    #: batch's ``sparse_ids`` empty and skip the work of finding them
    local_sgd: bool = False


T = TypeVar("T")


class ModeRules(Protocol):
    """What a model's :meth:`Model.check_mode` is given: a mode's class
    (:func:`aps.trainer.modes.mode_class`), seen only as far as a model may need it."""

    #: the mode's name, as ``Strategy.mode`` spells it
    name: str
    #: workers train with SGD on their local replica (geo)
    local_sgd: bool
    #: the trainer's workers step together, their gradients averaged into one update (sync,
    #: half_async, hybrid's dense part)
    averages_workers: bool

    def table_problem(self, spec: TableSpec) -> str | None:
        """Why a table like ``spec`` cannot train in this mode, or None."""


class Model(ABC):
    """Base class of model plug-ins (word2vec, a user's own)."""

    #: a short name used in logs and metrics
    name: str = "model"
    #: the mode this model trains in when nothing names one (no ``--mode``, no ``APS_MODE``, no
    #: fleet strategy); None: async. The CTR models prefer hybrid (docs/modes.md, "hybrid").
    preferred_mode: str | None = None

    @abstractmethod
    def tables(self) -> list[TableSpec]:
        """Every table this model trains (created idempotently by every trainer)."""

    @abstractmethod
    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        """Turn whole lines of input into batches; raise DataError(file, line) on a bad line."""

    def lines_per_batch(self) -> int | None:
        """How many input lines make one of :meth:`batches`' batches, for a model whose batch is
        a count of lines (the CTR models' ``batch_size``): the readers then hand it chunks of whole
        batches (:func:`aps.trainer.reader.whole_batches`), so only a file's last batch is short.
        None (the default): batches are not counted in lines (word2vec's are word pairs)."""
        return None

    def share_batch(self, workers: int) -> None:
        """Called by every trainer before its workers start, with how many of them share each
        update: in a mode whose workers' gradients are averaged into one update (sync,
        half_async, hybrid), the workers that have data; else 1. A model whose batch size counts
        the lines of one update cuts each worker's batches to its share, so that the update holds
        that many lines however many workers compute it. The default keeps batches per worker
        (the built-in numba models: their defaults were measured that way)."""

    def update_shares(self) -> int:
        """How many workers' batches make one update since :meth:`share_batch` (1: each
        worker's batch is a whole update, the default)."""
        return 1

    @abstractmethod
    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        """Fill ``grads`` for ``batch`` and return the batch's summed loss (for monitoring)."""

    def begin_run(self, epochs: int) -> None:
        """Called once by the file-driven trainer, before any worker starts, with the run's epoch
        count (its ``--epochs``): a model whose schedule spans the whole run takes the count from
        here, so that there is one source of truth, and raises ConfigError (one line, saying what
        to pass) if it was given a different one itself. The default ignores it."""

    def begin_online(self) -> None:
        """Called once by the online trainer (passes from folders or a stream), before the runtime
        is built and before the model is sent to any worker: a model whose best settings differ
        when it learns from passes of a few thousand new lines, each scored before it is trained
        on, takes them here (the CTR models' batch: docs/concepts.md). The default does nothing."""

    def check_mode(self, mode: ModeRules) -> None:
        """Raise ConfigError if this model cannot train in ``mode`` (its class, from
        :func:`aps.trainer.modes.mode_class`; ``mode.name`` is the name a strategy gives). Called
        once at trainer start, by either kind of trainer, so a setting that a mode does not
        support fails before any work, with a line that says what to change. The default refuses
        the tables the mode itself cannot train (``mode.table_problem``: geo's local SGD, say);
        a model with settings of its own to check overrides it and calls this one too."""
        for spec in self.tables():
            problem = mode.table_problem(spec)
            if problem is not None:
                raise ConfigError(problem)

    def local_sgd(
        self, batch: Batch, params: Params, lrs: dict[str, float], dirty: dict[str, np.ndarray]
    ) -> float | None:
        """Optional fused geo step: apply ``param -= lr * grad`` for the batch in place and set
        ``dirty[table][id] = 1`` for every row written (after writing it); return the summed loss.

        Must compute exactly what :meth:`compute` followed by the SGD update computes; it only
        saves the gradient buffers. Models that do not override it get that two-step path.
        """
        return None

    def warm_up(self, ctx: WorkerContext, local_sgd: bool) -> None:
        """Optional: run this model's kernels once on a tiny made-up input, in a fresh worker
        process before it reports ready (``local_sgd``: the geo step, else :meth:`compute`).

        Why: a numba kernel's first call in a process loads it from the cache (or compiles it),
        and the very first one also sets numba up; that is about a second per worker. Workers
        start while their trainer connects to the pservers, so done here it costs no wall time,
        whereas on the first batch it delays training. Must leave no trace: not ``ctx``'s random
        stream, not the parameters, not any progress count. The default does nothing."""

    def predictions(self, batch: Batch) -> tuple[np.ndarray, np.ndarray] | None:
        """Optional, for classifiers: after :meth:`compute`, the batch's predicted probability of
        the positive class and its 0/1 labels. A model that returns them gets AUC (global and
        over the last 20 batches, merged across workers) in its progress reports and metrics."""
        return None

    def local(self, key: str, make: Callable[[], T]) -> T:
        """A per-process object (scratch buffers, lookup tables, a batcher) built by ``make`` on
        first use in this process and kept for the next calls; never pickled, so the model that
        is sent to each worker stays a handful of settings."""
        store = self.__dict__.setdefault("_process_local", {})
        if key not in store:
            store[key] = make()
        return store[key]  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_process_local", None)
        return state

    def max_batch_ids(self, table: str) -> int:
        """An upper bound on ``len(batch.sparse_ids[table])``, used to size shared buffers (a
        model with hash tables must say it: their keys have no bound)."""
        spec = self.table(table)
        if spec.keyed:
            raise ConfigError(f"model {self.name!r}: hash table {table!r} needs max_batch_ids() overridden (its keys are unbounded)")
        assert spec.by_ids, f"table {table!r} is not read by ids"
        return spec.entries(0)  # every row: a batch's unique ids are some of them

    def table(self, name: str) -> TableSpec:
        for spec in self.tables():
            if spec.name == name:
                return spec
        raise KeyError(name)

    def sparse_tables(self) -> list[SparseTable | HashTable]:
        """The tables a batch reads by id: fixed and hash."""
        return [t for t in self.tables() if t.by_ids]  # type: ignore[misc]

    def dense_tables(self) -> list[DenseTable]:
        return [t for t in self.tables() if not t.by_ids]  # type: ignore[misc]

    def describe(self) -> dict[str, Any]:
        """Settings worth logging at start."""
        return {"model": self.name}
