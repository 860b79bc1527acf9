"""Prometheus metrics of a pserver and of a trainer, served over HTTP by prometheus-client.

Why collectors and not Counter/Histogram objects: aps already counts everything it reports
(``ServerStats`` per op, the workers' shared stat rows, the shared AUC counts, the
communicator's counters). A custom collector reads those numbers when Prometheus scrapes, so the
request path and the workers' kernels do no second bookkeeping and the two views cannot disagree.

Every pserver and every trainer gets its own :class:`~prometheus_client.CollectorRegistry`
(never prometheus-client's global ``REGISTRY``): several servers or trainers may live in one
process (tests, an embedding application) and each must report only itself.

Threading: prometheus-client serves scrapes from its own thread, so collectors run outside the
event loop. They only *read*: plain ints, copies of dicts and lists (atomic under the GIL) and
numpy arrays in shared memory. A scrape may therefore see a request or a batch half-way counted;
the next scrape is consistent again. In exchange a scrape still answers when the event loop is
stuck, which is when one wants the numbers most.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

import numpy as np
import structlog
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .errors import ConfigError
from .metrics import merged_auc

if TYPE_CHECKING:
    from .server.core import ServerCore
    from .server.stats import PortStats
    from .trainer.communicator import Communicator
    from .trainer.monitor import Monitor

log = structlog.get_logger("aps.telemetry")

#: prefix of every metric aps exports (process metrics included: aps_process_resident_memory_bytes)
NAMESPACE = "aps"


def check_metrics_options(port: int | None, port_file: str | None) -> None:
    """Refuse settings that could only be a mistake, at configuration time rather than at start."""
    if port is not None and not 0 <= port < 65536:
        raise ConfigError(f"metrics port {port} out of range")
    if port_file is not None and port is None:
        raise ConfigError("a metrics port file needs a metrics port (--metrics-port)")


def write_port_file(path: str, port: int) -> None:
    """Write ``port`` to ``path`` atomically, so a launcher polling for the file never reads half
    a number (the same protocol as aps-server's --port-file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


class MetricsEndpoint:
    """``GET /metrics`` for one registry, served by prometheus-client from a daemon thread.

    :meth:`close` stops the thread and frees the port, so a server or trainer that stops leaves
    nothing listening behind it (prometheus-client's own default would live until exit).
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, role: str, port_file: str | None = None) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.role = role
        self.port_file = port_file
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsEndpoint:
        """Bind and serve; with ``port`` 0 the bound port is in :attr:`port` afterwards.

        Binding is quick, so this is safe to call from the event loop."""
        try:
            self._httpd, self._thread = start_http_server(self.port, self.host, registry=self.registry)
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            raise ConfigError(f"cannot serve metrics on {self.host}:{self.port}: {reason}") from exc
        self.port = int(self._httpd.server_port)
        log.info("metrics endpoint", role=self.role, host=self.host, port=self.port)
        if self.port_file:
            write_port_file(self.port_file, self.port)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port (idempotent). Blocks up to half a second, the poll
        interval of the HTTP server's loop: from a coroutine use :meth:`aclose`."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5.0)

    async def aclose(self) -> None:
        """:meth:`close` in a worker thread, so the event loop keeps serving meanwhile."""
        if self._httpd is not None:
            await asyncio.to_thread(self.close)


def _new_registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    # RSS, CPU seconds, open fds of this process, read from /proc at scrape time (Linux)
    ProcessCollector(namespace=NAMESPACE, registry=registry)
    return registry


# ----------------------------------------------------------------------------------- pserver


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
            "aps_server_table_key_events", "Keys of a hash table admitted or evicted, and pushed occurrences rejected, by "
            "this pserver.", labels=["table", "event"]
        )
        for name, shard in sorted(tables.items()):
            local_rows = getattr(shard, "local_rows", None)  # duck-typed: the server package imports this module
            counts = getattr(shard, "counts", None)
            if counts is not None:  # a hash table
                held = counts()
                keys.add_metric([name], held["keys"])
                values.add_metric([name], held["keys"] * shard.spec.dim)  # type: ignore[union-attr]
                for event in ("admitted", "rejected", "evicted"):
                    admission.add_metric([name, event], held[event])
            elif local_rows is not None:  # sparse
                rows.add_metric([name], local_rows)
                values.add_metric([name], shard.values.size)  # type: ignore[union-attr]
            else:
                values.add_metric([name], sum(b.size for b in dict(shard.blocks).values()))  # type: ignore[union-attr]
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
    return _new_registry(ServerCollector(core))


# ----------------------------------------------------------------------------------- trainer


@dataclass
class TrainerProbe:
    """What a trainer's collector reads; the trainer fills it in as the pieces come to exist.

    ``stats`` and ``auc`` are the workers' shared arrays while training runs; :meth:`freeze`
    swaps in copies when training stops, so the registry still answers (with the final numbers)
    after the shared memory is gone.
    """

    trainer_id: int
    workers: int = 0
    stats: np.ndarray | None = None
    auc: np.ndarray | None = None
    comm: Communicator | None = None
    monitor: Monitor | None = None
    #: online training (aps-trainer --data-passes / --data-stream): the last pass's AUC of the
    #: predictions made before training on it (None: no pass scored yet), passes trained, and
    #: records read a second time after a restart (stream entries pending since a crash)
    online_auc: float | None = None
    passes: int | None = None
    reread: int = 0

    def freeze(self) -> None:
        if self.stats is not None:
            self.stats = np.array(self.stats, copy=True)
        if self.auc is not None:
            self.auc = np.array(self.auc, copy=True)


class TrainerCollector(Collector):
    """A trainer's numbers: the workers' stat rows and AUC counts, the communicator's
    counters, and the monitor's last progress report."""

    def __init__(self, probe: TrainerProbe) -> None:
        self.probe = probe

    def collect(self) -> Iterator[Metric]:
        from .trainer.shared import STAT  # the trainer package imports this module

        p = self.probe
        label = [str(p.trainer_id)]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["trainer"])
            g.add_metric(label, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["trainer"])
            c.add_metric(label, value)
            return c

        yield gauge("aps_trainer_workers", "Compute worker processes of this trainer.", p.workers)
        if p.stats is None:
            return
        total = np.asarray(p.stats).sum(axis=0)
        examples = float(total[STAT["examples"]])
        yield counter("aps_trainer_examples", "Examples (lines) trained since the trainer started.", examples)
        yield counter("aps_trainer_steps", "Batches trained, summed over the workers.", float(total[STAT["steps"]]))
        yield counter("aps_trainer_bad_lines", "Malformed input lines skipped (--skip-bad-lines).", float(total[STAT["bad_lines"]]))
        yield counter("aps_trainer_compute_seconds", "Seconds the workers spent in batch steps.", float(total[STAT["compute_s"]]))
        yield counter("aps_trainer_wait_seconds", "Seconds the workers waited for the communicator.", float(total[STAT["wait_s"]]))
        latest = p.monitor.latest if p.monitor is not None else None
        loss = latest.get("loss") if latest else None
        if loss is None and examples:
            loss = float(total[STAT["loss_sum"]]) / examples  # no report yet: the mean so far
        if loss is not None:  # NaN / inf pass through: a diverging model must show
            yield gauge("aps_trainer_loss", "Mean loss per example over the last progress report's period.", loss)
        if latest:
            yield gauge(
                "aps_trainer_examples_per_second",
                "Examples per second over the last progress report's period (rate() of "
                "aps_trainer_examples_total gives a scrape-aligned one).",
                float(latest["examples_per_s"]),
            )
            yield gauge(
                "aps_trainer_wait_share",
                "Seconds the workers waited for the communicator per second of compute, over the last "
                "report's period.",
                float(latest["wait_share"]),
            )
        if p.auc is not None and np.asarray(p.auc)[:, 0].any():
            auc, window = merged_auc(np.asarray(p.auc))
            yield gauge("aps_trainer_auc", "AUC of every prediction since the trainer started.", auc)
            yield gauge("aps_trainer_sliding_auc", "AUC of the last 20 batches of every worker.", window)
        yield from _online_metrics(p, gauge, counter)
        comm = p.comm
        if comm is not None:
            out = GaugeMetricFamily(
                "aps_trainer_pserver_unreachable_seconds",
                "Seconds each pserver this trainer cannot reach has been out of reach (no sample: all reachable).",
                labels=["trainer", "pserver"],
            )
            for outage in comm.ps.unreachable():
                out.add_metric([label[0], outage["address"]], outage["seconds"])
            yield out
            yield gauge("aps_trainer_epoch", "Epoch being trained (0-based).", comm.epoch)
            yield counter("aps_trainer_pushes", "Merged gradient pushes sent to the pservers.", comm.sends)
            yield counter("aps_trainer_geo_syncs", "Geo mode: delta exchanges with the pservers.", comm.geo_syncs)
            depth = comm.queue_depth
            if depth is not None:
                yield gauge("aps_trainer_send_queue_depth", "Async mode: batches of gradients waiting to be sent.", depth)
                yield gauge("aps_trainer_send_queue_capacity", "Async mode: send queue size (workers wait when full).",
                            comm.queue_capacity or 0)


def _online_metrics(
    p: TrainerProbe, gauge: Callable[[str, str, float], Metric], counter: Callable[[str, str, float], Metric]
) -> Iterator[Metric]:
    """An online trainer's numbers (nothing for a trainer of epochs over files)."""
    if p.passes is None:
        return
    yield counter("aps_trainer_passes", "Online passes trained (each scored first, then trained on).", p.passes)
    yield counter("aps_trainer_reread_records", "Records read a second time after a restart (stream entries "
                  "pending since a crash, trained again from the checkpoint before them).", p.reread)
    if p.online_auc is not None:
        yield gauge("aps_trainer_online_auc", "AUC of the last pass's predictions, made before training on it.", p.online_auc)


def trainer_registry(probe: TrainerProbe) -> CollectorRegistry:
    """A fresh registry with the trainer's collector and its process metrics (the trainer
    process only: the worker processes are not included)."""
    return _new_registry(TrainerCollector(probe))
