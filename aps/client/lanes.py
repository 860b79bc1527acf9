"""Which of a pserver's ports a request goes to (the v2 launch parameters).

A pserver started with ``--port P --ports-num N --ports-num-for-sparse M`` listens on ports
``P .. P+N+M-1``: the first ``N`` (the dense ports) for dense tables and control requests, the
last ``M`` (the sparse ports) for sparse tables. Every port serves every request; the split only
spreads the traffic over several connections, as the reference's trainers did. An aps client
given the same three numbers opens one connection per port of every pserver ("lanes", numbered
from 0 = port ``P``) and sends:

* control requests (HELLO, CREATE_TABLE, TABLE_INFO, BARRIER, SAVE, LOAD, STATS, WORKER_DONE)
  on lane 0; heartbeats (PING) on every lane;
* dense-table requests (PULL_DENSE, PUSH_DENSE_*) on the dense lanes in turn, one dense block
  at a time: the blocks a call touches on one server take consecutive dense lanes, starting
  where that server's previous dense block left off, and every chunk of one block goes on the
  same lane (so its FINAL chunk never overtakes the others);
* sparse-table requests (PULL_SPARSE, PUSH_SPARSE_*, PULL_SPARSE_CHANGED) on the sparse lanes
  in turn, one call at a time per server (all chunks of one call to one server on one lane);
  with ``M = 0`` on the dense lanes, in the same turn as the dense blocks.
"""

from __future__ import annotations

from ..validate import count


class PortPlan:
    """The lanes of each pserver and whose turn it is next, per server and kind."""

    def __init__(self, num_servers: int, ports_num: int = 1, ports_num_for_sparse: int = 0) -> None:
        for name, value, least in (("ports_num", ports_num, 1), ("ports_num_for_sparse", ports_num_for_sparse, 0)):
            count(name, value, zero=None, least=least)
        self.dense = ports_num
        self.sparse = ports_num_for_sparse
        self._dense_turn = [0] * num_servers
        self._sparse_turn = [0] * num_servers

    @property
    def lanes(self) -> int:
        """Ports (and connections) per pserver."""
        return self.dense + self.sparse

    def dense_lane(self, server: int) -> int:
        """The lane of the next dense block sent to ``server``."""
        turn = self._dense_turn[server]
        self._dense_turn[server] = (turn + 1) % self.dense
        return turn

    def sparse_lane(self, server: int) -> int:
        """The lane of the next sparse call to ``server``."""
        if not self.sparse:
            return self.dense_lane(server)
        turn = self._sparse_turn[server]
        self._sparse_turn[server] = (turn + 1) % self.sparse
        return self.dense + turn


def lane_address(address: str, lane: int) -> str:
    """``host:port`` of lane ``lane`` of the pserver whose first port is ``address``."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + lane}"
