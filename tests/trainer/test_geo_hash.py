"""geo mode on hash tables, against real pservers on port 0 and real worker processes.

The model is examples/linreg's on a hash table (tests/trainer/hash_models.py): with one trainer
and an exchange every step, geo is plain SGD, however small the trainer's cache (evictions hand
their pending deltas to the pservers and a key read again gets them back); with pservers that
evict every key twice during training (shrink), geo still reaches the known optimum as it does on
a fixed table (tests/trainer/test_modes.py::test_mode_reaches_known_optimum). Online training's
scoring passes ask for the rows of their batches as training does, and train nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions
from examples.linreg.model import make_data
from tests.online.models import HashCountingLR
from tests.online.passdata import write_pass
from tests.trainer.hash_models import FusedHashLinReg, HashLinReg, key_of
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


class KeptTrainer(Trainer):
    """A Trainer that keeps each instance made (to read its registry after the run)."""

    made: list[Trainer] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made.append(self)


@pytest.mark.parametrize("kind", [HashLinReg, FusedHashLinReg], ids=["compute", "fused"])
async def test_geo_one_trainer_k1_on_a_hash_table_with_a_small_cache_equals_local_sgd(tmp_path: Path, kind: type[HashLinReg]) -> None:
    """Either way a model steps (compute then the runtime's SGD, or its own fused local_sgd on
    the gathered rows, added back to the cache)."""
    features, lr = 600, 0.3
    make_data(tmp_path, files=1, lines_per_file=320, features=features, seed=4)
    model = kind(features=features, lr=lr)
    rows = 2 * model.max_batch_ids("lin.w")  # the least one worker may have
    w_ref, b_ref, used = sgd_reference(tmp_path / "part-000", features, batch=32, lr=lr)
    assert used > 1.4 * rows  # the cache must evict
    KeptTrainer.made = []
    w, b, results = await run_cluster(tmp_path, "geo", trainers=1, workers=1, epochs=1, lr=lr, model=model, trainer=KeptTrainer,
                                      ids=key_of(np.arange(features)), k_steps=1, geo_cache_rows=rows)
    np.testing.assert_allclose(w, w_ref, atol=1e-5)
    assert abs(b - b_ref) < 1e-5
    # the epoch record and the Prometheus metrics say how the cache fared: every key admitted
    # (each of them at least once) and no longer held was evicted
    epoch = results[0].epochs[0]
    assert epoch["geo_cache_capacity"] == rows and 0 < epoch["geo_cache_held"] <= rows
    assert epoch["geo_cache_evictions"] >= used - epoch["geo_cache_held"]
    assert 0 <= epoch["geo_cache_evicted_deltas"] <= epoch["geo_cache_evictions"]
    metrics = KeptTrainer.made[0].registry
    for name, field in [("aps_trainer_geo_cache_evictions_total", "geo_cache_evictions"),
                        ("aps_trainer_geo_cache_evicted_deltas_total", "geo_cache_evicted_deltas"),
                        ("aps_trainer_geo_cache_held_rows", "geo_cache_held"),
                        ("aps_trainer_geo_cache_capacity_rows", "geo_cache_capacity")]:
        assert metrics.get_sample_value(name, {"trainer": "0"}) == epoch[field], name


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


async def test_geo_scores_then_trains_each_pass_of_a_model_with_a_hash_table(tmp_path: Path) -> None:
    """HashCountingLR (tests/online/models.py): ``seen`` a fixed table counting the records
    trained, ``w`` a hash table of the feature weights; passes are scored, then trained once."""
    data = tmp_path / "passes"
    write_pass(data, "20261126/0001", 0, 64)
    write_pass(data, "20261126/0002", 64, 64)
    (data / "_SUCCESS").write_text("")
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False)
        trainer = Trainer(HashCountingLR(), Strategy(mode="geo", workers=2, k_steps=1), ClusterSpec([server.address], 1), 0, options)
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), OnlineOptions())
        async with aps.connect(server.address) as ps:
            seen = (await ps.pull_sparse("seen", np.arange(200)))[:, 0]
            w = (await ps.pull_sparse("w", np.array([0, 1], np.int64)))[:, 0]
    finally:
        await server.aclose()
    # the first pass meets a model that knows nothing; the second one a model that learnt the rule
    assert [p["online_auc"] for p in result.passes] == [0.5, 1.0]
    assert [p["scored"] for p in result.passes] == [64, 64] and [p["examples"] for p in result.passes] == [64, 64]
    assert seen[:128].tolist() == [1.0] * 128 and not seen[128:].any()  # scoring trained nothing
    assert w[0] > 0 > w[1]  # feature 0 always clicked, feature 1 never
