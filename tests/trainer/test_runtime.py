"""The one trainer runtime both trainer kinds drive: the model's one mode hook, and one teardown
order when training fails (no worker process, no socket, no shared file left behind)."""

from __future__ import annotations

import pytest

import aps
from aps.cluster import ClusterSpec
from aps.errors import ConfigError
from aps.trainer import Strategy, Trainer
from aps.trainer.modes import AsyncSender, GeoExchange, Mode
from aps.trainer.stepwise import StepTrainer
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
