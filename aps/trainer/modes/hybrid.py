"""hybrid: dense parameters synchronous, sparse asynchronous (docs/modes.md, "hybrid").

A CTR model's dense part (the fully connected stack) is small and touched by every example; its
sparse part (the embeddings) is large and each row is touched by few. Staleness costs accuracy
where many gradients pile onto the same parameters, so the dense part steps as in sync mode and
only the sparse part runs ahead, as Persia does:

* **sparse**: each batch's sparse gradients go to the async sender (merged into bounded
  accumulators, pushed as they fill, the next batch's rows prefetched), as in async mode;
* **dense**: the workers of a trainer step together: when every still-active worker has handed
  in its batch, their dense gradients are averaged and pushed with the SYNC flag (each pserver
  applies one update per step, the average over every trainer) and the dense parameters are
  pulled. Trainers vote each step whether anyone still has data, as in sync mode, so unequal
  data never hangs a dense round (one trainer alone skips the vote). With ``dense_lag`` 0 (the default) the workers are released
  only then: a worker computing step s+1 sees the dense update of step s (dense staleness 0).
  With 1 they are released as soon as round s-1 is complete and compute step s+1 with its
  parameters while round s runs (dense staleness 1: one-step delayed synchronous SGD, the round
  trip hidden behind the compute; :mod:`.step_group`).

Where a model's workers each compute a share of one update's batch (the torch models,
``Model.update_shares``), the sparse gradients of a step wait for its dense round and go in one
push after it: each row then takes one optimizer step per update, as in one process training the
whole batch, a row in both shares is pushed once, and the pserver, which answers requests in
the order they come, answers the round before it applies them. Sent as each worker handed its
batch in, the last one delayed the round that every worker waits for (DeepFM's rounds in
bench/torch_models.py took 26 ms instead of 15 on 2 cores).
"""

from __future__ import annotations

from ..ipc import Record
from .async_sender import AsyncSender
from .base import Link
from .step_group import SyncStepGroup


class HybridRounds(AsyncSender):
    """Sparse gradients through the async sender, dense ones in sync steps across trainers."""

    name = "hybrid"
    #: a restarted shard would miss the dense rounds the others applied
    resumes_one_shard = False
    #: the dense lag of a strategy that names none (the one line to change the default)
    #: 0: the one-step delay costs test AUC on short runs (docs/modes.md, "hybrid") and bought
    #: about 2% of throughput on 2 cores
    default_dense_lag = 0
    #: the dense part steps as sync mode's
    averages_workers = True

    def __init__(self, link: Link) -> None:
        super().__init__(link, dense=False)
        self._dense = SyncStepGroup(link, sparse=False, lag=self.dense_lag(link.strategy), after_round=self.open_gate)
        if link.model.update_shares() > 1:
            self.gate_sends()  # one push per update, after its round (the module says why)

    def begin_epoch(self, epoch: int, workers: set[int]) -> None:
        super().begin_epoch(epoch, workers)
        self._dense.begin_epoch(epoch, workers)

    async def on_grads(self, worker: int, rec: Record) -> None:
        await self.merge(worker, rec)  # sparse: queued for the sender, the worker is not held
        await self._dense.on_grads(worker, rec)  # dense: replies once this step's update is pulled

    async def on_worker_done(self, worker: int) -> None:
        await self._dense.on_worker_done(worker)

    async def flush(self) -> None:
        await super().flush()  # the sparse pushes
        await self._dense.flush()  # the dense round in the background, if any

    async def end_epoch(self) -> None:
        await self.flush()
        await self._dense.end_epoch()  # join dense rounds until every trainer ran out

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            await self._dense.stop()

    def check_failure(self) -> None:
        super().check_failure()
        self._dense.check_failure()
