"""DeepFM (Guo et al. 2017, "DeepFM: A Factorization-Machine based Neural Network for CTR
Prediction"): a factorization machine and an MLP that share one embedding per feature.

    aps-local 1x1 -- --model deepfm --model-arg meta=data/adult/meta.json \\
        --data data/adult/train_data --epochs 5 --save-dir model

logit = bias + first-order weights (``fm.first``, dim 1 per feature, plus a linear term over the
dense columns) + the FM's pairwise term over the slots' embeddings (``fm.emb``) + an MLP over
those embeddings and the dense columns. Adam on the pservers; embeddings in hash tables unless
``table=fixed``. Written as a user's file would be (absolute imports): copy it to start your own.
"""

from __future__ import annotations

import torch

import aps.torch as at
from aps.specs import Constant
from aps.torch.zoo.settings import hidden_widths, mlp, zoo_model


class DeepFM(torch.nn.Module):
    def __init__(self, slots: int, dense: int, dim: int = 8, hidden: tuple[int, ...] = (400, 400, 400),
                 kind: str = "hash") -> None:
        super().__init__()
        self.first = at.Embedding("fm.first", dim=1, kind=kind, init=Constant(0.0))
        self.emb = at.Embedding("fm.emb", dim=dim, kind=kind)
        self.dense_first = torch.nn.Linear(dense, 1)
        self.mlp = mlp(slots * dim + dense, hidden)

    def forward(self, f: at.Features) -> torch.Tensor:
        v = self.emb(f.slots)                                      # [B, S, dim]
        first = self.first(f.slots).sum((1, 2)) + self.dense_first(f.dense).squeeze(1)
        fm = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)     # the sum over slot pairs of <v_i, v_j>
        deep = self.mlp(torch.cat([v.flatten(1), f.dense], 1)).squeeze(1)
        return first + fm + deep


def build(meta: str, embedding_size: int = 8, hidden: str = "400,400,400", lr: float = 0.001,
          optimizer: str = "adam", batch_size: int | None = None, table: str = "hash", seed: int = 0) -> at.TorchModel:
    """DeepFM on the data ``meta`` describes; every argument is a ``--model-arg``."""
    widths = hidden_widths("deepfm", hidden)
    return zoo_model("deepfm", lambda m: DeepFM(m.slots, m.dense, int(embedding_size), widths, table),
                     meta=meta, lr=lr, batch_size=batch_size, table=table, seed=seed, optimizer=optimizer)
