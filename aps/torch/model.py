"""``aps.torch.TorchModel``: a user's ``torch.nn.Module`` as an aps model plug-in.

The runtime sees an ordinary :class:`~aps.trainer.model.Model`: tables (one per
:class:`~aps.torch.Embedding`, one dense table per parameter), batches (the Criteo / meta.json
reader the built-in CTR models use) and ``compute``. ``compute`` binds the batch's pulled rows and
the dense replica to the network (torch views, no copy), runs its forward pass, the loss
(binary cross-entropy on the logits, mean over the batch, as the built-in CTR models) and
autograd's backward pass, which writes the gradients into the runtime's buffers. The optimizers
are aps's, on the pservers.

A model object is pickled to start each worker process: the network goes with it (its class must
be importable, as a model file's is), the function that built it does not (it may be a lambda).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..models.criteo import CriteoFormat
from ..models.ctr_batches import CtrBatch, CtrBatcher
from ..models.ctr_model import OFFLINE_BATCH, ONLINE_BATCH, batch_size_arg, positive_int
from ..specs import Adam, Initializer, Optimizer, TableSpec
from ..trainer.model import Batch, Grads, Model, Params, WorkerContext
from ..trainer.reader import Chunk
from .dense import DenseBinding, dense_tables
from .embedding import Embedding
from .features import Features, Meta

NetworkFactory = Callable[[Meta], torch.nn.Module]


class TorchModel(Model):
    """Train ``network`` on aps: a ``torch.nn.Module``, or a function of the data's
    :class:`~aps.torch.Meta` that builds one (called once, here, with ``torch.manual_seed(seed)``).

    ``meta``: the data set's ``meta.json`` (the Criteo layout's fields), found relative to the
    working directory or else to the file that calls this. ``optimizer``: every table's unless an
    :class:`~aps.torch.Embedding` names its own (default Adam, lr 0.001, as the built-in CTR
    models). ``batch_size``: lines a step (default 1000, and 32 in online passes, as those). ``init``: initialisers by parameter
    name, for parameters whose distribution aps cannot read from their layer
    (:mod:`aps.torch.dense`). ``name``: the model's name in logs and metrics.

    The network's ``forward`` takes :class:`~aps.torch.Features` and returns one logit per
    example (``[B]``); the loss is binary cross-entropy on it, mean over the batch.
    """

    #: dense fresh every step, sparse asynchronous: the CTR models' measured choice
    preferred_mode = "hybrid"

    def __init__(
        self, network: torch.nn.Module | NetworkFactory, meta: str | Path, optimizer: Optimizer | None = None,
        batch_size: int | None = None, init: Mapping[str, Initializer] | None = None, seed: int = 0, name: str = "torch",
    ) -> None:
        self.name = str(name)
        meta_path = _find_meta(meta, sys._getframe(1).f_code.co_filename)
        self.format = CriteoFormat.from_meta(meta_path)
        self.meta = Meta.of(self.format, meta_path)
        #: the user's batch_size, None when not given (then it depends on the run: begin_online)
        self.batch_size_arg = batch_size_arg(self.name, batch_size)
        self.batch_size = OFFLINE_BATCH if self.batch_size_arg is None else self.batch_size_arg
        self.seed = positive_int(self.name, "seed", seed, low=0)
        self.optimizer = Adam() if optimizer is None else optimizer
        if not isinstance(network, torch.nn.Module):
            if not callable(network):
                raise ConfigError(f"{self.name}: network must be a torch.nn.Module or a function of Meta that builds one")
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                network = network(self.meta)
            if not isinstance(network, torch.nn.Module):
                raise ConfigError(f"{self.name}: the network function returned {type(network).__name__}, not a torch.nn.Module")
        self.network = network
        self.embeddings = _embeddings(self.name, network)
        _refuse_buffers(self.name, network)
        kinds = {e.kind for e in self.embeddings.values()}
        if len(kinds) > 1:
            raise ConfigError(f"{self.name}: the Embeddings mix kind='hash' and kind='fixed'; give them one kind")
        self.hashed = kinds == {"hash"}
        self._tables: list[TableSpec] = [
            e.spec(self.format.buckets, self.optimizer, self.seed) for e in self.embeddings.values()
        ] + dense_tables(network, self.optimizer, dict(init or {}), self.seed)

    # ------------------------------------------------------------ the plug-in contract

    def tables(self) -> list[TableSpec]:
        return list(self._tables)

    def begin_online(self) -> None:
        """Online passes train at 32 lines a step unless ``batch_size`` was given (as the
        built-in CTR models: docs/concepts.md)."""
        if self.batch_size_arg is None:
            self.batch_size = ONLINE_BATCH

    def max_batch_ids(self, table: str) -> int:
        most = self.batch_size * self.format.slots
        return most if self.hashed else min(most, self.format.buckets)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name, "network": type(self.network).__name__, "slots": self.format.slots,
            "dense": self.format.dense, "batch_size": self.batch_size, "optimizer": repr(self.optimizer),
            "embeddings": {name: e.dim for name, e in self.embeddings.items()},
            "parameters": sum(p.numel() for p in self.network.parameters()),
        }

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        batcher = self.local("batcher", lambda: CtrBatcher(self.format, self.batch_size, tuple(self.embeddings), self.hashed))
        return batcher.batches(chunk, ctx)

    def warm_up(self, ctx: WorkerContext, local_sgd: bool) -> None:
        """One torch thread per compute worker process: the worker pool is the parallelism."""
        torch.set_num_threads(1)

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        """Gradients of the batch-mean loss into ``grads``; returns the summed loss."""
        logits = self._logits(batch, params, grads)
        data: CtrBatch = batch.data
        labels = torch.from_numpy(data.labels)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        with torch.no_grad():
            data.probs[:] = torch.sigmoid(logits).numpy()
        return float(loss.detach()) * batch.examples

    def forward(self, batch: Batch, params: Params) -> float:
        """Scoring: fill ``batch.data.probs``, no gradient; returns the summed loss."""
        with torch.no_grad():
            logits = self._logits(batch, params, None)
            data: CtrBatch = batch.data
            loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(data.labels), reduction="sum")
            data.probs[:] = torch.sigmoid(logits).numpy()
        return float(loss)

    def predictions(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        data: CtrBatch = batch.data
        return data.probs, data.labels

    # ------------------------------------------------------------ one step

    def _logits(self, batch: Batch, params: Params, grads: Grads | None) -> torch.Tensor:
        """Bind the batch's rows and the dense replica, run the network; its logits ``[B]``."""
        data: CtrBatch = batch.data
        n = batch.examples
        for name, emb in self.embeddings.items():
            ids = batch.sparse_ids[name]
            table = params.sparse[name]
            rows = table[: len(ids)] if self.hashed else table[ids]
            leaf = torch.from_numpy(rows)
            if grads is not None:
                leaf.requires_grad_(True)
                leaf.grad = torch.from_numpy(grads.sparse[name])
            emb.batch_rows = leaf
        self.local("binding", lambda: DenseBinding(self.network)).bind(params.dense, None if grads is None else grads.dense)
        slots = torch.from_numpy(data.inverse.astype(np.int64)).view(n, self.format.slots)
        features = Features(slots, torch.from_numpy(data.dense), torch.from_numpy(data.labels))
        try:
            logits = self.network(features)
        finally:
            for emb in self.embeddings.values():
                emb.batch_rows = None
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (n,):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ConfigError(f"{self.name}: the network must return one logit per example, shape ({n},), got {got}")
        return logits


def _find_meta(meta: str | Path, caller: str) -> Path:
    """``meta`` as given, else next to the file that built the model (a model file names its
    data's meta.json relative to itself)."""
    path = Path(meta)
    if path.is_file() or path.is_absolute():
        return path
    beside = Path(caller).resolve().parent / path
    if beside.is_file():
        return beside
    raise ConfigError(f"meta file {str(meta)!r} not found in the working directory ({Path.cwd()}) nor beside {caller}")


def _embeddings(model: str, network: torch.nn.Module) -> dict[str, Embedding]:
    """The network's :class:`Embedding` modules by table name (a module used twice counts once)."""
    out: dict[str, Embedding] = {}
    for _, module in network.named_modules():
        if isinstance(module, Embedding):
            other = out.get(module.table_name)
            if other is not None and other is not module:
                raise ConfigError(f"{model}: two Embeddings are both named {module.table_name!r}; give each table its own name")
            out[module.table_name] = module
    return out


def _refuse_buffers(model: str, network: torch.nn.Module) -> None:
    """Buffers (BatchNorm's running statistics) would drift apart in every worker: no table
    holds them and no gradient trains them."""
    buffers = [name for name, _ in network.named_buffers()]
    if buffers:
        raise ConfigError(
            f"{model}: the network has buffers ({', '.join(buffers[:3])}{', ...' if len(buffers) > 3 else ''}), state "
            "that no gradient trains and that would differ per worker: use a layer without (LayerNorm, not BatchNorm)"
        )

