"""hybrid mode and the sparse staleness bound, on real pservers (port 0) and real worker processes.

* hybrid's dense update with ``dense_lag=0`` is synchronous: 2 trainers x 2 workers of a
  dense-only model end where numpy's SGD / Adam ends when each step averages the four workers'
  batch gradients (the lag of 1: tests/trainer/test_dense_lag.py);
* ``max_staleness`` holds: a model whose one row counts the batches applied records the value
  (the step of the parameters) each compute read; no compute may lack more than the bound of the
  batches its trainer had merged when it started.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.trainer import Strategy, Trainer, TrainOptions
from examples.linreg.model import make_data
from tests.models.test_ctr_step_equality import Reference
from tests.trainer.staleness_models import Counter, DenseLinReg, dense_linreg_grads

pytestmark = pytest.mark.timeout(120)

FEATURES, BATCH, LINES = 20, 8, 64


async def run_cluster(model: aps.Model, files: list[str], strategy: Strategy, trainers: int, servers: int = 2,
                      epochs: int = 1):
    """Start pservers in this loop, train every trainer ``epochs`` epochs, read every table back."""
    pservers = [
        await aps.serve(port=0, server_index=k, num_servers=servers, num_trainers=trainers, exit_when_done=False)
        for k in range(servers)
    ]
    try:
        cluster = ClusterSpec([s.address for s in pservers], trainers)
        options = TrainOptions(save_dir=None, print_period=60, live_line=False)
        results = await asyncio.gather(
            *(Trainer(model, strategy, cluster, t, options).atrain(files, epochs) for t in range(trainers))
        )
        async with aps.connect(cluster.pservers) as ps:
            tables = {t.name: await ps.pull_dense(t.name) for t in model.dense_tables()}
            for t in model.sparse_tables():
                tables[t.name] = await ps.pull_sparse(t.name, np.arange(t.rows, dtype=np.int64))
        return tables, results
    finally:
        for s in pservers:
            await s.aclose()


def read_batches(path: Path) -> list[tuple[list[np.ndarray], np.ndarray]]:
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        rows.append((float(np.float32(parts[1])), np.array([int(x) for x in parts[3 : 3 + int(parts[2])]])))
    return [([f for _, f in rows[s : s + BATCH]], np.array([y for y, _ in rows[s : s + BATCH]]))
            for s in range(0, len(rows), BATCH)]


@pytest.mark.parametrize("adam", [False, True], ids=["sgd", "adam"])
async def test_hybrid_dense_update_equals_synchronous_optimizer(tmp_path: Path, adam: bool) -> None:
    """2 trainers x 2 workers, 4 equal files: step s is one update with the mean of the four
    workers' gradients of their s-th batches, all computed at the same parameters."""
    make_data(tmp_path, files=4, lines_per_file=LINES, features=FEATURES, seed=7)
    files = sorted(tmp_path.glob("part-*"))
    lr = 0.05 if adam else 0.2
    model = DenseLinReg(FEATURES, BATCH, aps.Adam(lr=lr) if adam else aps.SGD(lr=lr))
    strategy = Strategy(mode="hybrid", workers=2, dense_lag=0)
    got, results = await run_cluster(model, [str(f) for f in files], strategy, trainers=2)
    assert [r.epochs[0]["mode"] for r in results] == ["hybrid", "hybrid"]

    assert_synchronous_optimizer(got, files, lr, adam)


def assert_synchronous_optimizer(got: dict[str, np.ndarray], files: list[Path], lr: float, adam: bool) -> None:
    """``got`` is where numpy's SGD / Adam ends when step s is one update with the mean of every
    file's s-th batch gradient, all computed at the same parameters."""
    ref = Reference({"w": np.zeros(FEATURES), "b": np.zeros(1)}, set(), lr, "row" if adam else None)
    per_file = [read_batches(f) for f in files]
    for step in range(LINES // BATCH):
        gw, gb = np.zeros(FEATURES), np.zeros(1)
        for batches in per_file:
            feats, y = batches[step]
            dense_linreg_grads(ref.p["w"], ref.p["b"], feats, y, gw, gb)
        ref.apply({"w": gw / len(files), "b": gb / len(files)}, {})
    assert np.abs(ref.p["w"]).max() > 0.1  # the steps moved the parameters
    np.testing.assert_allclose(got["w"], ref.p["w"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["b"], ref.p["b"], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("mode", ["hybrid", "sync"])
async def test_one_trainer_steps_without_a_vote_and_equals_the_synchronous_optimizer(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 trainer x 2 workers: no round asks the pservers for a vote (its only trainer has data
    for as long as it steps), and each step is still one update with the two workers' mean."""
    from aps.client.psclient import PSClient

    barriers: list[str] = []
    real_barrier = PSClient.barrier

    async def counted(self: PSClient, name: str, *args: object, **kwargs: object) -> int:
        barriers.append(name)
        return await real_barrier(self, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PSClient, "barrier", counted)
    make_data(tmp_path, files=2, lines_per_file=LINES, features=FEATURES, seed=7)
    files = sorted(tmp_path.glob("part-*"))
    model = DenseLinReg(FEATURES, BATCH, aps.SGD(lr=0.2))
    got, results = await run_cluster(model, [str(f) for f in files], Strategy(mode=mode, workers=2), trainers=1)
    assert results[0].epochs[0]["mode"] == mode
    assert not [b for b in barriers if b.startswith("aps.sync.")], barriers

    assert_synchronous_optimizer(got, files, 0.2, adam=False)


def computes(log_dir: Path) -> list[tuple[int, int, int, int]]:
    """Every compute the Counter model logged: (process, start, end, rows' value read)."""
    out = []
    for k, path in enumerate(sorted(log_dir.glob("*.txt"))):
        for line in path.read_text().splitlines():
            start, end, value = line.split()
            out.append((k, int(start), int(end), int(float(value))))
    return out


def worst_lag(log: list[tuple[int, int, int, int]]) -> int:
    """The largest number of batches a compute's parameters lacked among those its trainer had
    certainly merged when it started: a worker's own earlier batches, and another worker's
    batches after which that worker had started its next compute (it starts one only once the
    trainer took the previous gradients). A lower bound of the true staleness of every compute."""
    worst = -(10**9)
    for proc, start, _, value in log:
        merged = 0
        for other in {p for p, *_ in log}:
            begun = sum(1 for p, s, _, _ in log if p == other and s < start)
            merged += begun if other == proc else max(0, begun - 1)
        worst = max(worst, merged - value)
    return worst


def write_lines(tmp_path: Path, files: int, lines: int) -> list[str]:
    paths = []
    for k in range(files):
        path = tmp_path / f"part-{k}"
        path.write_text("x\n" * lines)
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("mode", ["async", "hybrid"])
@pytest.mark.parametrize("bound", [0, 1])
async def test_max_staleness_holds(tmp_path: Path, mode: str, bound: int) -> None:
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    files = write_lines(tmp_path, 2, 40)
    strategy = Strategy(mode=mode, workers=2, max_staleness=bound)
    tables, (result,) = await run_cluster(Counter(str(log_dir)), files, strategy, trainers=1, servers=1)
    log = computes(log_dir)
    assert len(log) == 80 and len({p for p, *_ in log}) == 2
    assert tables["count"][0, 0] == 80  # every batch applied once
    assert worst_lag(log) <= bound
    epoch = result.epochs[0]
    assert epoch["staleness_max"] <= bound and 0 <= epoch["staleness"] <= bound


async def test_without_a_bound_prefetched_rows_lack_the_previous_batch(tmp_path: Path) -> None:
    """The check above bites: in async mode a prefetched pull is made before the batch computing
    meanwhile is merged, so without a bound computes run with rows that lack it."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    files = write_lines(tmp_path, 2, 40)
    _, (result,) = await run_cluster(Counter(str(log_dir)), files, Strategy(mode="async", workers=2), 1, servers=1)
    assert worst_lag(computes(log_dir)) >= 1
    assert result.epochs[0]["staleness_max"] >= 1 and result.epochs[0]["staleness"] > 0.5


def test_max_staleness_must_not_be_negative() -> None:
    with pytest.raises(aps.ConfigError, match="max_staleness must be >= 0"):
        Strategy(max_staleness=-1)
    assert Strategy.from_env({"APS_MAX_STALENESS": "2"}).max_staleness == 2
