"""bin/aps-local 2x2 in every mode on a model defined outside aps, asserting the final loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT
from examples.linreg.model import make_data

# (mode, lr, epochs): the initial loss on this data is ~0.75 (labels have variance ~0.75)
MODES = [("sync", 0.5, 6), ("half_async", 0.4, 6), ("async", 0.1, 6), ("geo", 0.25, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("mode,lr,epochs", MODES, ids=[m[0] for m in MODES])
def test_aps_local_2x2(tmp_path: Path, mode: str, lr: float, epochs: int) -> None:
    make_data(tmp_path / "data", files=4, lines_per_file=1500)
    cmd = [
        sys.executable, str(BIN / "aps-local"), "2x2", "--mode", mode, "--timeout", "240", "--",
        "--model", "examples.linreg.model:LinReg", "--model-arg", f"lr={lr}",
        "--data", str(tmp_path / "data"), "--epochs", str(epochs), "--workers", "2", "--k-steps", "10",
        "--save-dir", str(tmp_path / "model"),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    losses = []
    for k in range(2):
        records = [json.loads(line) for line in (tmp_path / "log" / f"trainer.{k}.metrics.jsonl").read_text().splitlines()]
        epochs_seen = [r for r in records if r["event"] == "epoch"]
        assert [r["epoch"] for r in epochs_seen] == list(range(epochs))
        assert epochs_seen[0]["mode"] == mode
        losses.append((epochs_seen[0]["loss"], epochs_seen[-1]["loss"]))
    for first, last in losses:
        assert last < 0.2 * first and last < 0.05, losses
    # trainer 0 saved every epoch through the pservers, as 2 shards
    saved = sorted(p.name for p in (tmp_path / "model" / f"epoch_{epochs - 1}").iterdir())
    assert saved == ["shard-00000-of-00002", "shard-00001-of-00002"]
    for k in range(2):
        assert "pserver stopped" in (tmp_path / "log" / f"pserver.{k}.log").read_text()
