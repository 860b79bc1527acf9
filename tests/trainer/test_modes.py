"""Each communicator mode against real pservers on port 0 and real worker processes.

The problem (examples/linreg/model.py) has a known optimum, so convergence is checked
against it; sync and geo are also checked step for step against single-process SGD.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.trainer import Strategy, Trainer, TrainOptions
from aps.trainer.accumulator import GradAccumulator
from examples.linreg.model import LinReg, make_data

FEATURES = 200


async def run_cluster(
    data: Path, mode: str, trainers: int, workers: int, epochs: int, lr: float, servers: int = 2,
    model: LinReg | None = None, trainer: type[Trainer] = Trainer, ids: np.ndarray | None = None, **knobs
) -> tuple[np.ndarray, float, list]:
    """Start pservers in this loop, run every trainer (each with its worker processes), read
    the trained parameters back (``model``: a LinReg of FEATURES features unless given; ``ids``:
    the rows of ``lin.w`` read back, its features unless given)."""
    pservers = [
        await aps.serve(port=0, server_index=k, num_servers=servers, num_trainers=trainers, exit_when_done=False)
        for k in range(servers)
    ]
    try:
        cluster = ClusterSpec([s.address for s in pservers], trainers)
        model = model or LinReg(features=FEATURES, lr=lr)
        options = TrainOptions(save_dir=None, print_period=60, live_line=False)
        results = await asyncio.gather(
            *(
                trainer(model, Strategy(mode=mode, workers=workers, **knobs), cluster, t, options).atrain([str(data)], epochs)
                for t in range(trainers)
            )
        )
        async with aps.connect(cluster.pservers) as ps:
            w = (await ps.pull_sparse("lin.w", np.arange(model.features) if ids is None else ids))[:, 0]
            b = float((await ps.pull_dense("lin.b"))[0])
        return w, b, results
    finally:
        for s in pservers:
            await s.aclose()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, np.ndarray, float]:
    root = tmp_path_factory.mktemp("linreg")
    w, b = make_data(root, files=4, lines_per_file=2000, features=FEATURES)
    return root, w, b


# (mode, lr, epochs): sync applies one averaged step per round, so it gets a larger lr
CONVERGENCE = [("sync", 0.5, 6), ("half_async", 0.25, 6), ("async", 0.1, 8), ("geo", 0.25, 6)]


@pytest.mark.slow
@pytest.mark.parametrize("mode,lr,epochs", CONVERGENCE, ids=[c[0] for c in CONVERGENCE])
async def test_mode_reaches_known_optimum(dataset, mode: str, lr: float, epochs: int) -> None:
    data, w_true, b_true = dataset
    w, b, results = await run_cluster(data, mode, trainers=2, workers=2, epochs=epochs, lr=lr, k_steps=10)
    assert_reaches_optimum(w, b, results, w_true, b_true)


def assert_reaches_optimum(w: np.ndarray, b: float, results: list, w_true: np.ndarray, b_true: float) -> None:
    """What every mode reaches on the dataset fixture's problem: 2 trainers' epochs, the loss
    down tenfold and the parameters near the optimum."""
    # 2 trainers x 4000 lines each epoch; every line seen once per epoch by exactly one trainer
    assert sum(r.epochs[-1]["examples"] for r in results) == 8000
    first = np.mean([r.epochs[0]["loss"] for r in results])
    last = np.mean([r.epochs[-1]["loss"] for r in results])
    assert last < 0.1 * first, (first, last)
    assert last < 0.06
    assert np.abs(w - w_true).max() < 0.2
    assert abs(b - b_true) < 0.1


def sgd_reference(files: list[Path], batch: int, lr: float, combine: int) -> tuple[np.ndarray, float]:
    """Single-process SGD where step s uses the s-th batch of every file together, each file's
    batch-mean gradient averaged (= the mean over the combined batch when sizes are equal)."""
    parsed = []
    for f in files:
        rows = []
        for line in f.read_text().splitlines():
            parts = line.split()
            y, k = float(parts[1]), int(parts[2])
            rows.append((y, [int(x) for x in parts[3 : 3 + k]]))
        parsed.append(rows)
    w = np.zeros(FEATURES)
    b = 0.0
    steps = len(parsed[0]) // batch
    for s in range(steps):
        gw = np.zeros(FEATURES)
        gb = 0.0
        for rows in parsed[:combine]:
            part = rows[s * batch : (s + 1) * batch]
            for y, feats in part:
                err = b + w[feats].sum() - np.float32(y)
                gb += err / len(part) / combine
                np.add.at(gw, feats, err / len(part) / combine)
        w -= lr * gw
        b -= lr * gb
    return w, b


async def test_sync_two_trainers_equals_sgd_on_combined_batch(tmp_path: Path) -> None:
    make_data(tmp_path, files=2, lines_per_file=320, features=FEATURES, seed=3)
    w, b, _ = await run_cluster(tmp_path, "sync", trainers=2, workers=1, epochs=1, lr=0.3)
    w_ref, b_ref = sgd_reference(sorted(tmp_path.glob("part-*")), batch=32, lr=0.3, combine=2)
    np.testing.assert_allclose(w, w_ref, atol=1e-5)
    assert abs(b - b_ref) < 1e-5


async def test_geo_one_trainer_k1_equals_local_sgd(tmp_path: Path) -> None:
    make_data(tmp_path, files=1, lines_per_file=320, features=FEATURES, seed=4)
    w, b, _ = await run_cluster(tmp_path, "geo", trainers=1, workers=1, epochs=1, lr=0.3, servers=1, k_steps=1)
    w_ref, b_ref = sgd_reference(sorted(tmp_path.glob("part-*")), batch=32, lr=0.3, combine=1)
    np.testing.assert_allclose(w, w_ref, atol=1e-5)
    assert abs(b - b_ref) < 1e-5


def test_async_merge_sums_duplicate_ids() -> None:
    table = aps.SparseTable("t", rows=8, dim=2)

    def merged() -> GradAccumulator:
        acc = GradAccumulator([table], [], {"t": 3}, max_batches=2)
        acc.add([np.array([5, 1, 5])], [np.array([[1.0, 2.0], [3.0, 4.0], [10.0, 20.0]], np.float32)], {}, 3)
        acc.add([np.array([1, 7])], [np.array([[100.0, 200.0], [0.5, 0.5]], np.float32)], {}, 2)
        return acc

    summed = merged()
    ids, rows = summed.sparse()["t"]
    order = np.argsort(ids)
    assert ids[order].tolist() == [1, 5, 7]
    assert rows[order].tolist() == [[103.0, 204.0], [11.0, 22.0], [0.5, 0.5]]
    assert summed.examples == 5
    averaged = merged()
    averaged.scale(1.0 / averaged.batches)
    ids, rows = averaged.sparse()["t"]
    assert rows[np.argsort(ids)].tolist() == [[51.5, 102.0], [5.5, 11.0], [0.25, 0.25]]


def test_geo_refuses_non_sgd_tables() -> None:
    class AdamModel(LinReg):
        def tables(self):
            return [aps.SparseTable("x", rows=4, dim=1, optimizer=aps.Adam())]

    with pytest.raises(aps.ConfigError, match="geo mode trains locally with SGD"):
        Trainer(AdamModel(), Strategy(mode="geo"), ClusterSpec(["127.0.0.1:1"], 1))


@pytest.mark.parametrize("opt", [aps.SGD(l2=1e-4), aps.SGD(clip_norm=1.0)])
def test_geo_refuses_l2_and_clip_norm_which_only_the_pservers_apply(opt: aps.SGD) -> None:
    class DecayModel(LinReg):
        def tables(self):
            return [aps.SparseTable("x", rows=4, dim=1, optimizer=opt)]

    with pytest.raises(aps.ConfigError, match="table 'x' declares l2 or clip_norm, which only the pservers"):
        Trainer(DecayModel(), Strategy(mode="geo"), ClusterSpec(["127.0.0.1:1"], 1))


def test_trainer_without_pservers_is_an_error() -> None:
    with pytest.raises(aps.ConfigError, match="no pservers"):
        Trainer(LinReg(), Strategy(), ClusterSpec([], 1))
