"""A pserver's Prometheus metrics, read from its :class:`ServerCore` when Prometheus scrapes.

The collector reads the numbers the server keeps anyway (``ServerStats`` per op and per port,
the tables, the lagged-gradient versions): no second bookkeeping on the request path. It runs
in prometheus-client's thread and only reads (see aps/telemetry.py on threading).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..storage.hash.store import HashSparseStore
from ..storage.tables import Shard, SparseShard
from ..telemetry import new_registry
from .core import ServerCore
from .stats import PortStats


class ServerCollector(Collector):
    """A pserver's numbers, read from its ``ServerCore`` at scrape time."""

    def __init__(self, core: ServerCore) -> None:
        self.core = core

    def collect(self) -> Iterable[Metric]:
        core = self.core
        stats = core.stats
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
        yield CounterMetricFamily("aps_server_shrinks", "Hash table shrinks run (asked by clients or on the schedule).",
                                  value=stats.shrinks)
        yield CounterMetricFamily("aps_server_shrink_evicted_keys", "Keys of hash tables deleted by shrinks.",
                                  value=stats.shrink_evicted)
        yield from _port_metrics(list(stats.ports))  # the server may (re)fill the list meanwhile
        yield from _lagged_metrics(core)
        yield GaugeMetricFamily("aps_server_trainers", "Trainers this pserver expects.", value=core.config.num_trainers)
        yield GaugeMetricFamily(
            "aps_server_trainers_done", "Trainers that have sent worker_done.", value=len(core.done_trainers)
        )
        yield GaugeMetricFamily("aps_server_shard_index", "Which shard of every table this pserver owns.",
                                value=core.config.server_index)
        yield GaugeMetricFamily("aps_server_shards", "Number of pservers (shards).", value=core.config.num_servers)

        tables = dict(core.tables)  # a load replaces the dict wholesale; keep one version
        rows = GaugeMetricFamily("aps_server_table_rows", "Rows of a sparse table held by this pserver.", labels=["table"])
        values = GaugeMetricFamily(
            "aps_server_table_values", "Parameters (float32 values) of a table held by this pserver.", labels=["table"]
        )
        nbytes = GaugeMetricFamily(
            "aps_server_table_bytes", "Bytes of a table held by this pserver: values and optimizer state.", labels=["table"]
        )
        keys = GaugeMetricFamily("aps_server_table_keys", "Keys of a hash table held by this pserver.", labels=["table"])
        admission = CounterMetricFamily(
            "aps_server_table_key_events", "Keys of a hash table admitted or evicted, and pushed occurrences rejected "
            "(over_budget: those for a size budget), by this pserver.", labels=["table", "event"]
        )
        for name, shard in sorted(tables.items()):
            if isinstance(shard, HashSparseStore):
                held = shard.counts()
                keys.add_metric([name], held["keys"])
                values.add_metric([name], held["keys"] * shard.spec.dim)
                for event in ("admitted", "rejected", "evicted", "over_budget"):
                    admission.add_metric([name, event], held[event])
            elif isinstance(shard, SparseShard):
                rows.add_metric([name], shard.local_rows)
                values.add_metric([name], shard.values.size)
            else:
                values.add_metric([name], sum(b.size for b in dict(shard.blocks).values()))
            size = _table_bytes(shard)
            if size is not None:
                nbytes.add_metric([name], size)
        yield from (rows, values, nbytes, keys, admission)


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


def _lagged_metrics(core: ServerCore) -> Iterator[Metric]:
    """Async gradients dropped as too old (--async-lagged-grad-discard-ratio), per table: zero
    for every table held, so a dashboard sees the series before the first drop."""
    versions = core.versions
    dropped = dict(versions.dropped)
    family = CounterMetricFamily(
        "aps_server_lagged_grads_dropped",
        "Async gradient pushes (messages) dropped because their parameters were more than the "
        "lagged-gradient limit of updates old, per table.",
        labels=["table"],
    )
    for table in sorted(set(core.tables) | set(dropped)):
        family.add_metric([table], dropped.get(table, 0))
    yield family
    if versions.limit != float("inf"):
        yield GaugeMetricFamily(
            "aps_server_lagged_grad_limit",
            "Updates a gradient may be behind before it is dropped (ratio x trainers); absent when the rule is off.",
            value=versions.limit,
        )


def _op_label(message_class: str) -> str:
    """``PullSparse`` -> ``pull_sparse``: ServerStats keys ops by message class; the label uses
    the opcode's name as docs/protocol.md spells it (Op.PULL_SPARSE), in Prometheus' lower case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", message_class).lower()


def _table_bytes(shard: Shard | HashSparseStore) -> int | None:
    """``shard.nbytes``, which sums over dicts the event loop may grow meanwhile (a geo client
    registering for change tracking): retry the rare "changed size during iteration"."""
    for _ in range(3):
        try:
            return int(shard.nbytes)
        except RuntimeError:
            continue
    return None


def server_registry(core: ServerCore) -> CollectorRegistry:
    """A fresh registry with the pserver's collector and its process metrics."""
    return new_registry(ServerCollector(core))
