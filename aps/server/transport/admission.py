"""Which new connections a pserver accepts: a cap on open connections, server-wide and per
client address.

Without a cap, idle connections that only say HELLO (no token needed) use up the process's file
descriptors, and then the pserver cannot accept its own trainers' connections; nothing says why.
With it, a connection over a cap is closed (at once when accepted, before it holds any
buffer, or once through its handshake; or the oldest connection still in its handshake is
closed for it: see :class:`Admission`), and a warning says who and which limit (at most one
line per ``log_every`` seconds, with how many since the last one). The per-address cap keeps
one host from taking every slot; trainers open one connection per pserver port, so the default
leaves room for many trainers on one host.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Any

import structlog

log = structlog.get_logger("aps.server")


class Admission:
    """Counts open connections by client address and says which new one is refused.

    A connection is *handshaking* from its accept until its handshake is done, then
    *established*. The two are counted apart, each against ``max_per_address``: idle
    connections that never finish a handshake (a local process opening hundreds) cannot take
    the slots of clients that do. When an address's handshaking slots are full, or the server's
    ``max_connections`` are and some connection is handshaking, the oldest handshaking
    connection (of that address, or of any) is evicted to make room for the new one: a client
    that finishes its handshake at once always gets in, and an idle one only waits to go.
    Connections are opaque handles here; the caller closes the ones :meth:`admit` evicts.
    """

    def __init__(self, max_connections: int, max_per_address: int, log_every: float = 10.0) -> None:
        self.max_connections = max_connections  # 0: no limit
        self.max_per_address = max_per_address  # 0: no limit
        self.log_every = log_every
        self.open = 0
        self.by_address: Counter[str] = Counter()  # established connections
        #: handshaking connections, oldest first, per address and in all
        self._handshaking: dict[str, OrderedDict[Any, None]] = {}
        self._oldest: OrderedDict[Any, str] = OrderedDict()
        self.refused = 0  # since the server started (in stats)
        self.evicted = 0  # handshaking connections closed to make room (in stats)
        self._unlogged = 0
        self._logged_at = float("-inf")

    def admit(self, address: str, handle: Any) -> tuple[bool, list[Any]]:
        """Count a new (handshaking) connection from ``address``: (admitted, the handshaking
        connections evicted for it, no longer counted, for the caller to close). Refused (and
        counted) when the server is full of established connections."""
        victims = []
        mine = self._handshaking.get(address)
        if self.max_per_address and mine is not None and len(mine) >= self.max_per_address:
            victims.append(next(iter(mine)))
            self._forget(victims[-1])
        if self.max_connections and self.open >= self.max_connections:
            if not self._oldest:
                self._refuse(address, f"{self.open} connections open, all through their handshake (max_connections {self.max_connections})")
                return False, victims
            victims.append(next(iter(self._oldest)))
            self._forget(victims[-1])
        if victims:
            self.evicted += len(victims)
            self._note(address, f"closed {len(victims)} connection(s) still in their handshake to make room")
        self.open += 1
        self._handshaking.setdefault(address, OrderedDict())[handle] = None
        self._oldest[handle] = address
        return True, victims

    def established(self, address: str, handle: Any) -> bool:
        """``handle`` finished its handshake: count it as established, or (False) refuse it when
        its address has ``max_per_address`` established already (it is then not counted)."""
        self._forget(handle)
        if self.max_per_address and self.by_address[address] >= self.max_per_address:
            self._refuse(address, f"{self.by_address[address]} connections open from this address "
                                  f"(max_connections_per_address {self.max_per_address})")
            if not self.by_address[address]:
                del self.by_address[address]
            return False
        self.open += 1
        self.by_address[address] += 1
        return True

    def release(self, address: str, handle: Any) -> None:
        """An admitted connection from ``address`` has closed."""
        if handle in self._oldest:
            self._forget(handle)
            return
        self.open -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]

    def _forget(self, handle: Any) -> None:
        """Stop counting a handshaking connection."""
        address = self._oldest.pop(handle)
        mine = self._handshaking[address]
        del mine[handle]
        if not mine:
            del self._handshaking[address]
        self.open -= 1

    def _refuse(self, address: str, why: str) -> None:
        self.refused += 1
        self._note(address, why)

    def _note(self, address: str, why: str) -> None:
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= self.log_every:
            log.warning("connection refused", peer=address, reason=why, refused_since_last_line=self._unlogged)
            self._logged_at, self._unlogged = now, 0
