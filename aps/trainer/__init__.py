"""Trainer runtime: data input, compute workers, the communicator's modes, orchestration."""

from .datagen import DataGenerator
from .model import Batch, Grads, Model, Params, WorkerContext
from .online import OnlineOptions, OnlineResult
from .reader import Chunk
from .sources import PassDir
from .stepwise import StepTrainer
from .strategy import Strategy
from .trainer import Trainer, TrainOptions, TrainResult

__all__ = [
    "Batch", "Chunk", "DataGenerator", "Grads", "Model", "OnlineOptions", "OnlineResult", "Params", "PassDir",
    "StepTrainer", "Strategy", "Trainer", "TrainOptions", "TrainResult", "WorkerContext",
]
