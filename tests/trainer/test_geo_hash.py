"""geo mode on hash tables, against real pservers on port 0 and real worker processes.

The model is examples/linreg's on a hash table (tests/trainer/hash_models.py): with one trainer
and an exchange every step, geo is plain SGD, however small the trainer's cache (evictions hand
their pending deltas to the pservers and a key read again gets them back); with pservers that
evict every key twice during training (shrink), geo still reaches the known optimum as it does on
a fixed table (tests/trainer/test_modes.py::test_mode_reaches_known_optimum).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aps.trainer import Trainer
from examples.linreg.model import make_data
from tests.trainer.hash_models import HashLinReg, key_of
from tests.trainer.test_modes import assert_reaches_optimum, run_cluster

pytestmark = pytest.mark.timeout(180)


def sgd_reference(path: Path, features: int, batch: int, lr: float) -> tuple[np.ndarray, float, int]:
    """Sequential SGD over one file's batches (gradients of the batch mean); also returns how
    many features the file uses."""
    w = np.zeros(features)
    b = 0.0
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        rows.append((np.float32(parts[1]), [int(x) for x in parts[3 : 3 + int(parts[2])]]))
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        gw = np.zeros(features)
        gb = 0.0
        for y, feats in part:
            err = b + w[feats].sum() - y
            gb += err / len(part)
            np.add.at(gw, feats, err / len(part))
        w -= lr * gw
        b -= lr * gb
    return w, b, len({f for _, feats in rows for f in feats})


async def test_geo_one_trainer_k1_on_a_hash_table_with_a_small_cache_equals_local_sgd(tmp_path: Path) -> None:
    features, lr = 600, 0.3
    make_data(tmp_path, files=1, lines_per_file=320, features=features, seed=4)
    model = HashLinReg(features=features, lr=lr)
    rows = 2 * model.max_batch_ids("lin.w")  # the least one worker may have
    w_ref, b_ref, used = sgd_reference(tmp_path / "part-000", features, batch=32, lr=lr)
    assert used > 1.4 * rows  # the cache must evict
    w, b, _ = await run_cluster(tmp_path, "geo", trainers=1, workers=1, epochs=1, lr=lr, model=model,
                                ids=key_of(np.arange(features)), k_steps=1, geo_cache_rows=rows)
    np.testing.assert_allclose(w, w_ref, atol=1e-5)
    assert abs(b - b_ref) < 1e-5


class ShrinkingTrainer(Trainer):
    """Trainer 0 has the pservers evict every key of ``lin.w`` after epochs 0 and 2 (the other
    trainer may be training meanwhile); the keys each shrink deleted are kept in ``evicted``."""

    evicted: list[int] = []

    async def _epoch(self, epoch: int, rt: Any) -> dict[str, Any]:
        out = await super()._epoch(epoch, rt)
        if self.trainer_id == 0 and epoch in (0, 2):
            self.evicted.append(await rt.ps.shrink("lin.w", decay=1.0, threshold=1e30))
        return out


@pytest.mark.slow
async def test_geo_on_a_hash_table_whose_pservers_evict_reaches_the_known_optimum(tmp_path: Path) -> None:
    w_true, b_true = make_data(tmp_path, files=4, lines_per_file=2000, features=200)
    ShrinkingTrainer.evicted = []
    w, b, results = await run_cluster(tmp_path, "geo", trainers=2, workers=2, epochs=6, lr=0.25, model=HashLinReg(lr=0.25),
                                      trainer=ShrinkingTrainer, ids=key_of(np.arange(200)), k_steps=10)
    assert ShrinkingTrainer.evicted == [200, 200]  # every key, twice
    assert_reaches_optimum(w, b, results, w_true, b_true)  # within the fixed table's bounds
