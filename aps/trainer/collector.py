"""A trainer's Prometheus metrics: the workers' shared stat rows and AUC counts, the
communicator's counters and the monitor's last progress report, read when Prometheus scrapes
(in prometheus-client's thread, reading only: see aps/telemetry.py on threading).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..metrics import merged_auc
from ..telemetry import new_registry
from .communicator import Communicator
from .monitor import Monitor
from .shared import STAT

#: a mode's counters (Mode.report) by key: the kind of metric, its name and its help
MODE_METRICS: dict[str, tuple[str, str, str]] = {
    "pushes": ("counter", "aps_trainer_pushes", "Merged gradient pushes sent to the pservers."),
    "geo_syncs": ("counter", "aps_trainer_geo_syncs", "Geo mode: delta exchanges with the pservers."),
    "geo_cache_evictions": (
        "counter", "aps_trainer_geo_cache_evictions",
        "Geo mode: rows the hash tables' local caches evicted because they were full.",
    ),
    "geo_cache_evicted_deltas": (
        "counter", "aps_trainer_geo_cache_evicted_deltas", "Geo mode: evicted rows whose pending delta was pushed on eviction.",
    ),
    "geo_cache_held": ("gauge", "aps_trainer_geo_cache_held_rows", "Geo mode: rows the hash tables' local caches hold."),
    "geo_cache_capacity": (
        "gauge", "aps_trainer_geo_cache_capacity_rows",
        "Geo mode: rows the hash tables' local caches can hold (--geo-cache-rows per table).",
    ),
    "send_queue_depth": ("gauge", "aps_trainer_send_queue_depth", "Async mode: batches of gradients waiting to be sent."),
    "send_queue_capacity": ("gauge", "aps_trainer_send_queue_capacity", "Async mode: send queue size (workers wait when full)."),
}
#: exported whatever the mode (0 where it has none), so a dashboard's query never finds no series
_ALWAYS = ("pushes", "geo_syncs")

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
            yield from _mode_metrics(comm.report(), gauge, counter)


def _mode_metrics(
    report: dict[str, float], gauge: Callable[[str, str, float], Metric], counter: Callable[[str, str, float], Metric]
) -> Iterator[Metric]:
    """The mode's counters (Communicator.report) as metrics: those of MODE_METRICS it has, and
    ``pushes`` and ``geo_syncs`` always (0 where the mode has none)."""
    kinds = {"counter": counter, "gauge": gauge}
    for key, (kind, name, doc) in MODE_METRICS.items():
        if key in report or key in _ALWAYS:
            yield kinds[kind](name, doc, report.get(key, 0))


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
    return new_registry(TrainerCollector(probe))
