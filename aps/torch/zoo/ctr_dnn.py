"""CTR-DNN (PaddlePaddle Fleet's distributed CTR example, the network of the built-in numba
``ctr_dnn``, :mod:`aps.models.ctr_dnn.model`) in PyTorch.

    aps-local 1x1 -- --model torch_ctr_dnn --model-arg meta=data/adult/meta.json \\
        --data data/adult/train_data --epochs 5 --save-dir model

The slots' embeddings (``SparseFeatFactors``, dim 10, Uniform(-init_range, init_range), 0.05)
concatenated with the dense columns -> FC 400 ReLU -> FC 400 ReLU -> FC 400 ReLU -> FC 1
(``mlp``), the FC weights Normal(0, 1/sqrt(fan_in)) and biases zero as the numba model's.

One difference, which leaves the model the same: one logit and binary cross-entropy where the
numba model has two outputs and a 2-way softmax. softmax(a, b) gives the click probability
sigmoid(b - a), so its last layer's two columns only ever act through their difference, which
is one column here; only that column's initial spread differs (1/sqrt(fan_in), not
sqrt(2)/sqrt(fan_in)). Adam on the pservers; the embedding in a hash table unless
``table=fixed`` (the numba model's default).
"""

from __future__ import annotations

import torch

from ...specs import Uniform
from .. import Embedding, Features, TorchModel
from .settings import mlp, numba_port


class CtrDnn(torch.nn.Module):
    def __init__(self, slots: int, dense: int, dim: int = 10, hidden: tuple[int, ...] = (400, 400, 400),
                 init_range: float = 0.05, kind: str = "hash") -> None:
        super().__init__()
        self.emb = Embedding("SparseFeatFactors", dim=dim, kind=kind, init=Uniform(-init_range, init_range))
        self.mlp = mlp(slots * dim + dense, hidden)

    def forward(self, f: Features) -> torch.Tensor:
        return self.mlp(torch.cat([self.emb(f.slots).flatten(1), f.dense], 1)).squeeze(1)


def build(meta: str, embedding_size: int = 10, hidden: str = "400,400,400", init_range: float = 0.05,
          lr: float = 0.001, optimizer: str = "adam", batch_size: int | None = None, table: str = "hash", seed: int = 0) -> TorchModel:
    """CTR-DNN on the data ``meta`` describes; every argument is a ``--model-arg``."""
    return numba_port("torch_ctr_dnn", CtrDnn, "mlp", meta=meta, embedding_size=embedding_size, hidden=hidden,
                      init_range=init_range, lr=lr, batch_size=batch_size, table=table, seed=seed, optimizer=optimizer)
