"""Request counters and latency histograms for the stats op."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_BUCKETS = 64  # log2 buckets of nanoseconds: bucket b holds [2^(b-1), 2^b) (bucket 0: exactly 0)

#: the histogram edges exported to Prometheus: every power of two from 2^10 ns (~1 us) to
#: 2^34 ns (~17 s). They coincide with bucket edges, so the export needs no second histogram on
#: the hot path; faster or slower requests still count in the +Inf bucket and in the sum.
EXPORTED_EDGES_LOG2 = range(10, 35)


@dataclass
class OpStats:
    """Count, bytes and a log2 latency histogram of one opcode."""

    count: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    total_ns: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * _BUCKETS)  # a list: cheaper to bump than numpy

    def record(self, elapsed_ns: int, bytes_in: int, bytes_out: int, error: bool) -> None:
        self.count += 1
        self.errors += int(error)
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        self.total_ns += elapsed_ns
        self.histogram[min(_BUCKETS - 1, max(0, elapsed_ns).bit_length())] += 1

    def quantile_us(self, q: float) -> float:
        """Upper edge of the bucket holding quantile ``q`` (a factor-2 resolution estimate)."""
        if not self.count:
            return 0.0
        rank = math.ceil(q * self.count)
        bucket = int(np.searchsorted(np.cumsum(self.histogram), rank))
        return (1 << bucket) / 1000.0

    def cumulative_seconds(self) -> tuple[list[tuple[float, int]], int]:
        """``([(upper edge in seconds, requests at or below it), ...], total)`` for
        :data:`EXPORTED_EDGES_LOG2`.

        Read from one copy of the histogram, so the buckets agree with each other and with the
        total even when a metrics thread reads while the event loop records (under the GIL a
        list copy is atomic; the count field next to it may already be one request further).
        """
        hist = list(self.histogram)
        cumulative = 0
        edges = []
        b = 0
        for edge in EXPORTED_EDGES_LOG2:
            while b <= edge:
                cumulative += hist[b]
                b += 1
            edges.append(((1 << edge) / 1e9, cumulative))
        return edges, cumulative + sum(hist[b:])

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "errors": self.errors,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "mean_us": round(self.total_ns / self.count / 1000.0, 3) if self.count else 0.0,
            "p50_us": self.quantile_us(0.5),
            "p99_us": self.quantile_us(0.99),
        }


@dataclass
class PortStats:
    """Traffic that arrived on one of a server's ports (it listens on several with the v2
    launch parameters): connections, frames and bytes, and frames per opcode name."""

    port: int
    kind: str  # "dense" (dense tables and control requests) or "sparse"
    connections: int = 0
    connections_total: int = 0
    frames: int = 0
    bytes_in: int = 0
    ops: dict[str, int] = field(default_factory=dict)

    def frame(self, op: str, size: int) -> None:
        self.frames += 1
        self.bytes_in += size
        self.ops[op] = self.ops.get(op, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "port": self.port, "kind": self.kind, "connections": self.connections,
            "connections_total": self.connections_total, "frames": self.frames, "bytes_in": self.bytes_in,
            "ops": dict(sorted(self.ops.items())),
        }


class ServerStats:
    """Per-op statistics of one pserver."""

    def __init__(self) -> None:
        self.ops: dict[str, OpStats] = {}
        #: one entry per listening port, in port order (filled in when the server listens)
        self.ports: list[PortStats] = []
        self.connections = 0
        self.connections_total = 0
        #: connections closed at once because of max_connections / max_connections_per_address
        self.connections_refused = 0
        #: seconds the last checkpoint took to write (0: none yet), and how many were written
        self.last_save_seconds = 0.0
        self.saves = 0
        #: hash table shrinks run (asked by clients or on the schedule) and the keys they deleted
        self.shrinks = 0
        self.shrink_evicted = 0

    def finished(self, op: str, started_ns: int, bytes_in: int, bytes_out: int, error: bool) -> None:
        """A request ``op`` that began at ``started_ns`` (``time.perf_counter_ns``) was answered
        now with ``bytes_out`` (an error reply: ``error``, its bytes not counted)."""
        stats = self.ops.get(op)
        if stats is None:
            stats = self.ops[op] = OpStats()
        stats.record(time.perf_counter_ns() - started_ns, bytes_in, bytes_out, error)

    def opened(self) -> None:
        """A connection was accepted (and not refused at once)."""
        self.connections += 1
        self.connections_total += 1

    def refused(self) -> None:
        """A connection was closed by the connection caps, when accepted or after its handshake."""
        self.connections_refused += 1

    def closed(self) -> None:
        """An opened connection is gone."""
        self.connections -= 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "connections_total": self.connections_total,
            "connections_refused": self.connections_refused,
            "last_save_seconds": self.last_save_seconds,
            "saves": self.saves,
            "shrinks": self.shrinks,
            "shrink_evicted": self.shrink_evicted,
            "requests": sum(s.count for s in self.ops.values()),
            "bytes_in": sum(s.bytes_in for s in self.ops.values()),
            "bytes_out": sum(s.bytes_out for s in self.ops.values()),
            "ops": {name: s.as_dict() for name, s in sorted(self.ops.items())},
            "ports": [p.as_dict() for p in self.ports],
        }
