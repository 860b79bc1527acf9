"""MMoE (Ma et al. 2018, "Modeling Task Relationships in Multi-task Learning with Multi-gate
Mixture-of-Experts"): several tasks share experts, each task mixes them with its own gate.

    aps-local 1x1 -- --model mmoe --model-arg meta=DATA/meta.json --data DATA/train_data

One label column per task (meta.json ``"labels": 2``; ``examples/ctr_dnn/make_data.py --labels 2``
writes such data). x = the slots' embeddings (``mmoe.emb``) and the dense columns; ``experts``
MLPs over x; per task a softmax gate over the experts from x and a tower over the mixture, one
logit per task. The loss is the sum of the tasks' binary cross-entropies (aps.torch's loss for
several labels); the trainer's AUC is the first task's. Adam on the pservers; hash tables unless
``table=fixed``.
"""

from __future__ import annotations

import torch

from ...models.ctr_model import positive_int
from .. import Embedding, Features, Meta, TorchModel
from .settings import hidden_widths, mlp, zoo_model


class MMoE(torch.nn.Module):
    def __init__(self, meta: Meta, dim: int = 8, experts: int = 4, expert: tuple[int, ...] = (256, 128),
                 tower: tuple[int, ...] = (64,), kind: str = "hash") -> None:
        super().__init__()
        width = meta.slots * dim + meta.dense
        self.tasks = meta.labels
        self.emb = Embedding("mmoe.emb", dim=dim, kind=kind)
        self.experts = torch.nn.ModuleList(mlp(width, expert, out=None) for _ in range(experts))
        self.gates = torch.nn.ModuleList(torch.nn.Linear(width, experts) for _ in range(self.tasks))
        self.towers = torch.nn.ModuleList(mlp(expert[-1], tower) for _ in range(self.tasks))

    def forward(self, f: Features) -> torch.Tensor:
        x = torch.cat([self.emb(f.slots).flatten(1), f.dense], 1)
        experts = torch.stack([e(x) for e in self.experts], 1)                 # [B, E, width]
        logits = [tower((torch.softmax(gate(x), 1).unsqueeze(2) * experts).sum(1)).squeeze(1)
                  for gate, tower in zip(self.gates, self.towers)]
        return torch.stack(logits, 1) if self.tasks > 1 else logits[0]        # [B, tasks] or [B]


def build(meta: str, embedding_size: int = 8, experts: int = 4, expert: str = "256,128", tower: str = "64",
          lr: float = 0.001, optimizer: str = "adam", batch_size: int | None = None, table: str = "hash", seed: int = 0) -> TorchModel:
    """MMoE on the data ``meta`` describes (one task per label column); every argument is a ``--model-arg``."""
    dim, n = positive_int("mmoe", "embedding_size", embedding_size), positive_int("mmoe", "experts", experts)
    widths, towers = hidden_widths("mmoe", expert), hidden_widths("mmoe", tower)
    return zoo_model("mmoe", lambda m: MMoE(m, dim, n, widths, towers, table), meta=meta, lr=lr, batch_size=batch_size,
                     table=table, seed=seed, optimizer=optimizer)
