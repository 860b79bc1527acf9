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
from .embedding import Embedding


def plain_network(network: torch.nn.Module, buckets: int, rows: Mapping[str, np.ndarray] | None = None,
                  generator: torch.Generator | None = None) -> torch.nn.Module:
    """A deep copy of ``network`` whose Embeddings are sparse ``torch.nn.Embedding``\\ s; their
    weights are ``rows[table]`` when given, else drawn from each Embedding's init."""
    plain = copy.deepcopy(network)
    for module in list(plain.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, Embedding):
                if rows is not None:
                    weight = torch.from_numpy(np.array(rows[child.table_name], np.float32))
                else:
                    weight = draw(child.init, (buckets, child.dim), generator)
                setattr(module, child_name, torch.nn.Embedding.from_pretrained(weight, freeze=False, sparse=True))
    return plain


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
