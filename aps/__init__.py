"""aps: an asyncio parameter server for training sparse models.

Public names only; see README.md for a tour.
"""

from .client import PSClient, connect
from .cluster import ClusterSpec
from .errors import (
    ApsError,
    ConfigError,
    ConnectionLost,
    DataError,
    ErrorCode,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestTimeout,
    ServerError,
)
from .server import PServer, ServerConfig, serve
from .specs import SGD, Adagrad, Adam, Constant, DenseTable, ExponentialDecay, Normal, SparseTable, Uniform
from .trainer import StepTrainer, Strategy, Trainer, TrainOptions
from .fleet import DistributedStrategy, Fleet

__version__ = "0.1.0"

__all__ = [
    "connect", "serve", "PSClient", "PServer", "ServerConfig", "ClusterSpec", "Strategy", "Trainer", "TrainOptions",
    "StepTrainer", "Fleet", "DistributedStrategy",
    "SparseTable", "DenseTable", "Uniform", "Constant", "Normal", "SGD", "Adagrad", "Adam", "ExponentialDecay",
    "ApsError", "ProtocolError", "LocalProtocolError", "RemoteProtocolError", "ConnectionLost", "RequestTimeout",
    "ServerError", "ConfigError", "DataError", "ErrorCode",
]
