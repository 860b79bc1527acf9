"""DCN-V2 (Wang et al. 2021, "DCN V2: Improved Deep & Cross Network and Practical Lessons for
Web-scale Learning to Rank Systems"): cross layers and an MLP side by side over one input.

    aps-local 1x1 -- --model dcn_v2 --model-arg meta=data/adult/meta.json \\
        --data data/adult/train_data --epochs 5 --save-dir model

x0 = the slots' embeddings (``dcn.emb``) concatenated with the dense columns; ``cross`` layers
x_{l+1} = x0 * (W_l x_l + b_l) + x_l with full-rank W_l (``cross.0`` ...); in parallel an MLP over
x0 (``deep``); logit = a Linear over [x_L, the MLP's last hidden layer] (``out``): the paper's
parallel structure. Adam on the pservers; embeddings in hash tables unless ``table=fixed``.
"""

from __future__ import annotations

import torch

from ...models.ctr_model import positive_int
from .. import Embedding, Features, TorchModel
from .settings import hidden_widths, mlp, zoo_model


class DCNv2(torch.nn.Module):
    def __init__(self, slots: int, dense: int, dim: int = 8, hidden: tuple[int, ...] = (400, 400, 400),
                 cross: int = 3, kind: str = "hash") -> None:
        super().__init__()
        width = slots * dim + dense
        self.emb = Embedding("dcn.emb", dim=dim, kind=kind)
        self.cross = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(cross))
        self.deep = mlp(width, hidden, out=None)
        self.out = torch.nn.Linear(width + hidden[-1], 1)

    def forward(self, f: Features) -> torch.Tensor:
        x0 = torch.cat([self.emb(f.slots).flatten(1), f.dense], 1)   # [B, S * dim + dense]
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.out(torch.cat([x, self.deep(x0)], 1)).squeeze(1)


def build(meta: str, embedding_size: int = 8, hidden: str = "400,400,400", cross: int = 3, lr: float = 0.001,
          optimizer: str = "adam", batch_size: int | None = None, table: str = "hash", seed: int = 0) -> TorchModel:
    """DCN-V2 on the data ``meta`` describes; every argument is a ``--model-arg``."""
    widths = hidden_widths("dcn_v2", hidden)
    dim, layers = positive_int("dcn_v2", "embedding_size", embedding_size), positive_int("dcn_v2", "cross", cross)
    return zoo_model("dcn_v2", lambda m: DCNv2(m.slots, m.dense, dim, widths, layers, table),
                     meta=meta, lr=lr, batch_size=batch_size, table=table, seed=seed, optimizer=optimizer)
