"""What the CTR models share: Criteo batches, the settings every one takes, AUC predictions.

A CTR model subclasses :class:`CriteoModel` and writes three things: its tables
(``_build_tables``), ``_forward`` (fill ``batch.data.probs``; return the summed loss and what
the backward pass needs) and ``compute`` (``_forward`` plus gradients). :mod:`aps.models.ctr_dnn.model` is the template.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..specs import SGD, Adagrad, Adam, Disk, HashTable, Initializer, Optimizer, SparseTable, TableSpec
from ..trainer.model import Batch, Model, Params, WorkerContext
from ..trainer.reader import Chunk
from .criteo import CriteoFormat
from .ctr_batches import CtrBatch, CtrBatcher
from .layers import MLP, Dense

OPTIMIZERS = ("adam", "sgd", "adagrad")
#: ``sparse_optimizer=``: ``same`` (the model's ``optimizer`` on every table) or another for the
#: sparse tables alone, at ``sparse_lr`` (``adagrad_rowwise``: one accumulator a row, sparse tables only)
SPARSE_OPTIMIZERS = ("same", *OPTIMIZERS, "adagrad_rowwise")
#: ``table=``: fixed arrays of ``buckets`` rows (ids hashed modulo buckets) or hash tables
#: (any 64-bit key, admitted and evicted on the pservers; docs/concepts.md, "Fixed or hash")
TABLE_KINDS = ("fixed", "hash")
#: lines a step when ``batch_size`` is not given: the reference's 1000 for files read in epochs;
#: 32 in online passes, where a pass of a few thousand lines at 1000 is a handful of steps
#: (docs/concepts.md, "The CTR models' optimizers, measured on real data")
OFFLINE_BATCH, ONLINE_BATCH = 1000, 32
#: the optimizer and rate of every table offline, and in online passes when neither ``optimizer``
#: nor ``lr`` is given: online, Adagrad's first step on a new id is its ``lr``
#: whatever the gradient's scale, Adam's about its ``lr`` of 0.001, and every pass brings new
#: ids (docs/concepts.md, "The CTR models' optimizers, measured on real data")
OFFLINE_OPTIMIZER, OFFLINE_LR = "adam", 0.001
ONLINE_OPTIMIZER, ONLINE_LR = "adagrad", 0.011
#: the slot embeddings' uniform init half-width in online passes, with the online optimizer and
#: unless ``init_range`` is given (offline: each model's ``offline_init_range``): an online model
#: is scored on each pass's new ids before it trains on them, and their random rows are noise in
#: every score they enter (docs/concepts.md, "The CTR models' optimizers, measured on real data")
ONLINE_INIT_RANGE = 0.02


def given(value: Any) -> bool:
    """Whether a model argument was given: None, or ``None`` / ``none`` as text
    (``--model-arg x=none``), leaves it to the run's default."""
    return value not in (None, "None", "none")


def batch_size_arg(model: str, value: Any) -> int | None:
    """``batch_size``: None (the default: :data:`OFFLINE_BATCH`, or :data:`ONLINE_BATCH` in online
    passes) or a positive integer, used everywhere."""
    return positive_int(model, "batch_size", value) if given(value) else None


def positive_int(model: str, name: str, value: Any, low: int = 1) -> int:
    """A model argument that must be an integer >= ``low`` (``--model-arg`` passes text too)."""
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{model} {name} must be an integer, got {value!r}") from None
    if out != float(value) or out < low:
        raise ConfigError(f"{model} {name} must be an integer >= {low}, got {value!r}")
    return out


def positive_float(model: str, name: str, value: Any, *, zero: bool = False) -> float:
    """A model argument that must be a finite number > 0 (>= 0 with ``zero``)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{model} {name} must be a number, got {value!r}") from None
    if not ((out > 0 or (zero and out == 0)) and out != float("inf")):
        raise ConfigError(f"{model} {name} must be a {'number >= 0' if zero else 'positive number'}, got {value!r}")
    return out


def make_optimizer(model: str, name: str, lr: float, bias_correction: str = "row", l2: float = 0.0) -> Optimizer:
    """``adam`` (the reference; sparse rows corrected per ``bias_correction``), ``sgd`` (needed
    by geo mode) or ``adagrad``, all at ``lr`` with L2 decay ``l2`` on the pservers."""
    if name == "adam":
        try:
            return Adam(lr, bias_correction=bias_correction, l2=l2)
        except ConfigError as exc:
            raise ConfigError(f"{model} {exc}") from None
    if name == "sgd":
        return SGD(lr, l2=l2)
    if name == "adagrad":
        return Adagrad(lr, l2=l2)
    if name == "adagrad_rowwise":
        return Adagrad(lr, l2=l2, rowwise=True)
    raise ConfigError(f"{model} optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


class CriteoModel(Model):
    """Base of models trained on Criteo-format lines (one label, dense columns, hashed slots).

    Takes the arguments every such model has (all accept text, for ``--model-arg``); the data
    layout is the reference's Criteo one unless ``meta`` names a ``meta.json`` describing another.
    ``table=hash`` keys the sparse tables by the full 64-bit hash of (slot, value), no modulo, as
    :class:`aps.HashTable` with ``admit_probability``, ``admit_count`` and ``max_keys`` (per
    pserver; None: unbounded); shows and clicks go with the gradients.
    ``l2``: L2 decay on every table, applied by the pservers to the rows a push touches.
    ``optimizer`` / ``lr``: unset, Adam at 0.001 offline and Adagrad at 0.011 in online passes
    (:meth:`begin_online`); either given, both hold in both (``lr`` default 0.001, ``optimizer``
    default Adam: a rate alone was chosen for Adam). ``init_range``: the slot embeddings' uniform
    init half-width; unset, the model's ``offline_init_range``, and :data:`ONLINE_INIT_RANGE` in
    online passes where the online optimizer holds.
    ``sparse_optimizer`` / ``sparse_lr``: the sparse tables' own optimizer and rate (``same``,
    the default: the model's ``optimizer`` and ``lr``), as embeddings are trained apart from dense
    layers in most CTR systems (row-wise Adagrad in TorchRec, Paddle's sparse Adagrad rule);
    ``adagrad_rowwise`` is that row-wise Adagrad, one accumulator a row.
    ``table_dtype``: how the pservers store the hash tables' values (``float32``, or ``float16``
    or ``bfloat16``: half the bytes, computed in float32; docs/concepts.md, "Compact rows");
    ``table_state_dtype``: their optimizer state (``float32`` or ``bfloat16``); ``table_stats``:
    their per-key statistics (``full``, or ``compact``: 16 bytes instead of 24, no last step).
    ``table_disk_ram``: bytes of RAM each pserver gives each hash table, the rest of its rows on
    the pserver's disk (None: all in RAM; docs/concepts.md, "Disk tables").
    """

    #: measured closest to one process's test AUC (README, "Against PyTorch"): dense fresh
    #: every step, sparse asynchronous
    preferred_mode = "hybrid"
    #: the fully connected stack, set by ``_build_tables``
    layers: list[Dense]
    #: the sparse tables indexed by the hashed slot ids (all get the same ids per batch)
    slot_tables: tuple[str, ...] = ()
    #: ``init_range`` when not given, offline (online: :data:`ONLINE_INIT_RANGE`)
    offline_init_range: float = 0.05

    def __init__(
        self, *, embedding_size: int, hidden: str, batch_size: int | None, lr: float | None, optimizer: str | None,
        init_range: float, meta: str | None, seed: int, bias_correction: str = "row", table: str = "fixed",
        admit_probability: float = 1.0, admit_count: int = 1, max_keys: int | None = None, l2: float = 0.0,
        sparse_optimizer: str = "same", sparse_lr: float | None = None, table_dtype: str = "float32",
        table_disk_ram: int | None = None, table_state_dtype: str = "float32", table_stats: str = "full",
    ) -> None:
        self.format = CriteoFormat() if meta is None else CriteoFormat.from_meta(meta)
        self.embedding_size = positive_int(self.name, "embedding_size", embedding_size)
        try:
            self.hidden = tuple(positive_int(self.name, "hidden", h) for h in str(hidden).split(","))
        except ConfigError:
            raise ConfigError(f"{self.name} hidden must be comma-separated positive widths, got {hidden!r}") from None
        #: the user's batch_size, None when not given (then it depends on the run: begin_online)
        self.batch_size_arg = batch_size_arg(self.name, batch_size)
        self.batch_size = OFFLINE_BATCH if self.batch_size_arg is None else self.batch_size_arg
        #: whether the user chose ``optimizer`` and ``lr``: then they hold online too (begin_online)
        self.optimizer_given, self.lr_given = given(optimizer), given(lr)
        self.lr = positive_float(self.name, "lr", lr) if self.lr_given else OFFLINE_LR
        self.optimizer = str(optimizer) if self.optimizer_given else OFFLINE_OPTIMIZER
        self.init_range_given = given(init_range)
        self.init_range = positive_float(self.name, "init_range", init_range) if self.init_range_given else self.offline_init_range
        self.seed = positive_int(self.name, "seed", seed, low=0)
        self.bias_correction = str(bias_correction)
        self.l2 = positive_float(self.name, "l2", l2, zero=True)
        if table not in TABLE_KINDS:
            raise ConfigError(f"{self.name} table must be one of {', '.join(TABLE_KINDS)}, got {table!r}")
        self.table_kind = str(table)
        if table_dtype != "float32" and self.table_kind != "hash":
            raise ConfigError(f"{self.name} table_dtype={table_dtype} stores hash tables' values: it needs table=hash")
        self.table_dtype = str(table_dtype)
        if table_state_dtype != "float32" and self.table_kind != "hash":
            raise ConfigError(f"{self.name} table_state_dtype={table_state_dtype} stores hash tables' state: it needs table=hash")
        self.table_state_dtype = str(table_state_dtype)
        if table_stats != "full" and self.table_kind != "hash":
            raise ConfigError(f"{self.name} table_stats={table_stats} lays out hash tables' statistics: it needs table=hash")
        self.table_stats = str(table_stats)
        if given(table_disk_ram) and self.table_kind != "hash":
            raise ConfigError(f"{self.name} table_disk_ram keeps hash tables' rows on disk: it needs table=hash")
        self.disk = Disk(ram_bytes=table_disk_ram) if given(table_disk_ram) else None
        self.admission = {
            "admit_probability": admit_probability, "admit_count": admit_count,
            "max_keys": max_keys if given(max_keys) else None,
        }
        if sparse_optimizer not in SPARSE_OPTIMIZERS:
            raise ConfigError(f"{self.name} sparse_optimizer must be one of {', '.join(SPARSE_OPTIMIZERS)}, got {sparse_optimizer!r}")
        self.sparse_optimizer = str(sparse_optimizer)
        self.sparse_lr_given = given(sparse_lr)
        self.sparse_lr = positive_float(self.name, "sparse_lr", sparse_lr) if self.sparse_lr_given else self.lr
        self._tables = self._make_tables()

    def _make_tables(self) -> list[TableSpec]:
        dense = make_optimizer(self.name, self.optimizer, self.lr, self.bias_correction, self.l2)
        sparse = dense if self.sparse_optimizer == "same" else make_optimizer(
            self.name, self.sparse_optimizer, self.sparse_lr, self.bias_correction, self.l2)
        return self._build_tables(dense, sparse)

    def _build_tables(self, optimizer: Optimizer, sparse_optimizer: Optimizer) -> list[TableSpec]:
        """The model's tables: ``sparse_optimizer`` for those indexed by slot ids, ``optimizer``
        for the rest."""
        raise NotImplementedError

    def _sparse_table(self, name: str, dim: int, init: Initializer, optimizer: Optimizer) -> SparseTable | HashTable:
        """One of the tables indexed by the slot ids, of the kind ``table=`` asks for."""
        if self.table_kind == "fixed":
            return SparseTable(name, self.format.buckets, dim, init, optimizer, seed=self.seed)
        try:
            return HashTable(name, dim, init, optimizer, seed=self.seed, dtype=self.table_dtype, disk=self.disk,
                             state_dtype=self.table_state_dtype, stats=self.table_stats, **self.admission)
        except ConfigError as exc:
            raise ConfigError(f"{self.name} {exc}") from None

    # ------------------------------------------------------------ contract

    def tables(self) -> list[TableSpec]:
        return list(self._tables)

    def begin_online(self) -> None:
        """Online passes train at :data:`ONLINE_BATCH` lines a step unless ``batch_size`` was given,
        and with :data:`ONLINE_OPTIMIZER` at :data:`ONLINE_LR` unless ``optimizer`` or ``lr`` was
        given, its embeddings then starting within :data:`ONLINE_INIT_RANGE` unless ``init_range``
        was given (a job that keeps an offline checkpoint's optimizer keeps its tables' init too,
        so it loads); ``sparse_lr`` unset follows ``lr``."""
        if self.batch_size_arg is None:
            self.batch_size = ONLINE_BATCH
        if not (self.optimizer_given or self.lr_given):  # a given lr was chosen for Adam
            self.optimizer, self.lr = ONLINE_OPTIMIZER, ONLINE_LR
            if not self.init_range_given:
                self.init_range = ONLINE_INIT_RANGE
        if not self.sparse_lr_given:
            self.sparse_lr = self.lr
        self._tables = self._make_tables()

    def lines_per_batch(self) -> int:
        return self.batch_size  # a batch is batch_size lines: the readers hand over whole batches

    def max_batch_ids(self, table: str) -> int:
        if self.table_kind == "hash":
            return self.batch_size * self.format.slots
        return min(self.batch_size * self.format.slots, self.format.buckets)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name, "slots": self.format.slots, "dense": self.format.dense,
            "embedding_size": self.embedding_size, "hidden": ",".join(map(str, self.hidden)),
            "batch_size": self.batch_size, "optimizer": self.optimizer, "lr": self.lr,
            **({"bias_correction": self.bias_correction} if "adam" in (self.optimizer, self.sparse_optimizer) else {}),
            **({"sparse_optimizer": self.sparse_optimizer, "sparse_lr": self.sparse_lr} if self.sparse_optimizer != "same" else {}),
            "table": self.table_kind, **(self.admission if self.table_kind == "hash" else {}),
            **({"table_dtype": self.table_dtype} if self.table_dtype != "float32" else {}),
            **({"table_disk_ram": self.disk.ram_bytes} if self.disk is not None else {}),
            **({"table_state_dtype": self.table_state_dtype} if self.table_state_dtype != "float32" else {}),
            **({"table_stats": self.table_stats} if self.table_stats != "full" else {}),
            **({"l2": self.l2} if self.l2 else {}),
        }

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        batcher = self.local("batcher", lambda: CtrBatcher(self.format, self.batch_size, self.slot_tables, self.table_kind == "hash"))
        return batcher.batches(chunk, ctx)

    def predictions(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        data: CtrBatch = batch.data
        return data.probs, data.labels

    def forward(self, batch: Batch, params: Params) -> float:
        """Fill ``batch.data.probs``; return the summed loss (inference uses this alone)."""
        return self._forward(batch, params)[0]

    def _forward(self, batch: Batch, params: Params) -> tuple[float, np.ndarray, np.ndarray]:
        """The forward pass: (summed loss, the first layer's input, dLoss/dLogits of the batch
        mean), for ``compute`` to carry on with the backward pass."""
        raise NotImplementedError

    def _mlp(self) -> MLP:
        """This process's buffers for the model's fully connected stack (``self.layers``)."""
        return self.local("mlp", lambda: MLP(self.layers, self.batch_size))

    def _buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 scratch array of this process, allocated on first use."""
        return self.local(name, lambda: np.zeros(shape, np.float32))
