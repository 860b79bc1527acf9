"""The one trainer runtime both trainer kinds drive: the model's one mode hook, and one teardown
order when training fails (no worker process, no socket, no shared file left behind)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.errors import ConfigError
from aps.trainer import Chunk, Strategy, Trainer, TrainOptions
from aps.trainer.modes import AsyncSender, GeoExchange, Mode
from aps.trainer.shared import SharedArrays, shm_base
from aps.trainer.stepwise import StepTrainer
from aps.trainer.worker import Worker, WorkerSpec
from examples.linreg.model import LinReg, make_data
from tests.conftest import Processes
from tests.trainer.fault_models import BadIdsLinReg

NOWHERE = ClusterSpec(["127.0.0.1:1"], 1)


class Picky(LinReg):
    """Refuses every mode that trains locally, saying so in its own words; records what it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[type[Mode]] = []

    def check_mode(self, mode: type[Mode]) -> None:
        self.seen.append(mode)
        if mode.local_sgd:
            raise ConfigError(f"picky cannot train in {mode.name} mode")
        super().check_mode(mode)


@pytest.mark.parametrize("kind", [Trainer, StepTrainer], ids=["Trainer", "StepTrainer"])
def test_the_model_hook_gets_the_mode_class_from_both_trainer_kinds(kind: type) -> None:
    model = Picky()
    kind(model, Strategy(mode="async"), NOWHERE)
    with pytest.raises(ConfigError, match="^picky cannot train in geo mode$"):
        kind(model, Strategy(mode="geo"), NOWHERE)
    assert model.seen == [AsyncSender, GeoExchange]


@pytest.mark.parametrize("kind", [Trainer, StepTrainer], ids=["Trainer", "StepTrainer"])
def test_the_default_hook_refuses_what_the_mode_cannot_train_in_the_same_words(kind: type) -> None:
    class Adagrad(LinReg):
        def tables(self):  # type: ignore[no-untyped-def]
            return [aps.HashTable("h", dim=1, optimizer=aps.Adagrad())]

    with pytest.raises(ConfigError, match="^geo mode trains locally with SGD, but table 'h' declares Adagrad; "
                                          r"give every table SGD \(.*\), or train in sync, async, half_async or "
                                          "hybrid, which take any optimizer$"):
        kind(Adagrad(), Strategy(mode="geo"), NOWHERE)


def test_a_worker_trains_one_batch_through_its_public_step() -> None:
    """geo's local SGD needs no communicator: the step's arithmetic is checked by hand."""
    model = LinReg(features=8, lr=0.5)
    shared = SharedArrays(model, 1, with_mailboxes=False)
    try:
        spec = WorkerSpec(0, 0, 1, 1, local_sgd=True, files=[], layout=shared.layout, model=model)
        worker = Worker(spec, conn=None)  # type: ignore[arg-type]  # local SGD never talks
        [batch] = model.batches(Chunk("<test>", 1, b"1 1.0 2 3 5\n1 3.0 1 3\n", 2), worker.ctx)
        # predictions 0: errors -1 and -3, summed loss 0.5 + 4.5; gradients of the mean loss
        assert worker.step(batch, None) == pytest.approx(5.0)
        assert worker.steps == 1
        w, b = worker.params.sparse["lin.w"][:, 0], worker.params.dense["lin.b"]
        np.testing.assert_allclose(w, [0, 0, 0, 1.0, 0, 0.25, 0, 0])  # -0.5 * (-0.5 - 1.5), -0.5 * -0.5
        np.testing.assert_allclose(b, [1.0])
        assert np.flatnonzero(worker.shared.dirty["lin.w"]).tolist() == [3, 5]  # for the next exchange
    finally:
        shared.close()


def sockets() -> int:
    """Sockets this process holds open (client connections, worker pipes, a listening endpoint)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the directory's own fd, closed meanwhile
            pass
    return sum(link.startswith("socket:") for link in fds)


def children() -> dict[int, list[int]]:
    """Every live (not zombie) process's children, by parent pid, read from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                tree.setdefault(int(ppid), []).append(int(entry))
    return tree


def worker_processes() -> list[int]:
    """Live compute workers of this process: the children of its worker fork server."""
    tree = children()
    [server] = [p for p in tree.get(os.getpid(), []) if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return tree.get(server, [])


def shared_files() -> list[str]:
    return [name for name in os.listdir(shm_base()) if name.startswith(f"aps-{os.getpid()}-")]


FAILED_PULL = r"table 'lin.w': id \d+ not in \[0, 200\)"


@pytest.mark.timeout(60)
async def test_trainer_failing_mid_epoch_leaves_no_worker_no_socket_no_shared_file(tmp_path: Path, processes: Processes) -> None:
    make_data(tmp_path / "data", files=2, lines_per_file=64)
    servers = processes.start_servers(1, trainers=1)
    before = sockets()
    options = TrainOptions(save_dir=None, live_line=False, metrics_port=0)
    trainer = Trainer(BadIdsLinReg(), Strategy(mode="async", workers=2), ClusterSpec(servers, 1), 0, options)
    with pytest.raises(ConfigError, match=FAILED_PULL) as failure:
        await trainer.atrain([str(tmp_path / "data")], 1)
    # checked at once, while the failure (and its traceback's frames) is still held: the teardown
    # itself released everything, not the garbage collector later
    assert worker_processes() == [] and sockets() == before and shared_files() == []
    assert failure.tb is not None and processes.procs[0].poll() is None  # the pserver: not told it finished


@pytest.mark.timeout(60)
def test_step_trainer_failing_mid_epoch_leaves_no_thread_no_socket_no_shared_file(tmp_path: Path, processes: Processes) -> None:
    make_data(tmp_path / "data", files=1, lines_per_file=64)
    servers = processes.start_servers(1, trainers=1)
    before = sockets()
    options = TrainOptions(save_dir=None, live_line=False, metrics_port=0)
    lines = (tmp_path / "data" / "part-000").read_text().splitlines()
    with pytest.raises(ConfigError, match=FAILED_PULL) as failure:
        with StepTrainer(BadIdsLinReg(), Strategy(mode="async"), ClusterSpec(servers, 1), 0, options).start() as st:
            st.step(next(iter(st.batches(lines))))
    assert not any(t.name == "aps-communicator" for t in threading.enumerate())
    assert sockets() == before and shared_files() == []
    assert failure.tb is not None and processes.procs[0].poll() is None


def _dense_delta_pushes(address: str) -> int:
    async def read() -> int:
        async with aps.connect([address]) as ps:
            ops = (await ps.stats())[address]["ops"]
        return int(ops.get("PushDenseDelta", {}).get("count", 0))

    return asyncio.run(read())


@pytest.mark.timeout(60)
def test_a_geo_save_exchanges_even_with_no_step_since_the_last(tmp_path: Path, processes: Processes) -> None:
    """geo's dense tables send only a share of ``local - old`` at an exchange (1 / trainers),
    so a save straight after another still moves the pservers' values: the runtime's flush must
    reach the mode every time. (It once skipped the flush when no step was trained since the
    last, and tests/trainer/test_modes.py's geo run ended with its bias 0.1007 from the truth,
    over its 0.1 bound.)"""
    make_data(tmp_path / "data", files=1, lines_per_file=64)
    servers = processes.start_servers(1, 1, "--checkpoint-root", str(tmp_path))
    options = TrainOptions(save_dir=None, live_line=False, metrics_port=0)
    lines = (tmp_path / "data" / "part-000").read_text().splitlines()
    with StepTrainer(LinReg(lr=0.2), Strategy(mode="geo"), ClusterSpec(servers, 1), 0, options).start() as st:
        st.step(next(iter(st.batches(lines))))
        st.save(str(tmp_path / "first"))
        before = _dense_delta_pushes(servers[0])
        st.save(str(tmp_path / "second"))  # no step between the two saves
        assert _dense_delta_pushes(servers[0]) > before
