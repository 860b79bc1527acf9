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
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ApsError, ConfigError
from ..models.ctr_batches import CtrBatch, CtrBatcher
from ..models.ctr_model import OFFLINE_BATCH, ONLINE_BATCH, batch_size_arg, positive_int
from ..models.tabular import TabularFormat
from ..specs import Adam, Initializer, Optimizer, TableSpec
from ..trainer.model import Batch, Grads, Model, Params, WorkerContext
from ..trainer.reader import Chunk
from .batches import TabularBatch, TabularBatcher
from .dense import DenseBinding, dense_tables
from .embedding import Embedding
from .features import Features, ListFeature, Meta

NetworkFactory = Callable[[Meta], torch.nn.Module]


class TorchModel(Model):
    """Train ``network`` on aps: a ``torch.nn.Module``, or a function of the data's
    :class:`~aps.torch.Meta` that builds one (called once, here, with ``torch.manual_seed(seed)``).

    ``meta``: the data set's ``meta.json`` (the Criteo layout's fields), found relative to the
    working directory or else to the file that calls this. ``optimizer``: every table's unless an
    :class:`~aps.torch.Embedding` names its own (default Adam, lr 0.001, as the built-in CTR
    models). ``batch_size``: lines an update (default 1000, and 32 in online passes, as those):
    in sync, half_async and hybrid mode, whose workers' gradients are averaged into one update, each
    worker cuts batches of its share (:meth:`share_batch`). ``init``: initialisers by parameter
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
        self.format = TabularFormat.from_meta(meta_path)
        self.meta = Meta.of(self.format, meta_path)
        #: the user's batch_size, None when not given (then it depends on the run: begin_online)
        self.batch_size_arg = batch_size_arg(self.name, batch_size)
        self.batch_size = OFFLINE_BATCH if self.batch_size_arg is None else self.batch_size_arg
        #: the workers that share each update's batch_size lines (:meth:`share_batch`)
        self.sharing_workers = 1
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

    def share_batch(self, workers: int) -> None:
        """Each of ``workers`` cuts batches of ``batch_size / workers`` lines (rounded up), so an
        averaged update holds ``batch_size`` lines, as one PyTorch process's threads share one
        batch. Why: with whole batches each, 2 workers make half the updates an epoch, which
        cost 0.006 test AUC against plain PyTorch in runs that stop before they converge (DIN
        and MMoE on generated data, Adult cut into two files; bench/README.md, "torch_models.py")."""
        self.sharing_workers = positive_int(self.name, "workers", workers)
        self.__dict__.get("_process_local", {}).pop("batcher", None)  # one cut for the old share

    def update_shares(self) -> int:
        return self.sharing_workers

    def lines_per_batch(self) -> int:
        # a batch is this worker's share of batch_size lines: the readers hand over whole batches
        return -(-self.batch_size // self.sharing_workers)

    def max_batch_ids(self, table: str) -> int:
        most = self.lines_per_batch() * (self.format.slots + sum(c.max_len for c in self.format.lists))
        return most if self.hashed else min(most, self.format.buckets)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name, "network": type(self.network).__name__, "slots": self.format.slots,
            "dense": self.format.dense, **({"labels": self.format.labels} if self.format.labels > 1 else {}),
            **({"lists": dict(self.meta.lists)} if self.meta.lists else {}), "batch_size": self.batch_size, "optimizer": repr(self.optimizer),
            "embeddings": {name: e.dim for name, e in self.embeddings.items()},
            "parameters": sum(p.numel() for p in self.network.parameters()),
        }

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        return self.local("batcher", self._batcher).batches(chunk, ctx)

    def _batcher(self) -> CtrBatcher | TabularBatcher:
        """The CTR models' batcher for the Criteo layout (one label, no lists), else the tabular one."""
        tables = tuple(self.embeddings)
        if self.format.is_criteo:
            return CtrBatcher(self.format.base, self.lines_per_batch(), tables, self.hashed)
        return TabularBatcher(self.format, self.lines_per_batch(), tables, self.hashed)

    def warm_up(self, ctx: WorkerContext, local_sgd: bool) -> None:
        """One torch thread per compute worker process: the worker pool is the parallelism."""
        torch.set_num_threads(1)

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        """Gradients of the batch-mean loss into ``grads``; returns the summed loss."""
        loss = self._loss(batch, params, grads)
        (loss / batch.examples).backward()
        for leaf, buffer in self.local("copy_back", list):
            np.copyto(buffer, leaf.grad.numpy())
        return float(loss.detach())

    def forward(self, batch: Batch, params: Params) -> float:
        """Scoring: fill ``batch.data.probs``, no gradient; returns the summed loss."""
        with torch.no_grad():
            return float(self._loss(batch, params, None))

    def forward_rows(self, batch: Batch, rows: Mapping[str, np.ndarray], dense: Mapping[str, np.ndarray]) -> float:
        """Scoring with every Embedding table's rows in the order of the batch's unique ids (what
        a pull of ``batch.sparse_ids`` returns), whatever the table's kind: a scorer that pulls
        rows (:mod:`aps.torch.predictor`) never holds a fixed table whole."""
        with torch.no_grad():
            return float(self._loss(batch, Params(dict(rows), dict(dense)), None, by_position=True))

    def predictions(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """The first task's probabilities and labels (several tasks: AUC is the first's)."""
        data: CtrBatch | TabularBatch = batch.data
        return data.probs, data.labels if data.labels.ndim == 1 else data.labels[:, 0]

    # ------------------------------------------------------------ one step

    def _loss(self, batch: Batch, params: Params, grads: Grads | None, by_position: bool = False) -> torch.Tensor:
        """Bind the batch's rows and the dense replica, run the network: the summed binary
        cross-entropy over examples and tasks (batch.data.probs filled with the first task's)."""
        features = self.features(batch)
        self._bind(batch, params, grads, by_position or self.hashed)
        try:
            logits = self.network(features)
        except ApsError:
            raise
        except Exception as exc:  # the user's code: one line with its place and the data's shape, not aps's traceback
            raise ConfigError(
                f"{self.name}: the network's forward failed{_user_frame(exc)} on {batch.examples} examples of "
                f"{self.format.slots} slots, {self.format.dense} dense columns and {self.format.labels} label(s): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            for emb in self.embeddings.values():
                emb.batch_rows = None
        want = tuple(features.labels.shape)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != want:
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            what = "one logit per example" if len(want) == 1 else f"one logit per example and task ({want[1]} tasks)"
            raise ConfigError(f"{self.name}: the network must return {what}, shape {want}, got {got}")
        with torch.no_grad():
            first = logits if logits.ndim == 1 else logits[:, 0]
            batch.data.probs[:] = torch.sigmoid(first).numpy()
        return F.binary_cross_entropy_with_logits(logits, features.labels, reduction="sum")

    def features(self, batch: Batch) -> Features:
        """The batch as the network's ``forward`` sees it: slots and list values as positions
        among the batch's keys (``batch.sparse_ids``), lists padded one past the last of them."""
        data: CtrBatch | TabularBatch = batch.data
        n = batch.examples
        if isinstance(data, CtrBatch):
            slots = torch.from_numpy(data.inverse.astype(np.int64)).view(n, self.format.slots)
            return Features(slots, torch.from_numpy(data.dense), torch.from_numpy(data.labels))
        labels = torch.from_numpy(data.labels[:, 0] if self.format.labels == 1 else data.labels)
        lists = {}
        for j, column in enumerate(self.format.lists):
            ids = torch.from_numpy(data.lists[j])
            lengths = torch.from_numpy(data.lengths[:, j])
            lists[column.name] = ListFeature(ids, torch.arange(ids.shape[1]) < lengths.unsqueeze(1), lengths)
        return Features(torch.from_numpy(data.slots), torch.from_numpy(data.dense), labels, lists)

    def _bind(self, batch: Batch, params: Params, grads: Grads | None, by_position: bool) -> None:
        """The batch's rows to every Embedding (one zero row past them when lists pad to it), the
        dense replica and the gradient buffers to the parameters."""
        # (rows, gradient buffer) whose gradient is copied after the backward pass: a hash
        # table's buffer rows carry the shows and clicks too, and autograd accumulates only into
        # a gradient laid out as its tensor
        copy_back: list[tuple[torch.Tensor, np.ndarray]] = self.local("copy_back", list)
        copy_back.clear()
        for name, emb in self.embeddings.items():
            ids = batch.sparse_ids[name]
            table = params.sparse[name]
            # by position: row i is id i's (a hash table's slot area, pulled rows); else the replica by global id
            leaf = torch.from_numpy(table[: len(ids)] if by_position else table[ids])
            if grads is not None:
                leaf.requires_grad_(True)
                buffer = grads.sparse[name]
                if buffer.flags.c_contiguous:
                    leaf.grad = torch.from_numpy(buffer)  # accumulated in place: no copy
                else:
                    copy_back.append((leaf, buffer))
            emb.batch_rows = torch.cat([leaf, leaf.new_zeros(1, leaf.shape[1])]) if self.format.lists else leaf
        self.local("binding", lambda: DenseBinding(self.network)).bind(params.dense, None if grads is None else grads.dense)


#: code that is not the user's: aps and torch (a failure's place is the last frame outside them)
_LIBRARIES = (str(Path(__file__).resolve().parents[1]), str(Path(torch.__file__).resolve().parent))


def _user_frame(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame of ``exc`` in the user's code, or nothing."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_LIBRARIES)]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


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

