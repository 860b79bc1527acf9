"""hybrid's dense lag (docs/modes.md, "hybrid"), on real pservers (port 0) and real worker processes.

With ``dense_lag=1`` the workers are released as soon as every one handed in step s, and compute
step s+1 with the parameters of round s-1 while round s (average, vote, SYNC push, pull into the
other buffer) runs: one-step delayed synchronous SGD. Step s's gradient is computed on the
parameters after s-1 rounds (after 0 for steps 0 and 1) and applied on top of round s-1's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cli.trainer import _strategy, build_parser
from aps.cluster import ClusterSpec
from aps.trainer import Strategy, Trainer, TrainOptions
from aps.trainer.modes import mode_class
from aps.trainer.stepwise import StepTrainer
from examples.linreg.model import make_data
from tests.conftest import Processes
from tests.models.test_ctr_step_equality import Reference
from tests.trainer.staleness_models import DenseCounter, DenseLinReg, dense_linreg_grads
from tests.trainer.test_hybrid import BATCH, FEATURES, read_batches, run_cluster, write_lines
from tests.trainer.test_runtime import shared_files, worker_processes

pytestmark = pytest.mark.timeout(120)


def delayed_reference(files: list[Path], lag: int, lr: float, adam: bool, mean_over: int,
                      epochs: int = 1) -> dict[str, np.ndarray]:
    """numpy's SGD / Adam where step s's gradients are those of every file's s-th batch at the
    parameters after ``max(s - lag, 0)`` steps of the epoch, summed over the files and divided
    by ``mean_over`` (the workers of all trainers, as the trainers' mean and the pservers'
    ``sum / trainer_num`` make it); a file that ran out adds nothing (its trainer, of one
    worker, joins the rounds with zero gradients). An epoch starts with the newest parameters."""
    ref = Reference({"w": np.zeros(FEATURES), "b": np.zeros(1)}, set(), lr, "row" if adam else None)
    per_file = [read_batches(f) for f in files]
    for _ in range(epochs):
        after = [{k: v.copy() for k, v in ref.p.items()}]  # after[k]: the parameters after k steps
        for step in range(max(len(b) for b in per_file)):
            at = after[max(step - lag, 0)]
            gw, gb = np.zeros(FEATURES), np.zeros(1)
            for batches in per_file:
                if step < len(batches):
                    feats, y = batches[step]
                    dense_linreg_grads(at["w"], at["b"], feats, y, gw, gb)
            ref.apply({"w": gw / mean_over, "b": gb / mean_over}, {})
            after.append({k: v.copy() for k, v in ref.p.items()})
    return ref.p


@pytest.mark.parametrize("adam,epochs", [(False, 1), (True, 1), (False, 2)], ids=["sgd", "adam", "sgd-2-epochs"])
async def test_dense_lag_1_equals_one_step_delayed_optimizer(tmp_path: Path, adam: bool, epochs: int) -> None:
    """One trainer, one worker: the dense tables end where one-step delayed SGD / Adam ends,
    and away from the synchronous reference. The end of an epoch waits for its last round, and
    the next epoch's first steps compute with its parameters."""
    make_data(tmp_path, files=1, lines_per_file=64, features=FEATURES, seed=7)
    files = sorted(tmp_path.glob("part-*"))
    lr = 0.05 if adam else 0.2
    model = DenseLinReg(FEATURES, BATCH, aps.Adam(lr=lr) if adam else aps.SGD(lr=lr))
    strategy = Strategy(mode="hybrid", workers=1, dense_lag=1)
    got, _ = await run_cluster(model, [str(f) for f in files], strategy, 1, 1, epochs=epochs)
    want = delayed_reference(files, 1, lr, adam, mean_over=1, epochs=epochs)
    fresh = delayed_reference(files, 0, lr, adam, mean_over=1, epochs=epochs)
    assert np.abs(want["w"] - fresh["w"]).max() > 1e-3  # the lag changes what is computed
    np.testing.assert_allclose(got["w"], want["w"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["b"], want["b"], rtol=2e-5, atol=2e-6)


async def test_two_trainers_of_two_workers_equal_the_delayed_optimizer(tmp_path: Path) -> None:
    """2 trainers x 2 workers: each step averages the four workers' gradients computed at the
    parameters of the step before last."""
    make_data(tmp_path, files=4, lines_per_file=64, features=FEATURES, seed=7)
    files = sorted(tmp_path.glob("part-*"))
    strategy = Strategy(mode="hybrid", workers=2, dense_lag=1)
    got, _ = await run_cluster(DenseLinReg(FEATURES, BATCH), [str(f) for f in files], strategy, 2)
    want = delayed_reference(files, 1, 0.2, False, mean_over=4)
    np.testing.assert_allclose(got["w"], want["w"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["b"], want["b"], rtol=2e-5, atol=2e-6)


async def test_hybrid_defaults_to_dense_lag_0(tmp_path: Path) -> None:
    """2 trainers x 2 workers with no dense_lag named: each step averages the four workers'
    gradients computed at the parameters of the step before (no lag: it costs short runs AUC)."""
    make_data(tmp_path, files=4, lines_per_file=64, features=FEATURES, seed=7)
    files = sorted(tmp_path.glob("part-*"))
    got, _ = await run_cluster(DenseLinReg(FEATURES, BATCH), [str(f) for f in files], Strategy(mode="hybrid", workers=2), 2)
    want = delayed_reference(files, 0, 0.2, False, mean_over=4)
    np.testing.assert_allclose(got["w"], want["w"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["b"], want["b"], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("lag", [0, 1])
async def test_each_step_computes_with_the_round_lag_steps_before(tmp_path: Path, lag: int) -> None:
    """1 trainer x 2 workers, 20 steps of a dense count: the k-th compute of each worker reads
    the value after k - lag rounds (never older), and every round is applied once."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    files = write_lines(tmp_path, 2, 20)
    strategy = Strategy(mode="hybrid", workers=2, dense_lag=lag)
    tables, (result,) = await run_cluster(DenseCounter(str(log_dir)), files, strategy, trainers=1, servers=1)
    assert result.epochs[0]["dense_lag"] == lag
    logs = sorted(log_dir.glob("*.txt"))
    assert len(logs) == 2
    for path in logs:
        read = [int(float(v)) for v in path.read_text().split()]
        assert read == [max(k - lag, 0) for k in range(20)]
    assert tables["count"][0] == 20


def test_a_step_wise_trainer_computes_with_the_round_before_last_and_saves_the_last(tmp_path: Path,
                                                                                   processes: Processes) -> None:
    """The caller's loop as the one worker, hybrid with dense_lag=1: steps read 0, 0, 1, 2; the
    epoch's end (a flush) waits for the last round, and its record says the lag."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    servers = processes.start_servers(1, trainers=1)
    options = TrainOptions(save_dir=None, print_period=60, live_line=False)
    with StepTrainer(DenseCounter(str(log_dir)), Strategy(mode="hybrid", dense_lag=1), ClusterSpec(servers, 1), 0, options).start() as st:
        for batch in st.batches(["x"] * 4):
            st.step(batch)
        record = st.end_epoch()
        got = asyncio.run(pull_count(servers))
    assert record["mode"] == "hybrid" and record["dense_lag"] == 1
    assert [int(float(v)) for p in log_dir.glob("*.txt") for v in p.read_text().split()] == [0, 0, 1, 2]
    assert got == 4


async def pull_count(servers: list[str]) -> float:
    async with aps.connect(servers) as ps:
        return float((await ps.pull_dense("count"))[0])


async def test_unequal_data_across_two_trainers_finishes_with_dense_lag_1(tmp_path: Path) -> None:
    """Trainer 0 has 8 batches, trainer 1 has 3: trainer 1 joins the last 5 rounds with zero
    gradients (the votes), nothing hangs, and the tables equal the delayed reference."""
    make_data(tmp_path / "a", files=1, lines_per_file=8 * BATCH, features=FEATURES, seed=7)
    make_data(tmp_path / "b", files=1, lines_per_file=3 * BATCH, features=FEATURES, seed=8)
    files = [tmp_path / "a" / "part-000", tmp_path / "b" / "part-000"]
    strategy = Strategy(mode="hybrid", workers=1, dense_lag=1)
    got, results = await run_cluster(DenseLinReg(FEATURES, BATCH), [str(f) for f in files], strategy, trainers=2)
    assert sorted(r.epochs[0]["examples"] for r in results) == [3 * BATCH, 8 * BATCH]
    want = delayed_reference(files, 1, 0.2, False, mean_over=2)
    np.testing.assert_allclose(got["w"], want["w"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["b"], want["b"], rtol=2e-5, atol=2e-6)


def test_dense_lag_is_a_strategy_knob_with_an_environment_variable_and_a_flag() -> None:
    assert Strategy.from_env({"APS_DENSE_LAG": "0"}).dense_lag == 0
    assert Strategy().dense_lag is None  # the mode's default
    args = build_parser().parse_args(["--pservers", "127.0.0.1:1", "--data", "x", "--model", "ctr_dnn", "--dense-lag", "0"])
    assert _strategy(args).dense_lag == 0
    with pytest.raises(aps.ConfigError, match="dense_lag must be 0 or 1"):
        Strategy(dense_lag=2)


@pytest.mark.parametrize("mode", ["sync", "async", "half_async", "geo"])
def test_other_modes_refuse_a_dense_lag(mode: str) -> None:
    assert mode_class(mode).dense_lag(Strategy(mode=mode)) == 0
    assert mode_class("hybrid").dense_lag(Strategy(mode="hybrid")) == 0
    with pytest.raises(aps.ConfigError, match="dense_lag applies to hybrid mode"):
        mode_class(mode).dense_lag(Strategy(mode=mode, dense_lag=1))


def trainer_tasks() -> list[asyncio.Task]:
    """Tasks of this event loop other than the test's own and the in-process pserver's."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
            and "/aps/server/" not in t.get_coro().cr_code.co_filename]


async def test_a_pserver_lost_during_a_background_round_fails_the_trainer_and_leaves_nothing(tmp_path: Path) -> None:
    """The pserver goes away while rounds run behind the workers' computes: the trainer fails
    with the client's error (no hang), and no worker process or shared file is left."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    files = write_lines(tmp_path, 2, 200)
    server = await aps.serve(port=0, num_trainers=1, exit_when_done=False)
    strategy = Strategy(mode="hybrid", workers=2, dense_lag=1, rpc_timeout=2.0, rpc_deadline=0.5)
    options = TrainOptions(save_dir=None, print_period=60, live_line=False)
    trainer = Trainer(DenseCounter(str(log_dir), compute_s=0.01), strategy, ClusterSpec([server.address], 1), 0, options)
    run = asyncio.ensure_future(trainer.atrain(files, 1))
    try:
        while sum(len(p.read_text().split()) for p in log_dir.glob("*.txt")) < 6:
            assert not run.done(), run
            await asyncio.sleep(0.01)
        await server.aclose()
        with pytest.raises(aps.ConnectionLost, match="unreachable"):
            await asyncio.wait_for(run, 20)
    finally:
        run.cancel()
        await server.aclose()
    assert worker_processes() == [] and shared_files() == []
    assert trainer_tasks() == []  # no round left behind


async def test_a_trainer_cancelled_while_a_round_waits_for_the_others_leaves_no_task(tmp_path: Path) -> None:
    """The other trainer never comes: round 0's vote waits in the background while step 1
    computes; cancelling the trainer stops the round with it (no task, worker or file left)."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    files = write_lines(tmp_path, 1, 50)
    server = await aps.serve(port=0, num_trainers=2, exit_when_done=False)
    strategy = Strategy(mode="hybrid", workers=1, dense_lag=1)
    options = TrainOptions(save_dir=None, print_period=60, live_line=False)
    trainer = Trainer(DenseCounter(str(log_dir)), strategy, ClusterSpec([server.address], 2), 0, options)
    run = asyncio.ensure_future(trainer.atrain(files, 1))
    try:
        while sum(len(p.read_text().split()) for p in log_dir.glob("*.txt")) < 2:
            assert not run.done(), run
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert sum(len(p.read_text().split()) for p in log_dir.glob("*.txt")) == 2  # step 2 waits for round 0
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert trainer_tasks() == []  # no round left running
    finally:
        await server.aclose()
    assert worker_processes() == [] and shared_files() == []
