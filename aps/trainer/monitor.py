"""Training progress: periodic numbers (Paddle's fetch_handler), a live line on a terminal,
and a JSON-lines file so curves can be plotted."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import structlog

from ..metrics import merged_auc
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

    @classmethod
    def take(cls, stats: np.ndarray) -> Snapshot:
        total = stats.sum(axis=0)
        return cls(
            time.monotonic(),
            float(total[STAT["loss_sum"]]),
            float(total[STAT["examples"]]),
            float(total[STAT["steps"]]),
            float(total[STAT["compute_s"]]),
            float(total[STAT["wait_s"]]),
            float(total[STAT["bad_lines"]]),
        )


@dataclass
class Monitor:
    """Reports every ``period`` seconds; ``line`` is a terminal to redraw a status line on."""

    stats: np.ndarray
    period: float
    trainer_id: int
    metrics_path: Path | None = None
    line: TextIO | None = None
    #: the workers' AUC counts ([workers, 2, 2, buckets]); reported when a model predicts
    auc: np.ndarray | None = None
    _last: Snapshot | None = None
    _epoch_start: Snapshot | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def latest(self) -> dict[str, Any] | None:
        """The last record reported (progress or epoch), for the metrics endpoint; None before
        the first. Each record is a new dict appended whole, so another thread never sees one
        half-built."""
        return self.history[-1] if self.history else None

    def start_epoch(self) -> None:
        self._epoch_start = self._last = Snapshot.take(self.stats)

    def report(self, epoch: int) -> dict[str, Any]:
        """Numbers since the previous report (Paddle's fetch_handler period)."""
        now = Snapshot.take(self.stats)
        record = self._between(self._last or now, now, "progress", epoch)
        self._last = now
        self._emit(record)
        return record

    def end_epoch(self, epoch: int, extra: dict[str, Any]) -> dict[str, Any]:
        """Numbers of the whole epoch; always logged as a line."""
        now = Snapshot.take(self.stats)
        record = self._between(self._epoch_start or now, now, "epoch", epoch)
        record["seconds"] = round(now.time - (self._epoch_start or now).time, 3)
        record["bad_lines"] = int(now.bad_lines)
        record.update(extra)
        self._last = now
        if self.line is not None:
            self.line.write("\n")
        self._emit(record, force_log=True)
        return record

    def _between(self, start: Snapshot, now: Snapshot, event: str, epoch: int) -> dict[str, Any]:
        examples = now.examples - start.examples
        elapsed = max(1e-9, now.time - start.time)
        busy = (now.compute_s - start.compute_s) or 1e-9
        return {
            "event": event,
            "trainer": self.trainer_id,
            "epoch": epoch,
            "time": time.time(),
            "steps": int(now.steps - start.steps) if event == "epoch" else int(now.steps),
            "examples": int(examples) if event == "epoch" else int(now.examples),
            "loss": (now.loss_sum - start.loss_sum) / examples if examples else None,
            "examples_per_s": examples / elapsed,
            "wait_share": (now.wait_s - start.wait_s) / busy,
            **self._auc(),
        }

    def _auc(self) -> dict[str, float]:
        """Global AUC (since the start) and AUC of the last 20 batches of every worker."""
        if self.auc is None or not self.auc[:, 0].any():
            return {}
        total, window = merged_auc(self.auc)
        return {"auc": total, "batch_auc": window}

    def _emit(self, record: dict[str, Any], force_log: bool = False) -> None:
        self.history.append(record)
        if self.metrics_path is not None:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        shown = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in record.items() if k not in ("time", "event")}
        if self.line is not None and not force_log:
            text = " ".join(f"{k}={v}" for k, v in shown.items())
            self.line.write("\r\x1b[2K" + text[:200])
            self.line.flush()
        else:
            log.info(record["event"], **shown)


def terminal() -> TextIO | None:
    return sys.stderr if sys.stderr.isatty() else None
