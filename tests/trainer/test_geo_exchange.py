"""What wakes geo's exchange (aps/trainer/modes/geo.py): the worker step that brings the trainer's
step count to the next exchange's, never a timer, and the epoch's end, a flush and stop whatever
the count.

The first tests run the real workers' steps (aps.trainer.worker.Worker, in this process) and the
real communicator on one event loop, with pservers that answer at once: between two steps the
loop runs only a few turns, no time passes, so an exchange that waited for a timer would never
be seen. The last runs worker processes against a real pserver, one worker running out of data
long before the other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.errors import ApsError
from aps.trainer import Batch, Chunk, Strategy, Trainer, TrainOptions, WorkerContext
from aps.trainer.collector import TrainerCollector, TrainerProbe
from aps.trainer.communicator import Communicator
from aps.trainer.ipc import Kind, Record
from aps.trainer.shared import STAT, Attached, SharedArrays
from aps.trainer.worker import Worker, WorkerSpec
from examples.linreg.model import LinReg, make_data

pytestmark = pytest.mark.timeout(120)

FEATURES = 8
#: one line per batch: each step touches rows 2, 3 and 5 of ``lin.w``
LINE = b"1 1.0 3 2 3 5\n"


class FakePServers:
    """What geo's exchange asks of its client, answered without a network; counts the delta
    pushes. ``gate``: when set to an unset event, delta pushes wait for it; ``fail``: they raise."""

    def __init__(self, model: LinReg) -> None:
        self.dense = {t.name: np.zeros(t.shape, np.float32) for t in model.dense_tables()}
        self.sparse_pushes = 0
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def pull_sparse_changed(self, name: str, timeout: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(0, np.int64), np.zeros((0, 1), np.float32)

    async def pull_sparse(self, name: str, ids: np.ndarray, timeout: float | None = None) -> np.ndarray:
        return np.zeros((len(ids), 1), np.float32)

    async def pull_dense(self, name: str, timeout: float | None = None, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return self.dense[name].copy()
        out[...] = self.dense[name]
        return out

    async def push_sparse_delta(self, name: str, ids: np.ndarray, deltas: np.ndarray, **kwargs: object) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ApsError("pserver gone")
        self.sparse_pushes += 1

    async def push_dense_delta(self, name: str, delta: np.ndarray, timeout: float | None = None) -> None:
        self.dense[name] += delta

    def unreachable(self) -> list[dict[str, object]]:
        return []


@dataclass
class Rig:
    """A geo trainer of ``workers`` in-process workers: :meth:`step` trains one batch on a
    worker and hands the communicator what the worker sent, as the trainer's loop would."""

    comm: Communicator
    ps: FakePServers
    workers: list[Worker]
    pipes: list[Connection]
    notices: list[Record] = field(default_factory=list)

    async def step(self, w: int) -> None:
        worker = self.workers[w]
        [batch] = worker.model.batches(Chunk("<test>", 1, LINE, 1), worker.ctx)
        worker.step(batch, None)
        while self.pipes[w].poll():
            rec = Record.decode(self.pipes[w].recv_bytes())
            self.notices.append(rec)
            await self.comm.handle(w, rec)
        await settle()

    @property
    def exchanges(self) -> int:
        return int(self.comm.report()["geo_syncs"])


async def settle() -> None:
    """Let the event loop run a few turns (no time passes): enough for an exchange whose
    pservers answer at once, far too little for any timer."""
    for _ in range(10):
        await asyncio.sleep(0)


@asynccontextmanager
async def geo_rig(k_steps: int, workers: int = 2) -> AsyncIterator[Rig]:
    model = LinReg(features=FEATURES, batch_size=1, lr=0.1)
    strategy = Strategy(mode="geo", workers=workers, k_steps=k_steps).resolved()
    shared = SharedArrays(model, workers, with_mailboxes=False)
    try:
        ps = FakePServers(model)
        comm = Communicator(ps, model, strategy, Attached(shared.layout), lambda w, rec: None, 0, 1)  # type: ignore[arg-type]
        ends = [Pipe() for _ in range(workers)]
        made = [
            Worker(WorkerSpec(w, 0, 1, workers, local_sgd=True, files=[], layout=shared.layout, model=model), ends[w][0])
            for w in range(workers)
        ]
        await comm.start()
        rig = Rig(comm, ps, made, [mine for _, mine in ends])
        try:
            yield rig
        finally:
            await asyncio.wait_for(comm.stop(), 10)
    finally:
        shared.close()


async def test_the_exchange_starts_on_the_step_that_reaches_k_steps_of_the_trainer() -> None:
    """k_steps counts the steps of every worker together; a flush (a save, an epoch's end)
    exchanges whatever the count and the next k_steps count from it."""
    async with geo_rig(k_steps=4) as rig:
        seen = []
        for s in range(12):
            await rig.step(s % 2)  # the workers take turns
            seen.append(rig.exchanges)
        assert seen == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
        # one notice per exchange, from the worker whose step reached it, with the count it saw
        assert [(r.kind, r.steps) for r in rig.notices] == [(Kind.STEPS, 4), (Kind.STEPS, 8), (Kind.STEPS, 12)]
        assert rig.ps.sparse_pushes == 3  # each one sent the rows the steps wrote
        await rig.step(0)
        await rig.step(1)
        await rig.comm.flush()  # at 14 steps: the next exchange is due at 18, not at 16
        assert rig.exchanges == 4
        for _ in range(3):
            await rig.step(0)
        assert rig.exchanges == 4
        await rig.step(1)
        assert rig.exchanges == 5
        # a worker that stopped stepping (its epoch done) leaves the count to the other one
        for _ in range(4):
            await rig.step(1)
        assert rig.exchanges == 6
        # the metrics endpoint reads the same one report of the mode
        probe = TrainerProbe(0, workers=2, stats=rig.comm.link.shared.stats, comm=rig.comm)
        metrics = {m.name: m.samples[0].value for m in TrainerCollector(probe).collect() if m.samples}
        assert metrics["aps_trainer_geo_syncs"] == 6 and metrics["aps_trainer_pushes"] == 0
        assert not any(name.startswith(("aps_trainer_geo_cache", "aps_trainer_send_queue")) for name in metrics)


async def test_steps_trained_while_an_exchange_runs_start_the_next_one_when_it_ends() -> None:
    """An exchange that takes longer than k_steps steps is followed by another at once, even
    for steps no worker told of (counted while the exchange began its new interval)."""
    async with geo_rig(k_steps=2, workers=1) as rig:
        rig.ps.gate = asyncio.Event()
        await rig.step(0)
        await rig.step(0)  # due: the exchange starts and waits for its push
        assert rig.exchanges == 0
        rig.comm.link.shared.stats[0, STAT["steps"]] += 2  # as if a worker stepped twice unheard
        rig.ps.gate.set()
        await settle()
        assert rig.exchanges == 2
        assert [r.steps for r in rig.notices] == [2]


async def test_a_failed_exchange_is_kept_for_the_trainer_and_stop_still_returns() -> None:
    async with geo_rig(k_steps=1, workers=1) as rig:
        rig.ps.fail = True
        await rig.step(0)
        assert isinstance(rig.comm.failure, ApsError)
        with pytest.raises(ApsError, match="pserver gone"):
            rig.comm.check()
        await rig.step(0)  # later notices find nobody waiting: nothing breaks
        assert rig.exchanges == 0


class OneEarlyLinReg(LinReg):
    """LinReg whose worker 1 trains a single batch of its files, however many it has: it finishes
    its epochs long before worker 0 does. Each batch takes at least 5 ms, so an epoch lasts long
    enough for exchanges to happen within it on any machine."""

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        for k, batch in enumerate(super().batches(chunk, ctx)):
            if ctx.worker_id == 1 and k > 0:
                return
            time.sleep(0.005)
            yield batch


async def test_a_run_whose_worker_stops_early_still_exchanges_and_finishes(tmp_path: Path) -> None:
    """Worker 1 stops after one batch an epoch; worker 0's steps alone still reach each k_steps
    (the exchanges within the epochs), and the epochs' ends and the final flush exchange."""
    make_data(tmp_path, files=2, lines_per_file=640, features=200, seed=5)
    server = await aps.serve(port=0, exit_when_done=False)
    try:
        options = TrainOptions(save_dir=None, print_period=60, live_line=False)
        trainer = Trainer(OneEarlyLinReg(features=200, lr=0.2), Strategy(mode="geo", workers=2, k_steps=5),
                          ClusterSpec([server.address], 1), 0, options)
        result = await asyncio.wait_for(trainer.atrain([str(p) for p in sorted(tmp_path.glob("part-*"))], 2), 100)
    finally:
        await server.aclose()
    assert [e["steps"] for e in result.epochs] == [21, 21]  # 20 batches of 32 lines, and one
    exchanges = trainer.registry.get_sample_value("aps_trainer_geo_syncs_total", {"trainer": "0"})
    # each epoch ends with 2 (its flush, and after the barrier) and the run with one more; the
    # 42 steps reach k_steps 8 times: 5 in all would mean none was woken within an epoch
    assert exchanges is not None and exchanges > 5 + 2
