"""A pserver's Prometheus metrics, read from its :class:`ServerCore` when Prometheus scrapes.

The collector reads the numbers the server keeps anyway (the transport's request, connection and
port numbers, transport/metrics.py; the tables, the lagged-gradient versions): no second bookkeeping on the request path. It runs
in prometheus-client's thread and only reads (see aps/telemetry.py on threading).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..telemetry import new_registry
from .core import ServerCore
from .transport.metrics import RequestCollector


class ServerCollector(Collector):
    """A pserver's numbers, read from its ``ServerCore`` at scrape time."""

    def __init__(self, core: ServerCore) -> None:
        self.core = core

    def collect(self) -> Iterable[Metric]:
        core = self.core
        stats = core.stats
        yield from RequestCollector(stats).collect()
        yield CounterMetricFamily("aps_server_shrinks", "Hash table shrinks run (asked by clients or on the schedule).",
                                  value=stats.shrinks)
        yield CounterMetricFamily("aps_server_shrink_evicted_keys", "Keys of hash tables deleted by shrinks.",
                                  value=stats.shrink_evicted)
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
        disk_bytes = GaugeMetricFamily("aps_server_table_disk_bytes", "Bytes of a disk table's rows on this pserver's disk.",
                                       labels=["table"])
        hot_keys = GaugeMetricFamily("aps_server_table_hot_keys", "Keys of a disk table whose rows this pserver holds in RAM.",
                                     labels=["table"])
        disk_events = CounterMetricFamily(
            "aps_server_table_disk_events", "A disk table's keys asked for by pulls and pushes (requested_keys), rows "
            "read from disk (disk_read_rows: 1 - rate(disk_read_rows) / rate(requested_keys) is the hit rate), rows "
            "brought into RAM (paged_in; a pull stages a row it reads and brings it in at its key's next pull or push, "
            "staged_hits) and sent out (paged_out), batched disk reads (disk_reads) and rows written (disk_written_rows), "
            "by this pserver.",
            labels=["table", "event"],
        )
        for name, shard in sorted(tables.items()):
            held = core.kinds.of(shard).gauges(shard)
            if "disk_bytes" in held:
                disk_bytes.add_metric([name], held["disk_bytes"])
                hot_keys.add_metric([name], held["hot_keys"])
                for event in DISK_EVENTS:
                    disk_events.add_metric([name, event], held[event])
            values.add_metric([name], held["values"])
            if "rows" in held:
                rows.add_metric([name], held["rows"])
            if "keys" in held:
                keys.add_metric([name], held["keys"])
                for event in ("admitted", "rejected", "evicted", "over_budget"):
                    admission.add_metric([name, event], held[event])
            size = _table_bytes(shard)
            if size is not None:
                nbytes.add_metric([name], size)
        yield from (rows, values, nbytes, keys, admission, disk_bytes, hot_keys, disk_events)


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


#: a disk table's counts the metrics carry as events (DiskHashStore.counts)
DISK_EVENTS = ("requested_keys", "disk_read_rows", "staged_hits", "paged_in", "paged_out", "disk_reads", "disk_written_rows")


def _table_bytes(shard: Any) -> int | None:
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
