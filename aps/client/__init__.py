"""The async client: connections, sharding of requests, retries."""

from .psclient import PSClient, connect

__all__ = ["PSClient", "connect"]
