"""What ``PSClient.table_info`` returns: a table's spec and its contents summed over the pservers.

Each pserver answers a detailed TABLE_INFO for its own shard (docs/protocol.md); the client adds
the counts up, so a caller sees one table, not N shards.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import RemoteProtocolError
from ..specs import TABLE_SPECS, TableSpec, spec_from_dict

#: the counts a detailed TABLE_INFO reply carries beside the spec
COUNTS = ("keys", "bytes", "admitted", "rejected", "evicted")


@dataclass(frozen=True)
class TableInfo:
    """A table over every pserver: ``keys`` held (a hash table's keys; a fixed table's rows, a
    dense table's values), ``bytes`` reserved, and for hash tables the keys ``admitted`` and
    ``evicted`` and the pushed occurrences ``rejected`` (not admitted) since creation."""

    spec: TableSpec
    keys: int
    bytes: int
    admitted: int
    rejected: int
    evicted: int
    #: of ``rejected``, those refused because a pserver's size budget (``--max-tables-bytes``,
    #: ``--max-table-bytes``) had no room for new keys (0 from servers that do not count them)
    over_budget: int = 0
    #: bytes of rows kept in files on the pservers' disks (0: every table kind today keeps its
    #: rows in RAM; a pserver reports ``disk_bytes`` in TABLE_INFO for one that does not)
    disk_bytes: int = 0

    @property
    def ram_bytes(self) -> int:
        """Bytes the table reserves in the pservers' memory (``bytes``)."""
        return self.bytes


def merge_info(texts: Sequence[bytes], specs: Iterable[type[Any]] = TABLE_SPECS) -> TableInfo:
    """One :class:`TableInfo` from every pserver's detailed TABLE_INFO reply (its spec one of
    the classes ``specs``: the client's)."""
    bodies: list[dict[str, Any]] = [json.loads(text) for text in texts]
    for body in bodies:
        if not isinstance(body, dict) or "spec" not in body or any(not isinstance(body.get(k), int) for k in COUNTS):
            raise RemoteProtocolError(f"a TABLE_INFO reply without the detail asked for: {str(body)[:200]}")
    totals = {k: sum(int(b[k]) for b in bodies) for k in COUNTS}
    over_budget = sum(int(b.get("over_budget", 0)) for b in bodies)
    disk_bytes = sum(int(b.get("disk_bytes", 0)) for b in bodies)
    return TableInfo(spec=spec_from_dict(bodies[0]["spec"], specs), **totals, over_budget=over_budget, disk_bytes=disk_bytes)
