"""An aps.torch network trained online: pass folders scored then trained, at the online batch,
every line once, its hash table's keys on the pservers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import aps
import aps.torch as at
from aps.cluster import ClusterSpec
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions
from aps.trainer.reader import Chunk
from tests.torch.test_step_equality import wide_lines, wide_meta

pytestmark = pytest.mark.timeout(120)


class Net(torch.nn.Module):
    def __init__(self, meta: at.Meta) -> None:
        super().__init__()
        self.emb = at.Embedding("emb", dim=4)
        self.out = torch.nn.Linear(meta.slots * 4 + 4 + meta.dense, meta.labels)

    def forward(self, f: at.Features) -> torch.Tensor:
        x = torch.cat([self.emb(f.slots).flatten(1), self.emb.pool(f.lists["hist"], "mean"), f.dense], 1)
        return self.out(x)


async def test_two_passes_of_a_two_task_network_are_scored_then_trained_at_32_lines_a_step(tmp_path: Path) -> None:
    data = tmp_path / "passes"
    lines = wide_lines(5) + wide_lines(6)
    for k, part in enumerate((lines[:160], lines[160:])):
        folder = data / "20261127" / f"000{k + 1}"
        folder.mkdir(parents=True)
        (folder / "part-00000").write_text("\n".join(part) + "\n")
        (folder / "_SUCCESS").write_text("")
    (data / "_SUCCESS").write_text("")
    metrics = tmp_path / "metrics.jsonl"
    model = at.TorchModel(Net, meta=wide_meta(tmp_path / "meta.json"), optimizer=aps.Adagrad(0.1))
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False, metrics_path=str(metrics))
        trainer = Trainer(model, Strategy(mode="async", workers=1), ClusterSpec([server.address], 1), 0, options)
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), OnlineOptions())
        async with aps.connect(server.address) as ps:
            keys = (await ps.table_info("emb")).keys
    finally:
        await server.aclose()
    assert model.batch_size == 32
    assert [p["examples"] for p in result.passes] == [160, 160] and [p["scored"] for p in result.passes] == [160, 160]
    epochs = [json.loads(line) for line in metrics.read_text().splitlines() if json.loads(line)["event"] == "epoch"]
    assert [e["steps"] for e in epochs] == [5, 5]
    assert all(np.isfinite(p["online_auc"]) for p in result.passes)
    # every distinct slot and list value of the two passes got a row (hash table, admit all)
    text = ("\n".join(lines) + "\n").encode()
    rec = model.format.parse(Chunk("all", 1, text, len(lines)), full_keys=True)
    assert keys == len(np.unique(np.concatenate([rec.ids.ravel(), rec.values])))
