"""Step-wise training (the engine behind fleet.init_worker) against real pserver processes:
the loss of every step comes back, the epoch records agree with it, sync mode copes with
trainers that run out of data at different times, geo saves what it trained locally, and a
communicator failure ends the step that waits on it instead of hanging."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ApsError, ConfigError
from aps.trainer import Batch
from aps.trainer.stepwise import StepTrainer
from tests.conftest import Processes
from examples.linreg.model import LinReg, make_data

pytestmark = pytest.mark.timeout(60)


def lines(directory: Path) -> list[str]:
    return [line for f in sorted(directory.iterdir()) for line in f.read_text().splitlines()]


def train_epoch(st: StepTrainer, data: list[str]) -> list[tuple[float, int]]:
    return [(st.step(b), b.examples) for b in st.batches(data)]


def test_each_step_returns_its_mean_loss_and_the_epoch_record_agrees(tmp_path: Path, processes: Processes) -> None:
    make_data(tmp_path / "data", files=2, lines_per_file=800)
    data = lines(tmp_path / "data")
    servers = processes.start_servers(1, trainers=1)
    metrics = tmp_path / "metrics.jsonl"
    options = aps.TrainOptions(save_dir=None, metrics_path=str(metrics))
    st = StepTrainer(LinReg(lr=0.3), aps.Strategy(mode="async"), aps.ClusterSpec(servers, 1), 0, options).start()
    # the shared arrays stay mapped but their files are gone: a killed script leaves nothing behind
    assert not list(Path("/dev/shm").glob(f"aps-{os.getpid()}-*"))
    first = train_epoch(st, data)
    record = st.end_epoch()
    second = train_epoch(st, data)
    last = st.stop()
    assert processes.procs[0].wait(timeout=15) == 0  # stop() told the pserver: it exits by itself
    losses = [loss for loss, _ in first + second]
    assert len(first) == 50 and all(n == 32 for _, n in first)  # 1600 lines, batches of 32
    # the epoch record is the example-weighted mean of the step losses of that epoch
    weighted = sum(loss * n for loss, n in first) / sum(n for _, n in first)
    assert record["epoch"] == 0 and record["steps"] == 50 and record["examples"] == 1600
    assert record["loss"] == pytest.approx(weighted, rel=1e-9)
    assert last["epoch"] == 1 and last["loss"] == pytest.approx(
        sum(loss * n for loss, n in second) / 1600, rel=1e-9)
    # the loss goes down: the labels' variance is ~0.75 at the start, the optimum is 0
    assert np.mean(losses[:3]) > 0.5 and np.mean(losses[-10:]) < 0.5 * np.mean(losses[:3])
    assert metrics.read_text().count('"event": "epoch"') == 2  # the same records aps-trainer writes


def run_sync_trainer(st: StepTrainer, batches: list[Batch], out: dict[int, object]) -> None:
    try:
        losses = [st.step(b) for b in batches]
        st.end_epoch()
        out[st.trainer_id] = (losses, st.stop())
    except BaseException as exc:  # reported by the test thread
        out[st.trainer_id] = exc


def test_sync_trainers_that_run_out_at_different_steps_do_not_hang(tmp_path: Path, processes: Processes) -> None:
    make_data(tmp_path / "data", files=1, lines_per_file=400)
    data = lines(tmp_path / "data")
    servers = processes.start_servers(1, trainers=2)
    trainers = [StepTrainer(LinReg(lr=0.3), aps.Strategy(mode="sync"), aps.ClusterSpec(servers, 2), i).start()
                for i in range(2)]
    # trainer 0 gets 12 batches, trainer 1 only 3: it keeps joining rounds with empty gradients
    batches = [list(trainers[0].batches(data))[:12], list(trainers[1].batches(data))[:3]]
    out: dict[int, object] = {}
    threads = [threading.Thread(target=run_sync_trainer, args=(st, b, out)) for st, b in zip(trainers, batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(45)
    assert not any(t.is_alive() for t in threads), "a sync trainer hung"
    for i in range(2):
        assert not isinstance(out[i], BaseException), out[i]
    losses0, record0 = out[0]  # type: ignore[misc]
    assert len(losses0) == 12 and record0["steps"] == 12
    assert np.mean(losses0[-3:]) < np.mean(losses0[:3])
    assert processes.procs[0].wait(timeout=15) == 0


def test_geo_save_holds_what_was_trained_locally(tmp_path: Path, processes: Processes) -> None:
    w_true, _ = make_data(tmp_path / "data", files=2, lines_per_file=600)
    data = lines(tmp_path / "data")
    servers = processes.start_servers(1, 1, "--checkpoint-root", str(tmp_path))
    st = StepTrainer(LinReg(lr=0.3), aps.Strategy(mode="geo", k_steps=1000), aps.ClusterSpec(servers, 1), 0).start()
    for _ in range(2):
        train_epoch(st, data)  # k_steps far above the steps: no push happens during training
    st.save(str(tmp_path / "ckpt"))  # flushes the local training first
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["shard-00000-of-00001"]

    async def pull() -> np.ndarray:
        async with aps.connect(servers) as ps:
            return await ps.pull_sparse("lin.w", np.arange(200, dtype=np.int64))

    w = asyncio.run(pull())[:, 0]
    assert np.corrcoef(w, w_true)[0, 1] > 0.9  # the pservers hold the locally trained weights
    st.stop()
    assert processes.procs[0].wait(timeout=15) == 0


class BadIds(LinReg):
    """Claims ids beyond its table: the communicator's pull fails (a ConfigError naming it)."""

    def batches(self, chunk, ctx) -> Iterator[Batch]:  # type: ignore[no-untyped-def]
        for batch in super().batches(chunk, ctx):
            batch.sparse_ids["lin.w"] = batch.sparse_ids["lin.w"] + 1000
            yield batch


def test_a_communicator_failure_ends_the_waiting_step(tmp_path: Path, processes: Processes) -> None:
    make_data(tmp_path / "data", files=1, lines_per_file=64)
    servers = processes.start_servers(1, trainers=1)
    st = StepTrainer(BadIds(), aps.Strategy(mode="sync"), aps.ClusterSpec(servers, 1), 0).start()
    batch = next(iter(st.batches(lines(tmp_path / "data"))))
    with pytest.raises(ConfigError, match=r"table 'lin.w': id \d+ not in \[0, 200\)"):
        st.step(batch)
    with pytest.raises(ConfigError, match="lin.w"):  # and every later call says so too
        st.step(batch)
    st.close()
    assert not any(t.name == "aps-communicator" and t.is_alive() for t in threading.enumerate())
    assert processes.procs[0].poll() is None  # never told this trainer finished: still waiting


def test_misuse_is_a_clear_error(tmp_path: Path) -> None:
    cluster = aps.ClusterSpec(["127.0.0.1:1"], 1)
    st = StepTrainer(LinReg(), aps.Strategy(mode="async"), cluster, 0)
    with pytest.raises(ApsError, match="not started"):
        st.step(Batch({}, 1))
    with pytest.raises(ConfigError, match="workers=2"):
        StepTrainer(LinReg(), aps.Strategy(mode="async", workers=2), cluster, 0)
    adam = LinReg()
    adam.tables = lambda: [aps.SparseTable("w", 10, 1, optimizer=aps.Adam(0.1))]  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="geo mode trains locally with SGD"):
        StepTrainer(adam, aps.Strategy(mode="geo"), cluster, 0)
    with pytest.raises(ConfigError, match="no pservers"):
        StepTrainer(LinReg(), aps.Strategy(), aps.ClusterSpec([], 1), 0)


@pytest.mark.slow
def test_barrier_worker_waits_for_every_trainer(processes: Processes) -> None:
    servers = processes.start_servers(1, trainers=2)
    trainers = [StepTrainer(LinReg(), aps.Strategy(mode="async"), aps.ClusterSpec(servers, 2), i).start()
                for i in range(2)]
    events: list[str] = []
    late_may_go = threading.Event()

    def first() -> None:
        events.append("0 waits")
        late_may_go.set()
        trainers[0].barrier()
        events.append("0 passed")

    def late() -> None:
        late_may_go.wait(10)
        events.append("1 arrives")
        trainers[1].barrier()

    threads = [threading.Thread(target=first), threading.Thread(target=late)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert events.index("1 arrives") < events.index("0 passed"), events
    stops = [threading.Thread(target=st.stop) for st in trainers]  # stop() meets the others too
    for t in stops:
        t.start()
    for t in stops:
        t.join(30)
    assert processes.procs[0].wait(timeout=15) == 0


@pytest.mark.parametrize("mode", ["async", "geo"])
def test_word2vec_defaults_train_in_a_step_loop_longer_than_the_schedule(tmp_path: Path, processes: Processes,
                                                                          mode: str) -> None:
    """A fleet script's step loop with word2vec's defaults: the Strategy's default mode (async)
    takes the linear schedule, and a loop that goes on for 3 passes over a corpus the schedule
    counts once holds the rate at its floor instead of failing half-way."""
    from aps.models.word2vec.model import Word2Vec
    from tests.models.test_word2vec_e2e import make_corpus

    corpus = make_corpus(tmp_path / "corpus", families=4, sentences_per_word=40, files=1)
    data = lines(corpus / "train")
    model = Word2Vec(dict_path=str(corpus / "dict.txt"), dim=16)
    strategy = aps.Strategy() if mode == "async" else aps.Strategy(mode="geo", k_steps=20)
    assert strategy.for_model(model).mode == mode  # async: word2vec states no preferred mode
    servers = processes.start_servers(1, trainers=1)
    st = StepTrainer(model, strategy, aps.ClusterSpec(servers, 1), 0, aps.TrainOptions(save_dir=None)).start()
    records = []
    for _ in range(3):
        for batch in st.batches(data):
            st.step(batch)
        records.append(st.end_epoch())
    st.stop()
    losses = [r["loss"] for r in records]
    assert all(r["steps"] > 5 for r in records)
    assert losses[2] < 0.9 * losses[0], losses
