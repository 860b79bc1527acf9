"""Trainer runtime: data input, compute workers, the communicator's modes, orchestration."""

from .datagen import DataGenerator
from .model import Batch, Grads, Model, Params, WorkerContext
from .reader import Chunk
from .stepwise import StepTrainer
from .strategy import Strategy
from .trainer import Trainer, TrainOptions, TrainResult

__all__ = [
    "Batch", "Chunk", "DataGenerator", "Grads", "Model", "Params", "StepTrainer", "Strategy", "Trainer", "TrainOptions",
    "TrainResult", "WorkerContext",
]
