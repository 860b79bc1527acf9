"""hybrid mode through ``aps-local`` with CTR-DNN: 1 pserver x 2 trainers and 2 x 2, 2 workers
each, on ``make_data.py --scale small`` (40,000 training lines, 4 files, seed 5): the run exits
0, every trainer's epoch records say hybrid and report the staleness of the sparse rows its steps
computed with (at most the ``--max-staleness`` given), and the model learns (running AUC).

The dense rounds run with ``--dense-lag 0`` (synchronous, the default, named here): this short
run's Adam lr (0.005 on 100 steps) is one the one-step delayed dense update of ``--dense-lag 1``
does not tolerate: its running AUC stays at 0.53-0.55 (0.70-0.72 without the lag), as delayed Adam does
in PyTorch on the same data (docs/modes.md, "hybrid"; tests/trainer/test_dense_lag.py checks
the lag's arithmetic)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.models.test_ctr_e2e import _run, train

pytestmark = pytest.mark.timeout(300)

#: Adam, batches of 200 (100 steps per trainer), a larger lr than the 400k-line tests use
MODEL_ARGS = ["lr=0.005", "init_range=0.05", "batch_size=200"]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ctr_hybrid") / "data"
    _run(
        [sys.executable, str(ROOT / "examples/ctr_dnn/make_data.py"), "--out", str(out), "--scale", "small",
         "--train-lines", "40000", "--test-lines", "1000", "--train-files", "4", "--seed", "5"],
        cwd=out.parent,
    )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("shape,bound", [("1x2", None), ("2x2", 2)])
def test_hybrid_through_aps_local(tmp_path: Path, small_data: Path, shape: str, bound: int | None) -> None:
    extra = ["--dense-lag", "0", *([] if bound is None else ["--max-staleness", str(bound)])]
    epochs = train(tmp_path, small_data, shape, "hybrid", MODEL_ARGS, epochs=1, trainer_extra=extra)
    assert [r["epoch"] for r in epochs] == [0]
    for k in range(2):
        path = tmp_path / "log" / f"trainer.{k}.metrics.jsonl"
        (record,) = [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "epoch"]
        assert record["mode"] == "hybrid"
        assert record["examples"] == 20000  # each trainer its two files
        assert record["staleness"] >= 0 and record["staleness_max"] >= 0
        if bound is not None:
            assert record["staleness_max"] <= bound
        assert record["loss"] < 0.6 and record["auc"] > 0.6, record
    saved = sorted(p.name for p in (tmp_path / "model" / "epoch_0").iterdir())
    assert len(saved) == int(shape[0])
