"""A trainer's progress records as TensorBoard scalars (``--tensorboard DIR``), via tensorboardX.

Why a sink of the monitor's records rather than counters of its own: TensorBoard then shows the
very numbers the metrics file and aps-plot show, at the same cadence, with no second bookkeeping.

Progress records become scalars at step = examples this trainer has trained so far (a step that
means the same whatever the batch size or the number of workers); epoch records become
``epoch/...`` scalars at step = the epoch. Every scalar carries the record's wall time.
"""

from __future__ import annotations

from typing import Any

#: record key -> scalar tag; keys a record lacks (AUC of a model that does not predict) are skipped
SCALARS = {
    "loss": "loss",
    "auc": "auc",
    "batch_auc": "sliding_auc",
    "examples_per_s": "examples_per_s",
    "wait_share": "wait_share",
    "staleness": "staleness",
    "staleness_max": "staleness_max",
    # geo mode on hash tables: the trainer's local caches (docs/modes.md)
    "geo_cache_evictions": "geo_cache/evictions",
    "geo_cache_evicted_deltas": "geo_cache/evicted_deltas",
    "geo_cache_held": "geo_cache/held",
    "geo_cache_capacity": "geo_cache/capacity",
}
#: seconds between the writer thread's flushes: a running TensorBoard sees new points this soon
FLUSH_SECS = 2


class TensorBoardSink:
    """Writes records into one TensorBoard run directory (created if missing)."""

    def __init__(self, logdir: str) -> None:
        # imported here: tensorboardX loads protobuf, which a trainer without --tensorboard and
        # every other importer of aps need not pay for
        from tensorboardX import SummaryWriter

        self.logdir = logdir
        self._writer = SummaryWriter(logdir=logdir, flush_secs=FLUSH_SECS)

    def write(self, record: dict[str, Any]) -> None:
        if record["event"] == "epoch":
            prefix, step = "epoch/", int(record["epoch"])
        else:
            prefix, step = "", int(record["examples"])
        for key, tag in SCALARS.items():
            value = record.get(key)
            if value is not None:
                self._writer.add_scalar(prefix + tag, float(value), global_step=step, walltime=record["time"])

    def close(self) -> None:
        """Flush what is queued and close the event file."""
        self._writer.close()
