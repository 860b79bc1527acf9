"""DIN (Zhou et al. 2018, "Deep Interest Network for Click-Through Rate Prediction"): attention
of the candidate item over the user's behaviour sequence.

    aps-local 1x1 -- --model din --model-arg meta=DATA/meta.json --data DATA/train_data

The data's meta.json declares the sequence as a list column that shares the candidate's slot
(``"lists": [{"name": "history", "max_len": 50, "shares": 2}]``: its values are ids of that slot,
``examples/ctr_dnn/make_data.py --history 50`` writes such data). Every slot and every history item
is embedded by one table (``din.emb``); the paper's local activation unit, an MLP over
[h, c, h - c, h * c] for history item h and candidate c, weighs each item (no softmax, as the
paper, padding masked out), and the weighted sum joins the slots' embeddings and the dense
columns in an MLP (PReLU, the paper's Dice without its batch statistics), one logit per
label column. Adam on the
pservers; hash tables unless ``table=fixed``.
"""

from __future__ import annotations

import torch

from ...errors import ConfigError
from ...models.ctr_model import positive_int
from .. import Embedding, Features, Meta, TorchModel
from .settings import hidden_widths, zoo_model


class DIN(torch.nn.Module):
    def __init__(self, meta: Meta, dim: int = 8, hidden: tuple[int, ...] = (200, 80), attention: tuple[int, ...] = (80, 40),
                 kind: str = "hash") -> None:
        super().__init__()
        if not meta.shares:
            raise ConfigError(
                f"din needs a behaviour sequence: a list column that shares the candidate's slot in {meta.path} "
                '("lists": [{"name": "history", "max_len": 50, "shares": SLOT}])'
            )
        self.history, self.candidate = next(iter(meta.shares.items()))
        self.emb = Embedding("din.emb", dim=dim, kind=kind)
        self.attention = _prelu_mlp(4 * dim, attention, 1)
        self.mlp = _prelu_mlp(meta.slots * dim + dim + meta.dense, hidden, meta.labels)

    def forward(self, f: Features) -> torch.Tensor:
        slots = self.emb(f.slots)                                     # [B, S, dim]
        history = f.lists[self.history]
        h = self.emb(history.ids)                                     # [B, L, dim], padding zeros
        c = slots[:, self.candidate : self.candidate + 1].expand_as(h)
        weights = self.attention(torch.cat([h, c, h - c, h * c], 2)).squeeze(2) * history.mask
        interest = (weights.unsqueeze(2) * h).sum(1)                  # [B, dim]
        logits = self.mlp(torch.cat([slots.flatten(1), interest, f.dense], 1))
        return logits.squeeze(1) if logits.shape[1] == 1 else logits  # one logit per task


def _prelu_mlp(width: int, hidden: tuple[int, ...], out: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.PReLU()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, out))


def build(meta: str, embedding_size: int = 8, hidden: str = "200,80", attention: str = "80,40", lr: float = 0.001,
          optimizer: str = "adam", batch_size: int | None = None, table: str = "hash", seed: int = 0) -> TorchModel:
    """DIN on the data ``meta`` describes; every argument is a ``--model-arg``."""
    dim = positive_int("din", "embedding_size", embedding_size)
    widths, att = hidden_widths("din", hidden), hidden_widths("din", attention)
    return zoo_model("din", lambda m: DIN(m, dim, widths, att, table), meta=meta, lr=lr, batch_size=batch_size,
                     table=table, seed=seed, optimizer=optimizer)
