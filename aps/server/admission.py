"""Which new connections a pserver accepts: a cap on open connections, server-wide and per
client address.

Without a cap, idle connections that only say HELLO (no token needed) use up the process's file
descriptors, and then the pserver cannot accept its own trainers' connections; nothing says why.
With it, a connection over either cap is closed as soon as it is accepted, before it holds any
buffer, and a warning says who was refused and which limit was hit (at most one line per
``log_every`` seconds, with how many were refused since the last one). The per-address cap keeps
one host from taking every slot; trainers open one connection per pserver port, so the default
leaves room for many trainers on one host.
"""

from __future__ import annotations

import time
from collections import Counter

import structlog

log = structlog.get_logger("aps.server")


class Admission:
    """Counts open connections by client address and says whether a new one is refused."""

    def __init__(self, max_connections: int, max_per_address: int, log_every: float = 10.0) -> None:
        self.max_connections = max_connections  # 0: no limit
        self.max_per_address = max_per_address  # 0: no limit
        self.log_every = log_every
        self.open = 0
        self.by_address: Counter[str] = Counter()
        self.refused = 0  # since the server started (in stats)
        self._unlogged = 0
        self._logged_at = float("-inf")

    def admit(self, address: str) -> bool:
        """Count a new connection from ``address`` and return True, or return False (and count
        the refusal) when it would exceed a cap."""
        if self.max_connections and self.open >= self.max_connections:
            self._refuse(address, f"{self.open} connections open (max_connections {self.max_connections})")
            return False
        if self.max_per_address and self.by_address[address] >= self.max_per_address:
            self._refuse(address, f"{self.by_address[address]} connections open from this address "
                                  f"(max_connections_per_address {self.max_per_address})")
            return False
        self.open += 1
        self.by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        """An admitted connection from ``address`` has closed."""
        self.open -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]

    def _refuse(self, address: str, why: str) -> None:
        self.refused += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= self.log_every:
            log.warning("connection refused", peer=address, reason=why, refused_since_last_line=self._unlogged)
            self._logged_at, self._unlogged = now, 0
