"""aps: an asyncio parameter server for training sparse models.

Public names only; see README.md for a tour.

Only the error tree is imported with ``import aps``; every other public name is imported on first
use (module ``__getattr__``). A client-only program therefore does not pay for the trainer, the
server or numba until it touches them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    TokenMissing,
    WorkerFailed,
)

if TYPE_CHECKING:
    from .checkpoints.reader import Checkpoint, read_checkpoint
    from .client import PSClient, connect
    from .client.export import ExportInfo
    from .cluster import ClusterSpec
    from .fleet import DistributedStrategy, Fleet
    from .launcher import LaunchResult, LocalCluster, PServerProcess, RoleResult, launch
    from .server import PServer, ServerConfig, serve
    from .serving.server import ServingServer, serve_exports
    from .specs import (
        SGD,
        Adagrad,
        Adam,
        Constant,
        DenseTable,
        Disk,
        ExponentialDecay,
        Ftrl,
        HashTable,
        Normal,
        SparseTable,
        Uniform,
    )
    from .trainer import Batch, Grads, Model, Params, StepTrainer, Strategy, Trainer, TrainOptions

__version__ = "0.1.0"

#: public name -> the module (relative to aps) that defines it
_LAZY = {
    **dict.fromkeys(("connect", "PSClient"), "client"),
    "ClusterSpec": "cluster",
    "ExportInfo": "client.export",
    **dict.fromkeys(("serve_exports", "ServingServer"), "serving.server"),
    **dict.fromkeys(("PServer", "ServerConfig", "serve"), "server"),
    **dict.fromkeys(("read_checkpoint", "Checkpoint"), "checkpoints.reader"),
    **dict.fromkeys(("SparseTable", "DenseTable", "HashTable", "Uniform", "Constant", "Normal", "SGD", "Adagrad", "Adam",
                     "Ftrl", "ExponentialDecay", "Disk"), "specs"),
    **dict.fromkeys(("Trainer", "TrainOptions", "StepTrainer", "Strategy", "Model", "Batch", "Params", "Grads"),
                    "trainer"),
    **dict.fromkeys(("Fleet", "DistributedStrategy"), "fleet"),
    **dict.fromkeys(("launch", "LocalCluster", "LaunchResult", "RoleResult", "PServerProcess"), "launcher"),
}

__all__ = [
    "connect", "serve", "PSClient", "PServer", "ServerConfig", "ClusterSpec", "Strategy", "Trainer", "TrainOptions",
    "serve_exports", "ServingServer", "ExportInfo", "read_checkpoint", "Checkpoint",
    "StepTrainer", "Model", "Batch", "Params", "Grads", "Fleet", "DistributedStrategy",
    "launch", "LocalCluster", "LaunchResult", "RoleResult", "PServerProcess",
    "SparseTable", "DenseTable", "HashTable", "Uniform", "Constant", "Normal", "SGD", "Adagrad", "Adam", "Ftrl",
    "ExponentialDecay", "Disk", "ApsError", "ProtocolError", "LocalProtocolError", "RemoteProtocolError", "ConnectionLost", "RequestTimeout",
    "ServerError", "ConfigError", "TokenMissing", "DataError", "WorkerFailed", "ErrorCode",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (and any ``aps.<submodule>``), then cache it."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
