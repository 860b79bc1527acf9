"""TensorBoard scalars of real training runs, read back with TensorBoard's own EventAccumulator:
aps-local --tensorboard DIR (one run per trainer, DIR/trainer-K, written by aps-trainer
--tensorboard) and the step-wise trainer's TrainOptions(tensorboard=...). The scalars are the
progress and epoch records of the metrics file, value for value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator, ScalarEvent

import aps
from aps.fleet import PaddleCloudRoleMaker
from aps.launcher import LocalCluster
from aps.trainer.stepwise import StepTrainer
from aps.trainer.tensorboard import TensorBoardSink
from examples.linreg.model import LinReg, make_data
from tests.conftest import BIN, ROOT, Processes

pytestmark = pytest.mark.timeout(120)

PROGRESS_TAGS = {"loss", "examples_per_s", "wait_share", "staleness", "staleness_max"}
AUC_TAGS = {"auc", "sliding_auc"}


def scalars(run_dir: Path) -> dict[str, list[ScalarEvent]]:
    """Every scalar of one TensorBoard run directory, as TensorBoard loads it."""
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    return {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}


def records(path: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == event]


def assert_same_as_metrics_file(run: dict[str, list[ScalarEvent]], metrics: Path) -> None:
    """Progress scalars at step = examples trained so far, epoch scalars at step = epoch, each
    equal (as float32) to its record in the metrics file."""
    progress = [r for r in records(metrics, "progress") if r["loss"] is not None]
    assert [(e.step, e.value) for e in run["loss"]] == [
        (r["examples"], pytest.approx(r["loss"], rel=1e-6)) for r in progress]
    epochs = records(metrics, "epoch")
    for key, tag in (("loss", "epoch/loss"), ("examples_per_s", "epoch/examples_per_s")):
        assert [(e.step, e.value) for e in run[tag]] == [(r["epoch"], pytest.approx(r[key], rel=1e-6)) for r in epochs]


@pytest.mark.slow
def test_aps_local_writes_one_run_per_trainer_with_auc(tmp_path: Path) -> None:
    """Two trainers of a CTR model (which predicts, so AUC is there) paced to last seconds:
    DIR/trainer-0 and DIR/trainer-1 each hold several steps of every scalar."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, str(ROOT / "examples/ctr_dnn/make_data.py"), "--out", "data", "--scale", "small",
                    "--train-lines", "3000", "--test-lines", "10", "--train-files", "2"],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
    run = subprocess.run(
        [sys.executable, str(BIN / "aps-local"), "1x2", "--mode", "async", "--tensorboard", "tb", "--timeout", "100",
         "--", "--model", "tests.trainer.fault_models:PacedCtrDnn", "--model-arg", "batch_size=100",
         "--model-arg", "hidden=32,32", "--data", "data/train_data", "--workers", "1", "--no-save"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["trainer-0", "trainer-1"]
    for k in range(2):
        board = scalars(tmp_path / "tb" / f"trainer-{k}")
        assert PROGRESS_TAGS | AUC_TAGS | {f"epoch/{t}" for t in PROGRESS_TAGS | AUC_TAGS} <= set(board)
        steps = [e.step for e in board["loss"]]
        assert len(steps) >= 3 and steps == sorted(steps) and steps[-1] <= 1500  # 1500 lines per trainer
        assert all(0.0 < e.value < 1.0 for e in board["auc"] + board["sliding_auc"])
        assert all(e.value >= 0 for e in board["examples_per_s"] + board["wait_share"])
        assert_same_as_metrics_file(board, tmp_path / "log" / f"trainer.{k}.metrics.jsonl")


@pytest.mark.slow
def test_step_trainer_writes_tensorboard_scalars(tmp_path: Path, processes: Processes) -> None:
    """The library's option: a user's step loop (a linear model: no AUC) that lasts 2 s."""
    make_data(tmp_path / "data", files=1, lines_per_file=640)
    data = [line for f in sorted((tmp_path / "data").iterdir()) for line in f.read_text().splitlines()]
    servers = processes.start_servers(1, trainers=1)
    metrics = tmp_path / "metrics.jsonl"
    options = aps.TrainOptions(save_dir=None, metrics_path=str(metrics), tensorboard=str(tmp_path / "tb"))
    st = StepTrainer(LinReg(lr=0.3), aps.Strategy(mode="async"), aps.ClusterSpec(servers, 1), 0, options).start()
    for batch in st.batches(data):  # 20 batches
        st.step(batch)
        time.sleep(0.1)
    st.stop()
    board = scalars(tmp_path / "tb")
    assert set(board) == PROGRESS_TAGS | {f"epoch/{t}" for t in PROGRESS_TAGS}  # no AUC: the model does not predict
    assert len(board["loss"]) >= 3
    assert_same_as_metrics_file(board, metrics)


def test_launcher_gives_each_trainer_its_own_run_directory(tmp_path: Path) -> None:
    """aps-trainer gets --tensorboard DIR/trainer-K; a user's script run in every role gets it
    in its environment, where aps.fleet reads it for init_worker's TrainOptions."""
    _, trainers = LocalCluster(1, 2, log_dir=tmp_path, tensorboard="tb").plan(tmp_path)
    for k, role in enumerate(trainers):
        assert role.argv[role.argv.index("--tensorboard") + 1] == f"tb/trainer-{k}"
    _, scripts = LocalCluster(1, 2, script=["train.py"], log_dir=tmp_path, tensorboard="tb").plan(tmp_path)
    for k, role in enumerate(scripts):
        assert "--tensorboard" not in role.argv
        assert PaddleCloudRoleMaker(env=role.env).tensorboard == f"tb/trainer-{k}"
    _, plain = LocalCluster(1, 1, log_dir=tmp_path).plan(tmp_path)
    assert "--tensorboard" not in plain[0].argv and PaddleCloudRoleMaker(env=plain[0].env).tensorboard is None


def test_geo_cache_counts_become_scalars_beside_the_loss(tmp_path: Path) -> None:
    """A geo trainer's records on hash tables carry its caches' counts (aps/trainer/monitor.py):
    each is a scalar of its own, progress at step = examples, epoch under epoch/."""
    sink = TensorBoardSink(str(tmp_path))
    cache = {"geo_cache_evictions": 12, "geo_cache_evicted_deltas": 5, "geo_cache_held": 4096, "geo_cache_capacity": 8192}
    sink.write({"event": "progress", "examples": 1000, "time": 1.0, "loss": 0.5, **cache})
    sink.write({"event": "progress", "examples": 2000, "time": 2.0, "loss": 0.4, **cache, "geo_cache_evictions": 30})
    sink.write({"event": "epoch", "epoch": 1, "time": 3.0, "loss": 0.45, **cache, "geo_cache_evictions": 30})
    sink.close()
    run = scalars(tmp_path)
    assert [(e.step, e.value) for e in run["geo_cache/evictions"]] == [(1000, 12.0), (2000, 30.0)]
    assert [(e.step, e.value) for e in run["geo_cache/held"]] == [(1000, 4096.0), (2000, 4096.0)]
    assert [(e.step, e.value) for e in run["epoch/geo_cache/evicted_deltas"]] == [(1, 5.0)]
    assert [(e.step, e.value) for e in run["epoch/geo_cache/capacity"]] == [(1, 8192.0)]
