"""A fleet script asks for hash tables: the example scripts' --table hash (and the admission and
cap options) reach the model, and the pservers train, cap and save hash tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN
from tests.fleet.conftest import run
from tests.fleet.test_scripts import CTR_DNN, script_args, step_losses, summary_exits

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_a_fleet_script_trains_ctr_dnn_on_capped_hash_tables(tmp_path: Path, data: Path) -> None:
    done = run([sys.executable, str(BIN / "aps-local"), "2x1", "--status-interval", "0", "--", "python", str(CTR_DNN),
                *script_args(data, "async", 0.01), "--table", "hash", "--max-keys", "1000", "--save", "model/ctr"],
               tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary_exits(done.stdout) == {"pserver.0": "exit 0", "pserver.1": "exit 0", "trainer.0": "exit 0"}
    assert len(step_losses(tmp_path / "log" / "trainer.0.log", CTR_DNN)) == 80  # 4000 lines, batches of 50
    saved = tmp_path / "model" / "ctr" / "epoch_0"
    for k in range(2):
        entry = json.loads((saved / f"shard-0000{k}-of-00002" / "manifest.json").read_text())["tables"]["SparseFeatFactors"]
        assert entry["kind"] == "hash" and entry["spec"]["max_keys"] == 1000
        held = sum(entry["keys"].values())
        assert 0 < held <= 1000 and entry["admitted"] > 1000 and entry["evicted"] > 0  # the cap evicted
