"""A network of your own, trained on aps's pservers: an MLP over embedded slots and the dense columns.

    python examples/wide_deep/prepare_adult.py --out data/adult        # a real data set, once
    cd examples/torch
    aps-local 1x1 -- --model my_net.py:build --data ../../data/adult/train_data --epochs 5 --save-dir model
    aps-infer --model my_net.py:build --checkpoint model/epoch_4 --data ../../data/adult/test_data

``meta`` is found in the working directory or beside this file; ``APS_META`` names another
data set's meta.json. Copy the zoo's files (aps/torch/zoo/) for DeepFM, DCN-V2, DIN or MMoE.
"""

from __future__ import annotations

import os

import torch

import aps
import aps.torch as at


class Net(torch.nn.Module):
    def __init__(self, slots: int, dense: int) -> None:
        super().__init__()
        self.emb = at.Embedding("feat", dim=8, kind="hash")          # rows in an aps hash table
        self.mlp = torch.nn.Sequential(torch.nn.Linear(slots * 8 + dense, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def forward(self, f: at.Features) -> torch.Tensor:               # f.slots int64 [B, S], f.dense float32 [B, D]
        x = self.emb(f.slots)                                          # [B, S, 8]
        return self.mlp(torch.cat([x.flatten(1), f.dense], 1)).squeeze(1)   # logits [B]


def build() -> at.TorchModel:
    meta = os.environ.get("APS_META", "../../data/adult/meta.json")
    return at.TorchModel(lambda m: Net(m.slots, m.dense), meta=meta, optimizer=aps.Adam(lr=1e-3))
