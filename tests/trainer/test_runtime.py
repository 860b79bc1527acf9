"""The one trainer runtime both trainer kinds drive: the model's one mode hook, and one teardown
order when training fails (no worker process, no socket, no shared file left behind)."""

from __future__ import annotations

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.errors import ConfigError
from aps.trainer import Chunk, Strategy, Trainer
from aps.trainer.modes import AsyncSender, GeoExchange, Mode
from aps.trainer.shared import SharedArrays
from aps.trainer.stepwise import StepTrainer
from aps.trainer.worker import Worker, WorkerSpec
from examples.linreg.model import LinReg

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
    class Hashed(LinReg):
        def tables(self):  # type: ignore[no-untyped-def]
            return [aps.HashTable("h", dim=1, optimizer=aps.SGD())]

    with pytest.raises(ConfigError, match="^geo mode keeps a local copy of every row, which hash table 'h' cannot have; "
                                          r"train it in sync, async, half_async or hybrid mode \(or use a fixed table\)$"):
        kind(Hashed(), Strategy(mode="geo"), NOWHERE)


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
