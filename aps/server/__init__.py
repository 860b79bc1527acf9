"""The pserver: storage, optimizer kernels, checkpoints and the TCP server."""

from .config import ServerConfig
from .pserver import PServer, serve

__all__ = ["PServer", "ServerConfig", "serve"]
