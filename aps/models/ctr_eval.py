"""Offline inference of a CTR model from a pserver checkpoint: AUC, logloss and examples.

The reference's inference step loads the saved parameters, *resets the AUC state* ("set_zero")
and runs the network forward over the test files. Here the checkpoint may come from any number
of pservers (it is read back as one shard), the files are read by the trainers' own reader and parsed by the model's batcher,
and the forward pass is the model's ``forward`` kernel - the same code that trained it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import ConfigError, DataError
from ..metrics import Auc, logloss
from ..specs import DenseTable, HashTable, SparseTable
from ..trainer.files import expand_inputs
from ..trainer.model import Batch, Model, Params, WorkerContext
from ..trainer.reader import Chunk, read_chunks

if TYPE_CHECKING:
    from ..checkpoints.reader import Checkpoint


class Predictor(Protocol):
    """What a model needs for inference: its tables, its batches, a forward pass that fills the
    batch's probabilities, and :meth:`~aps.trainer.model.Model.predictions`."""

    def tables(self) -> list[SparseTable | DenseTable]: ...
    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]: ...
    def forward(self, batch: Batch, params: Params) -> float: ...
    def predictions(self, batch: Batch) -> tuple[np.ndarray, np.ndarray] | None: ...


@dataclass
class KeyedParams(Params):
    """Parameters read from a checkpoint with hash tables: those stay in the checkpoint
    (``keyed`` names them), and :meth:`for_batch` hands the model each batch's rows in the order
    of its unique keys, as the trainer's replica does (a key the checkpoint lacks reads its
    initial row, as a pull)."""

    checkpoint: Checkpoint | None = None
    keyed: tuple[str, ...] = ()

    def for_batch(self, batch: Batch) -> Params:
        assert self.checkpoint is not None
        rows = {name: self.checkpoint.pull(name, batch.sparse_ids[name]) for name in self.keyed}
        return Params({**self.sparse, **rows}, self.dense)


def load_params(model: Model, checkpoint: str | os.PathLike[str]) -> Params:
    """Every table of ``model`` from a checkpoint (saved by any number of pservers), whole;
    hash tables stay keyed in it (:class:`KeyedParams`)."""
    from ..checkpoints.reader import read_checkpoint  # server code only when reading checkpoints

    saved = read_checkpoint(checkpoint)
    sparse: dict[str, np.ndarray] = {}
    dense: dict[str, np.ndarray] = {}
    keyed: list[str] = []
    for spec in model.tables():
        if spec.name not in saved.specs:
            raise ConfigError(f"checkpoint {checkpoint} has no table {spec.name!r} (has {sorted(saved.specs)}): another model?")
        if table_shape(saved.spec(spec.name)) != table_shape(spec):  # init and optimizer do not matter for inference
            raise ConfigError(
                f"checkpoint {checkpoint}: table {spec.name!r} has shape {table_shape(saved.spec(spec.name))}, the model's is "
                f"{table_shape(spec)}; pass the model arguments it was trained with"
            )
        if spec.keyed:
            keyed.append(spec.name)
        elif spec.by_ids:
            sparse[spec.name] = saved.array(spec.name)
        else:
            dense[spec.name] = saved.array(spec.name)
    return KeyedParams(sparse, dense, saved, tuple(keyed)) if keyed else Params(sparse, dense)


def table_shape(spec: SparseTable | DenseTable | HashTable) -> tuple[Any, ...]:
    """What must agree between a model's table and a saved or served one: ("keys", dim) for a
    hash table, (rows, dim) for a fixed one, the shape of a dense one (init and optimizer may
    differ for inference)."""
    if spec.keyed:
        return ("keys", spec.dim)
    return spec.values_shape(0)


async def predict(
    model: Model, params: Params, files: Sequence[str], ctx: WorkerContext
) -> AsyncIterator[tuple[np.ndarray, np.ndarray]]:
    """Each batch's predicted click probabilities and labels over ``files`` (read by the
    trainers' own line-aligned reader, batched by the model, forward kernel only)."""
    for path in expand_inputs(list(files)):
        async for chunk in read_chunks(path, chunk_bytes=4 << 20):
            for batch in model.batches(chunk, ctx):
                model.forward(batch, params.for_batch(batch) if isinstance(params, KeyedParams) else params)  # type: ignore[attr-defined]
                predicted = model.predictions(batch)
                if predicted is None:
                    raise ConfigError(f"model {model.name!r} does not predict probabilities: no AUC to compute")
                yield predicted


def evaluate(model: Model, params: Params, files: Sequence[str], skip_bad_lines: bool = False) -> dict[str, Any]:
    """AUC (bucketed, from a reset state), mean logloss and example count over ``files``."""
    return asyncio.run(_evaluate(model, params, files, skip_bad_lines))


async def _evaluate(model: Model, params: Params, files: Sequence[str], skip_bad_lines: bool) -> dict[str, Any]:
    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0), skip_bad_lines=skip_bad_lines)
    return await summarize(predict(model, params, files, ctx), ctx, files)


async def summarize(scored: AsyncIterator[tuple[np.ndarray, np.ndarray]], ctx: WorkerContext,
                    files: Sequence[str]) -> dict[str, Any]:
    """AUC (bucketed, from a reset state), mean logloss, examples and the bad lines ``ctx``
    counted, over the (probabilities, labels) of every scored batch."""
    auc = Auc()  # a fresh, zeroed state: the reference's set_zero before inference
    loss_sum = 0.0
    examples = 0
    async for probs, labels in scored:
        auc.update(probs, labels)
        loss_sum += logloss(probs, labels) * len(labels)
        examples += len(labels)
    if examples == 0:
        raise DataError("no examples in the test files", ", ".join(map(str, files)))
    return {"auc": auc.global_auc(), "logloss": loss_sum / examples, "examples": examples, "bad_lines": ctx.bad_lines}
