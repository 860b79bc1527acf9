"""wide&deep (Cheng et al. 2016, "Wide & Deep Learning for Recommender Systems"; the network of
the built-in numba ``wide_deep``, :mod:`aps.models.wide_deep.model`) in PyTorch.

    aps-local 1x1 -- --model torch_wide_deep --model-arg meta=data/adult/meta.json \\
        --data data/adult/train_data --epochs 5 --save-dir model

logit = wide + deep. **wide**: a dim-1 weight per slot value (``wide.slot``, Constant(0)) summed
over the slots, a Linear over the dense columns (``wide_dense``, zero; none without dense
columns) and a bias (``wide_bias``, zero); **deep**: the slots' embeddings (``deep.emb``, dim 8,
Uniform(-init_range, init_range), 0.1) concatenated with the dense columns -> FC 400 ReLU ->
FC 400 ReLU -> FC 400 ReLU -> FC 1 (``deep``), FC weights Normal(0, 1/sqrt(fan_in)) and biases
zero, as the numba model's. Adam on the pservers for every table (the numba model's FTRL for the
wide part is not offered here); embeddings in hash tables unless ``table=fixed`` (the numba
model's default).
"""

from __future__ import annotations

import torch

from ...specs import Constant, Uniform
from .. import Embedding, Features, TorchModel
from .settings import mlp, numba_port


class WideDeep(torch.nn.Module):
    def __init__(self, slots: int, dense: int, dim: int = 8, hidden: tuple[int, ...] = (400, 400, 400),
                 init_range: float = 0.1, kind: str = "hash") -> None:
        super().__init__()
        self.wide = Embedding("wide.slot", dim=1, kind=kind, init=Constant(0.0))
        # the numba model's wide.dense and wide.b; no Linear without dense columns (no table of no elements)
        self.wide_dense = torch.nn.Linear(dense, 1, bias=False) if dense else None
        self.wide_bias = torch.nn.Parameter(torch.zeros(1))
        if self.wide_dense is not None:
            torch.nn.init.zeros_(self.wide_dense.weight)
        self.emb = Embedding("deep.emb", dim=dim, kind=kind, init=Uniform(-init_range, init_range))
        self.deep = mlp(slots * dim + dense, hidden)

    def forward(self, f: Features) -> torch.Tensor:
        wide = self.wide(f.slots).sum((1, 2)) + self.wide_bias
        if self.wide_dense is not None:
            wide = wide + self.wide_dense(f.dense).squeeze(1)
        deep = self.deep(torch.cat([self.emb(f.slots).flatten(1), f.dense], 1)).squeeze(1)
        return wide + deep


def build(meta: str, embedding_size: int = 8, hidden: str = "400,400,400", init_range: float = 0.1,
          lr: float = 0.001, optimizer: str = "adam", batch_size: int | None = None, table: str = "hash", seed: int = 0) -> TorchModel:
    """wide&deep on the data ``meta`` describes; every argument is a ``--model-arg``."""
    return numba_port("torch_wide_deep", WideDeep, "deep", meta=meta, embedding_size=embedding_size, hidden=hidden,
                      init_range=init_range, lr=lr, batch_size=batch_size, table=table, seed=seed, optimizer=optimizer)
