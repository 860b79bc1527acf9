"""Replay detection: a retried mutating request is answered, not applied, a second time."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class ReplayCache:
    """Recent mutating request ids per client, so a retried push is not applied twice."""

    def __init__(self, window: int, max_clients: int = 4096) -> None:
        self.window = window
        self.max_clients = max_clients
        self._clients: OrderedDict[int, OrderedDict[int, Any]] = OrderedDict()

    def get(self, client_id: int, request_id: int) -> Any:
        seen = self._clients.get(client_id)
        return None if seen is None else seen.get(request_id)

    def put(self, client_id: int, request_id: int, reply: Any) -> None:
        seen = self._clients.get(client_id)
        if seen is None:
            seen = self._clients[client_id] = OrderedDict()
            if len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(client_id)
        seen[request_id] = reply
        if len(seen) > self.window:
            seen.popitem(last=False)

    def discard(self, client_id: int, replies: list[Any]) -> None:
        """Forget the entries of ``client_id`` whose reply is one of ``replies`` (by identity):
        requests withdrawn before they finished, which a retry must run again."""
        seen = self._clients.get(client_id)
        if seen is None or not replies:
            return
        gone = {id(r) for r in replies}
        for request_id in [rid for rid, reply in seen.items() if id(reply) in gone]:
            del seen[request_id]

    def forget(self, client_id: int) -> None:
        self._clients.pop(client_id, None)
