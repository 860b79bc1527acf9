"""The transport's Prometheus metrics: requests per opcode (count, errors, bytes, latency),
connections, and each listening port's traffic, read from :class:`~aps.server.stats.ServerStats`
when Prometheus scrapes. Every server has them (a pserver adds its tables' numbers, collector.py;
aps-serve its served model's). Read-only, in prometheus-client's thread (aps/telemetry.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..stats import PortStats, ServerStats


class RequestCollector(Collector):
    """A server's request, connection and port numbers, read at scrape time."""

    def __init__(self, stats: ServerStats) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self.stats
        ops = dict(stats.ops)  # the event loop may add an op meanwhile
        requests = CounterMetricFamily("aps_server_requests", "Requests served, by opcode.", labels=["op"])
        errors = CounterMetricFamily("aps_server_request_errors", "Requests answered with an error, by opcode.", labels=["op"])
        received = CounterMetricFamily("aps_server_received_bytes", "Request frame bytes received, by opcode.", labels=["op"])
        sent = CounterMetricFamily("aps_server_sent_bytes", "Reply frame bytes sent, by opcode.", labels=["op"])
        latency = HistogramMetricFamily(
            "aps_server_request_duration_seconds",
            "Time from a request's arrival to its reply being written, by opcode "
            "(waits at barriers and sync rounds included).",
            labels=["op"],
        )
        for name, s in sorted(ops.items()):
            op = _op_label(name)
            requests.add_metric([op], s.count)
            errors.add_metric([op], s.errors)
            received.add_metric([op], s.bytes_in)
            sent.add_metric([op], s.bytes_out)
            edges, total = s.cumulative_seconds()
            buckets = [(floatToGoString(le), float(n)) for le, n in edges] + [("+Inf", float(total))]
            latency.add_metric([op], buckets, sum_value=s.total_ns / 1e9)
        yield from (requests, errors, received, sent, latency)

        yield GaugeMetricFamily("aps_server_connections", "Client connections open now.", value=stats.connections)
        yield CounterMetricFamily(
            "aps_server_connections_accepted", "Client connections accepted since start.", value=stats.connections_total
        )
        yield CounterMetricFamily(
            "aps_server_connections_refused",
            "Connections closed on accept for going over --max-connections or --max-connections-per-address.",
            value=stats.connections_refused,
        )
        yield from _port_metrics(list(stats.ports))  # the server may (re)fill the list meanwhile


def _port_metrics(ports: list[PortStats]) -> Iterator[Metric]:
    """Per listening port (several with the v2 launch parameters --ports-num and
    --ports-num-for-sparse), labelled ``port`` and ``kind`` (dense or sparse): what the STATS
    reply's ``ports`` list says, so one can see that a client spreads its traffic as asked."""
    labels = ["port", "kind"]
    open_now = GaugeMetricFamily("aps_server_port_connections", "Client connections open now, per port.", labels=labels)
    accepted = CounterMetricFamily(
        "aps_server_port_connections_accepted", "Client connections accepted since start, per port.", labels=labels
    )
    frames = CounterMetricFamily("aps_server_port_frames", "Frames received, per port.", labels=labels)
    received = CounterMetricFamily("aps_server_port_received_bytes", "Frame bytes received, per port.", labels=labels)
    by_op = CounterMetricFamily(
        "aps_server_port_requests", "Frames received, per port and opcode.", labels=[*labels, "op"]
    )
    for p in ports:
        key = [str(p.port), p.kind]
        open_now.add_metric(key, p.connections)
        accepted.add_metric(key, p.connections_total)
        frames.add_metric(key, p.frames)
        received.add_metric(key, p.bytes_in)
        for op, count in sorted(dict(p.ops).items()):
            by_op.add_metric([*key, op.lower()], count)
    yield from (open_now, accepted, frames, received, by_op)


def _op_label(message_class: str) -> str:
    """``PullSparse`` -> ``pull_sparse``: ServerStats keys ops by message class; the label uses
    the opcode's name as docs/protocol.md spells it (Op.PULL_SPARSE), in Prometheus' lower case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", message_class).lower()
