"""Training progress: periodic numbers (Paddle's fetch_handler), a live line on a terminal,
and records in a JSON-lines file (and any other sink, such as TensorBoard) so curves can be
plotted."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import structlog

from ..metrics import merged_auc
from ..records import append_record
from .shared import STAT

log = structlog.get_logger("aps.trainer")


@dataclass
class Snapshot:
    time: float
    loss_sum: float
    examples: float
    steps: float
    compute_s: float
    wait_s: float
    bad_lines: float
    stale_sum: float = 0.0
    #: every worker's steps by the staleness of their sparse rows, summed over workers
    stale_steps: np.ndarray | None = None
    #: the mode's counters (Mode.report; None: nobody to ask)
    report: dict[str, float] | None = None

    @classmethod
    def take(cls, stats: np.ndarray, staleness: np.ndarray | None = None, report: dict[str, float] | None = None) -> Snapshot:
        total = stats.sum(axis=0)
        return cls(
            time.monotonic(),
            float(total[STAT["loss_sum"]]),
            float(total[STAT["examples"]]),
            float(total[STAT["steps"]]),
            float(total[STAT["compute_s"]]),
            float(total[STAT["wait_s"]]),
            float(total[STAT["bad_lines"]]),
            float(total[STAT["stale_sum"]]),
            None if staleness is None else staleness.sum(axis=0),
            report,
        )


#: automatic progress records (``record_period=None``): the gap between two records is this
#: share of the time trained so far, at least ``AUTO_MIN_GAP`` seconds and at most the print
#: period, so a 20-second run gets some 80 points per curve and a day-long one one per period
AUTO_SHARE = 0.01
AUTO_MIN_GAP = 0.25
#: records kept in :attr:`Monitor.history` (the newest): enough for an embedding application to
#: look back, bounded however long a run lasts
HISTORY = 1000
#: a wake-up this early still counts as on time (event loop timers may fire a little early)
_SLACK = 0.005
#: what records carry of the mode's counters (Mode.report), where the mode has them: counts
#: (a progress record's since the trainer started, an epoch record's in its epoch, as ``steps``)
#: and levels at the record's time (geo's caches of hash tables: docs/operations.md)
RECORD_COUNTS = ("geo_cache_evictions", "geo_cache_evicted_deltas")
RECORD_LEVELS = ("geo_cache_held", "geo_cache_capacity")


class RecordSink(Protocol):
    """Something more that receives every record the metrics file gets (TensorBoard)."""

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@dataclass
class Monitor:
    """Writes progress records every ``record_period`` seconds (None: automatic, see
    ``AUTO_SHARE``) and shows a line every ``period`` seconds (<= 0: none); ``line`` is a
    terminal to redraw the line on, else it is logged.

    Records and lines keep apart because they serve different readers: a curve needs many
    points even in a short run, a person reading a log wants few lines."""

    stats: np.ndarray
    period: float
    trainer_id: int
    metrics_path: Path | None = None
    line: TextIO | None = None
    #: the workers' AUC counts ([workers, 2, 2, buckets]); reported when a model predicts
    auc: np.ndarray | None = None
    record_period: float | None = None
    #: receive every record too, and are closed by :meth:`close`
    sinks: list[RecordSink] = field(default_factory=list)
    #: the workers' steps by staleness ([workers, STALE_BUCKETS]); reported where workers pull
    staleness: np.ndarray | None = None
    #: the pservers the trainer cannot reach right now (PSClient.unreachable): progress records
    #: and lines name them, so a stalled trainer says why
    unreachable: Callable[[], list[dict[str, Any]]] | None = None
    #: the mode's counters (Communicator.report): records carry those of RECORD_COUNTS and
    #: RECORD_LEVELS it has
    mode_report: Callable[[], dict[str, float]] | None = None
    _last: Snapshot | None = None  # at the last record
    _shown: Snapshot | None = None  # at the last line shown
    _epoch_start: Snapshot | None = None
    _began: float | None = None  # monotonic time the first epoch started
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY))

    @property
    def latest(self) -> dict[str, Any] | None:
        """The last record reported (progress or epoch), for the metrics endpoint; None before
        the first. Each record is a new dict appended whole, so another thread never sees one
        half-built."""
        return self.history[-1] if self.history else None

    def start_epoch(self) -> None:
        self._epoch_start = self._last = self._shown = self._take()
        if self._began is None:
            self._began = self._epoch_start.time

    def _take(self) -> Snapshot:
        return Snapshot.take(self.stats, self.staleness, self.mode_report() if self.mode_report is not None else None)

    def record_gap(self, now: float) -> float:
        """Seconds between progress records at monotonic time ``now``."""
        if self.record_period is not None:
            return self.record_period
        gap = max(AUTO_MIN_GAP, AUTO_SHARE * (now - (self._began if self._began is not None else now)))
        return min(gap, self.period) if self.period > 0 else gap

    def due_in(self) -> float:
        """Seconds until :meth:`tick` has a record to write or a line to show."""
        now = time.monotonic()
        last = self._last.time if self._last is not None else now
        waits = [last + self.record_gap(now) - now]
        if self.period > 0:
            waits.append((self._shown.time if self._shown is not None else now) + self.period - now)
        return max(0.0, min(waits))

    def tick(self, epoch: int) -> dict[str, Any] | None:
        """Write a progress record (numbers since the previous one) if one is due, and show a
        line (numbers since the previous line) if one is due; returns the record written."""
        now = self._take()
        last, shown = self._last or now, self._shown or now
        record = None
        if now.time - last.time >= self.record_gap(now.time) - _SLACK:
            record = self._between(last, now, "progress", epoch)
            self._last = now
            self._write(record)
        if self.period > 0 and now.time - shown.time >= self.period - _SLACK:
            self._show(self._between(shown, now, "progress", epoch))
            self._shown = now
        return record

    def end_epoch(self, epoch: int, extra: dict[str, Any]) -> dict[str, Any]:
        """Numbers of the whole epoch; always logged as a line."""
        now = self._take()
        record = self._between(self._epoch_start or now, now, "epoch", epoch)
        record["seconds"] = round(now.time - (self._epoch_start or now).time, 3)
        record["bad_lines"] = int(now.bad_lines)
        record.update(extra)
        self._last = self._shown = now
        if self.line is not None:
            self.line.write("\n")
        self._write(record)
        self._show(record, force_log=True)
        return record

    def close(self) -> None:
        """Close the sinks (they may buffer): call once when training stops, failed or not."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()

    def _between(self, start: Snapshot, now: Snapshot, event: str, epoch: int) -> dict[str, Any]:
        examples = now.examples - start.examples
        elapsed = max(1e-9, now.time - start.time)
        busy = now.compute_s - start.compute_s
        waited = now.wait_s - start.wait_s
        return {
            "event": event,
            "trainer": self.trainer_id,
            "epoch": epoch,
            "time": time.time(),
            "steps": int(now.steps - start.steps) if event == "epoch" else int(now.steps),
            "examples": int(examples) if event == "epoch" else int(now.examples),
            "loss": (now.loss_sum - start.loss_sum) / examples if examples else None,
            "examples_per_s": examples / elapsed,
            # a step adds its wait before its whole time: read in between, the wait can run ahead
            # (the first record of a run: 6.8 million), so the share is capped at 1 and is 0 until
            # a step ends
            "wait_share": min(1.0, waited / busy) if busy > 0 else 0.0,
            **_staleness(start, now),
            **_mode_counts(start, now, event),
            **self._auc(),
            **self._unreachable(event),
        }

    def _unreachable(self, event: str) -> dict[str, Any]:
        """``unreachable``: the pservers out of reach now (progress records only, when any)."""
        if event != "progress" or self.unreachable is None:
            return {}
        out = self.unreachable()
        return {"unreachable": out} if out else {}

    def _auc(self) -> dict[str, float]:
        """Global AUC (since the start) and AUC of the last 20 batches of every worker."""
        if self.auc is None or not self.auc[:, 0].any():
            return {}
        total, window = merged_auc(self.auc)
        return {"auc": total, "batch_auc": window}

    def _write(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.metrics_path is not None:
            append_record(self.metrics_path, record)
        for sink in self.sinks:
            sink.write(record)

    def _show(self, record: dict[str, Any], force_log: bool = False) -> None:
        shown = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in record.items() if k not in ("time", "event")}
        if "unreachable" in shown:  # first on the line: it is why the numbers stand still
            shown = {"unreachable": _outages_line(shown.pop("unreachable")), **shown}
        if self.line is not None and not force_log:
            text = " ".join(f"{k}={v}" for k, v in shown.items())
            self.line.write("\r\x1b[2K" + text[:200])
            self.line.flush()
        else:
            log.info(record["event"], **shown)


def _staleness(start: Snapshot, now: Snapshot) -> dict[str, float]:
    """Mean and max staleness (in the trainer's batches) of the sparse rows the steps between
    two snapshots computed with; nothing when no step pulled rows (geo, or no step yet)."""
    if now.stale_steps is None or start.stale_steps is None:
        return {}
    steps = now.stale_steps - start.stale_steps
    seen = np.flatnonzero(steps > 0)
    if not len(seen):
        return {}
    return {"staleness": (now.stale_sum - start.stale_sum) / float(steps.sum()), "staleness_max": int(seen[-1])}


def _mode_counts(start: Snapshot, now: Snapshot, event: str) -> dict[str, float]:
    """The mode's counters a record carries (RECORD_COUNTS, RECORD_LEVELS), those it has: geo's
    cache evictions (progress: since the trainer started; epoch: in that epoch, as ``steps``)
    and rows held at ``now``; nothing when the trainer keeps no cache."""
    if now.report is None:
        return {}
    before = start.report if event == "epoch" and start.report is not None else {}
    out = {key: now.report[key] - before.get(key, 0) for key in RECORD_COUNTS if key in now.report}
    out.update({key: now.report[key] for key in RECORD_LEVELS if key in now.report})
    return out


def _outages_line(outages: list[dict[str, Any]]) -> str:
    return "; ".join(f"{o['address']} since {o['since']} ({o['seconds']} s, waiting: {o['waiting']})" for o in outages)


def terminal() -> TextIO | None:
    return sys.stderr if sys.stderr.isatty() else None
