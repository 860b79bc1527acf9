"""Online training: passes from a source, each scored, then trained on, then checkpointed.

``aps-trainer --data-passes ROOT`` (or ``--data-stream``) runs :func:`train_passes`. Per pass:

1. *predict*: every worker scores its share of the pass with the current parameters (the
   model's forward pass, nothing pushed) and the AUC of those predictions is the pass's
   **online AUC** (PaddleRec reports the same): how well the model does on data it has not seen,
   the number an online model is judged by. It goes to the pass's record (``online_auc`` in the
   metrics file, so aps-plot draws it), to Prometheus (``aps_trainer_online_auc``) and to a log line;
2. *train*: the same files are trained once, as an epoch (flush and barrier at its end); trainer 0
   adds the keys every hash table holds then to the record (``keys``: what ``max_keys`` bounds);
3. *checkpoint*: every ``save_every`` passes trainer 0 saves ``SAVE_DIR/pass-<seq>`` with the
   source's position in the manifest (and deletes those older than the newest ``keep_passes``),
   the trainers meet at a barrier, and the source is told
   (a stream acknowledges the records the checkpoint covers only then). A trainer killed in a
   pass loses that pass only: ``--resume`` loads the checkpoint and continues after it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from ..client import PSClient
from ..errors import ConfigError
from ..metrics import auc_from_counts
from .files import assign_to_workers
from .online_checkpoints import KEY, local_save_dir, newest_checkpoint, pass_checkpoint, prune_checkpoints
from .online_exports import Exporter, ExportOptions, hash_tables
from .pool import WorkerPool, start_fork_server
from .runtime import Prepare, TrainerRuntime
from .sources.base import Pass, Source

log = structlog.get_logger("aps.trainer")

#: compute workers of an online trainer whose strategy names none (``--workers``, ``APS_WORKERS``,
#: ``CPU_NUM``), instead of the CPU count: a pass's lines are trained once, in order, and a second
#: worker training the same minutes beside the first costs online AUC (docs/concepts.md, "The CTR
#: models' optimizers, measured on real data": -0.002 at 2 workers on MovieLens and Adult)
ONLINE_WORKERS = 1


@dataclass
class OnlineOptions:
    """How an online trainer runs its passes (the rest is :class:`TrainOptions`)."""

    #: checkpoint after every N passes (0: never; needs ``TrainOptions.save_dir``)
    save_every: int = 1
    #: load the newest complete pass checkpoint in ``save_dir`` first and continue after it
    resume: bool = False
    #: score each pass before training on it (online AUC)
    score: bool = True
    #: exports for serving after passes (trainer 0); None: none
    export: ExportOptions | None = None
    #: after each save, delete the pass checkpoints older than the newest N (0: keep every one)
    keep_passes: int = 3


@dataclass
class OnlineResult:
    #: one record per pass trained: the monitor's epoch record with the pass's name,
    #: ``online_auc`` and ``scored`` (examples scored) added
    passes: list[dict[str, Any]] = field(default_factory=list)
    #: why the run ended (the source's reason)
    stop_reason: str | None = None
    #: the checkpoint resumed from (relative to the pservers' checkpoint root), if any
    resumed_from: str | None = None


def pass_auc(scores: np.ndarray) -> float | None:
    """The AUC of the workers' predictions of one pass (their ``scores`` rows summed), None
    when the model does not predict or nothing was scored."""
    if not scores.any():
        return None
    pos, neg = scores.sum(axis=0)
    return float(auc_from_counts(pos, neg))


Runtime = TrainerRuntime[WorkerPool]


async def train_passes(
    make_runtime: Callable[[Prepare], Runtime], source: Source, online: OnlineOptions | None = None
) -> OnlineResult:
    """Run a trainer over the passes of ``source`` until it has no more (see the module);
    ``make_runtime(prepare)``: the trainer's runtime, not started, whose ``prepare`` resumes."""
    online = online or OnlineOptions()
    result = OnlineResult()

    async def prepare(ps: PSClient) -> None:
        position = None
        if online.resume:
            assert rt.options.save_dir is not None
            result.resumed_from, position = await resume_position(
                ps, rt.options.save_dir, rt.trainer_id, rt.strategy.rpc_timeout
            )
        await source.open(position)

    rt = make_runtime(prepare)
    check_checkpointing(online.save_every, online.keep_passes, online.resume, rt.options.save_dir)
    rt.model.begin_run(1)  # a pass is an epoch of its own data; the count of passes is open
    rt.model.begin_online()  # before anything is sized or sent to a worker
    start_fork_server(type(rt.model).__module__)
    rt.probe.passes = 0
    log.info(
        "online trainer starting", trainer=rt.trainer_id, source=type(source).__name__, workers=rt.num_workers,
        **rt.model.describe(),
    )
    exporter = Exporter(online.export, rt.model) if online.export is not None else None
    try:
        async with rt:
            await _passes(rt, source, online, exporter, result)
            await rt.finish()
    finally:
        await source.aclose()
    return result


async def _passes(
    rt: Runtime, source: Source, online: OnlineOptions, exporter: Exporter | None, result: OnlineResult
) -> None:
    """Every pass ``source`` hands out: score, train, save, export, record (see the module)."""
    assert rt.ps is not None and rt.comm is not None
    save_dir, timeout = rt.options.save_dir, rt.strategy.rpc_timeout
    while (p := await source.next_pass()) is not None:
        started = time.monotonic()
        extra = await _one_pass(rt, p, online, exporter)
        rt.comm.check()
        saving = bool(online.save_every and save_dir and (len(result.passes) + 1) % online.save_every == 0)
        if rt.trainer_id == 0:
            if saving:
                assert save_dir is not None
                extra["saved"] = await save_pass(rt.ps, save_dir, source, p, online.keep_passes)
            if exporter is not None:
                extra.update(await exporter.after_pass(rt.ps, p))
        # the record is written after the save and the export, so the metrics file says them too
        result.passes.append(_end_pass(rt, p, extra, started))
        if saving or exporter is not None:
            # every trainer waits for trainer 0's save and export: none pushes the next
            # pass's gradients into them
            await rt.ps.barrier(f"aps.online.saved.{p.seq}", timeout=timeout)
        if saving:
            await source.committed(p)
    result.stop_reason = source.stop_reason
    log.info("online training stopped", reason=result.stop_reason, passes=len(result.passes))


async def _one_pass(rt: Runtime, p: Pass, online: OnlineOptions, exporter: Exporter | None) -> dict[str, Any]:
    """Score ``p``, then (after the day tick, with exports) train it; returns what its record
    adds to the monitor's numbers."""
    assert rt.ps is not None and rt.workers is not None and rt.attached is not None
    files = assign_to_workers(p.files, rt.num_workers)
    extra: dict[str, Any] = {**rt.mode_fields(), "pass": p.name, "files": len(p.files)}
    if online.score:
        scores = rt.attached.scores
        assert scores is not None
        scores[:] = 0
        done = await rt.workers.watch(rt.workers.score(p.seq, files))
        extra["scored"] = sum(r.examples for r in done)
        auc = pass_auc(scores)
        if auc is not None:
            extra["online_auc"] = rt.probe.online_auc = auc
    if exporter is not None:
        if rt.trainer_id == 0:
            extra.update(await exporter.before_training(rt.ps, p))
        # every trainer waits for trainer 0's day tick: none pushes the new day's keys before it
        await rt.ps.barrier(f"aps.online.tick.{p.seq}", timeout=rt.strategy.rpc_timeout)
    if p.reread:
        extra["reread"] = p.reread
        rt.probe.reread += p.reread
    await rt.train_epoch(p.seq, files)
    if rt.trainer_id == 0 and (hashed := hash_tables(rt.model)):
        # after the pass's flush and barrier: what the pservers hold now, the number max_keys bounds
        extra["keys"] = {name: (await rt.ps.table_info(name)).keys for name in hashed}
    return extra


def _end_pass(rt: Runtime, p: Pass, extra: dict[str, Any], started: float) -> dict[str, Any]:
    """The pass's record (the monitor's epoch numbers with ``extra``), written and logged."""
    assert rt.monitor is not None
    record = rt.monitor.end_epoch(p.seq, extra)
    rt.probe.passes = (rt.probe.passes or 0) + 1
    log.info(
        "pass trained", name=p.name, seq=p.seq, online_auc=extra.get("online_auc"), examples=record.get("examples"),
        loss=record.get("loss"), seconds=round(time.monotonic() - started, 2),
    )
    return record


def check_checkpointing(save_every: int, keep_passes: int, resume: bool, save_dir: str | None) -> None:
    """The checkpoint settings of a pass loop make sense together (ConfigError if not)."""
    if save_every < 0 or keep_passes < 0:
        raise ConfigError(f"save_every and keep_passes must be >= 0, got {save_every}, {keep_passes}")
    if resume and not save_dir:
        raise ConfigError("resume needs a save dir: the checkpoints to resume from are there (--save-dir)")


async def save_pass(ps: PSClient, save_dir: str, source: Source, p: Pass, keep: int) -> str:
    """Save the tables with the position after ``p`` (one trainer), then delete the checkpoints
    older than the newest ``keep`` (0: none); returns the path."""
    path = pass_checkpoint(save_dir, p.seq)
    await ps.save(path, extra={KEY: await source.position(p)})
    if keep:
        local = local_save_dir(save_dir, await ps.checkpoint_roots())
        if not os.path.isdir(local):
            log.warning("cannot prune pass checkpoints: the save dir is not on this machine", save_dir=local, keep=keep)
        elif pruned := prune_checkpoints(local, keep):
            log.info("pruned pass checkpoints", save_dir=local, deleted=pruned, keep=keep)
    return path


async def resume_position(
    ps: PSClient, save_dir: str, trainer_id: int, timeout: float | None
) -> tuple[str | None, dict[str, Any] | None]:
    """Load the newest complete pass checkpoint (trainer 0 asks the pservers) and return its
    path and position; ``(None, None)``, with a warning, when there is none yet (a job's first
    start). Every trainer calls it: they meet at a barrier once the tables are loaded."""
    local = local_save_dir(save_dir, await ps.checkpoint_roots())
    found = newest_checkpoint(local)
    resumed_from = position = None
    if found is None:
        log.warning("resume: no complete pass checkpoint yet, starting at the first pass", save_dir=local)
    else:
        name, position = found
        resumed_from = f"{save_dir.rstrip('/')}/{name}"
        if trainer_id == 0:
            await ps.load(resumed_from)
        log.warning("resumed from a pass checkpoint", path=resumed_from, position=position)
    await ps.barrier("aps.online.resumed", timeout=timeout)
    return resumed_from, position
