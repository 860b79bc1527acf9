"""aps.Trainer over pass folders, in process with real pservers and worker processes: every
pass is scored with the parameters before it (online AUC), then trained once; every record is
trained exactly once; the run stops with the source's reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest

import aps
from aps.cli.plot import curves
from aps.cluster import ClusterSpec
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions

from .models import CountingLR
from .passdata import write_pass

pytestmark = pytest.mark.timeout(90)


async def seen_counts(address: str, n: int) -> np.ndarray:
    async with aps.connect(address) as ps:
        return (await ps.pull_sparse("seen", np.arange(n)))[:, 0]


@pytest.mark.parametrize("mode", ["async", "geo"])
async def test_each_pass_is_scored_before_it_is_trained_and_trained_once(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "passes"
    write_pass(data, "20261126/0001", 0, 64)
    write_pass(data, "20261126/0002", 64, 64)
    (data / "_SUCCESS").write_text("")
    metrics = tmp_path / "metrics.jsonl"
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False, metrics_path=str(metrics))
        strategy = Strategy(mode=mode, workers=2, k_steps=1) if mode == "geo" else Strategy(mode=mode, workers=2)
        trainer = Trainer(CountingLR(), strategy, ClusterSpec([server.address], 1), 0, options)
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), OnlineOptions())
        counts = await seen_counts(server.address, 200)
    finally:
        await server.aclose()
    assert [p["pass"] for p in result.passes] == ["20261126/0001", "20261126/0002"]
    # the first pass meets a model that knows nothing; the second one a model that learnt the rule
    assert result.passes[0]["online_auc"] == 0.5 and result.passes[1]["online_auc"] == 1.0
    assert [p["scored"] for p in result.passes] == [64, 64] and [p["examples"] for p in result.passes] == [64, 64]
    assert counts[:128].tolist() == [1.0] * 128 and not counts[128:].any()  # scoring trained nothing
    assert result.stop_reason is not None and "end marker" in result.stop_reason
    assert trainer.probe.passes == 2 and trainer.probe.online_auc == 1.0
    exposition = generate_latest(trainer.registry).decode()
    assert 'aps_trainer_online_auc{trainer="0"} 1.0' in exposition and 'aps_trainer_passes_total{trainer="0"} 2.0' in exposition
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["online_auc"] for r in records if r["event"] == "epoch"] == [0.5, 1.0]


def test_aps_plot_draws_the_online_auc_of_every_pass() -> None:
    records = [
        {"event": "progress", "time": 1.0, "loss": 0.5},
        {"event": "epoch", "time": 2.0, "loss": 0.4, "online_auc": 0.5, "pass": "d/1"},
        {"event": "epoch", "time": 3.0, "loss": 0.3, "online_auc": 0.75, "pass": "d/2"},
    ]
    drawn = curves({0: records})
    assert [p.title for p in drawn.panels] == ["loss", "online AUC"]
    assert drawn.dots["online_auc"][0] == ([1.0, 2.0], [0.5, 0.75])
