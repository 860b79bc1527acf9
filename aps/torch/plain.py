"""The same network in plain PyTorch, for a comparison run in one process (benchmarks, tests).

:func:`plain_network` copies a network and swaps each :class:`~aps.torch.Embedding` for a
``torch.nn.Embedding(buckets, dim, sparse=True)`` (ids hashed modulo the data's ``buckets``, as
aps's fixed tables): what a user would write without aps, trained with ``torch.optim.SparseAdam``
on those and ``torch.optim.Adam`` on the rest. Its rows are given (a pserver's, for a
step-for-step comparison) or drawn from the Embedding's own init.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch

from ..specs import Constant, Initializer, Normal, Uniform
from ..trainer.model import Batch
from .embedding import Embedding, pooled
from .features import Features, ListFeature
from .model import TorchModel


class PlainEmbedding(torch.nn.Embedding):
    """``torch.nn.Embedding`` with :meth:`aps.torch.Embedding.pool`, so a network that pools a
    list column runs unchanged; its last row is the padding row (zeros, no gradient) when the
    data has list columns."""

    def pool(self, values: ListFeature, mode: str = "sum") -> torch.Tensor:
        return pooled(self(values.ids), values, mode)


def plain_network(network: torch.nn.Module, buckets: int, rows: Mapping[str, np.ndarray] | None = None,
                  generator: torch.Generator | None = None, padding: bool = False) -> torch.nn.Module:
    """A deep copy of ``network`` whose Embeddings are sparse :class:`PlainEmbedding`\\ s; their
    weights are ``rows[table]`` when given, else drawn from each Embedding's init; with
    ``padding`` (the data has list columns) one more row, ``buckets``, pads the lists."""
    plain = copy.deepcopy(network)
    for module in list(plain.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, Embedding):
                if rows is not None:
                    weight = torch.from_numpy(np.array(rows[child.table_name], np.float32))
                else:
                    weight = draw(child.init, (buckets, child.dim), generator)
                pad = None
                if padding:
                    pad = len(weight)
                    weight = torch.cat([weight, weight.new_zeros(1, weight.shape[1])])
                setattr(module, child_name, PlainEmbedding.from_pretrained(weight, freeze=False, sparse=True, padding_idx=pad))
    return plain


def plain_features(model: TorchModel, batch: Batch) -> Features:
    """``batch`` (cut by ``model`` on fixed tables) for :func:`plain_network`'s copy: each
    position among the batch's keys mapped back to its id, which is the key's row in the plain
    tables, and list padding to the padding row (``buckets``)."""
    f = model.features(batch)
    ids = next(iter(batch.sparse_ids.values()))  # one key set for every Embedding table
    rows = torch.from_numpy(np.append(ids, model.format.buckets))
    lists = {name: ListFeature(rows[values.ids], values.mask, values.lengths) for name, values in f.lists.items()}
    return Features(rows[f.slots], f.dense, f.labels, lists)


def draw(init: Initializer, shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """Values from an aps initialiser, drawn by torch."""
    out = torch.empty(shape)
    if isinstance(init, Uniform):
        return out.uniform_(init.low, init.high, generator=generator)
    if isinstance(init, Normal):
        return out.normal_(init.mean, init.std, generator=generator)
    assert isinstance(init, Constant)
    return out.fill_(init.value)


def plain_optimizers(network: torch.nn.Module, lr: float) -> list[torch.optim.Optimizer]:
    """``SparseAdam`` on a plain network's sparse embeddings and ``Adam`` on the rest, at ``lr``."""
    sparse = [m.weight for m in network.modules() if isinstance(m, torch.nn.Embedding) and m.sparse]
    rest = [p for p in network.parameters() if all(p is not s for s in sparse)]
    out: list[torch.optim.Optimizer] = []
    if sparse:
        out.append(torch.optim.SparseAdam(sparse, lr=lr))
    if rest:
        out.append(torch.optim.Adam(rest, lr=lr))
    return out
