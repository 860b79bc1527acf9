"""wide&deep (Cheng et al. 2016; the reference's Fleet quick start) as an aps model plug-in.

* **wide**: a dim-1 sparse weight per hashed slot value (table ``wide.slot``) summed over the
  slots, plus a linear term over the dense features (``wide.dense``, ``wide.b``);
* **deep**: per-slot embeddings (``deep.emb``, dim 8) concatenated with the dense features ->
  FC 400 ReLU -> FC 400 ReLU -> FC 400 ReLU -> FC 1 (``deep1.w`` ... ``deep4.b``);
* logit = wide + deep; sigmoid cross-entropy; Adam on the pservers for every table (Adagrad on
  the slot tables in online passes, :class:`~aps.models.ctr_model.CriteoModel`), or FTRL or
  Adagrad for the wide part (``wide_optimizer``, :mod:`.wide`).

Gradients are of the batch *mean* loss; ``compute`` returns the summed loss (see
:mod:`aps.models.ctr_dnn.model`, which this file follows line for line where it can). Data are
Criteo-format lines; the Adult census set made by ``examples/wide_deep/prepare_adult.py`` comes
with a ``meta.json`` that says its 6 dense and 8 slot columns (``--model-arg meta=...``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...specs import Constant, DenseTable, Optimizer, TableSpec, Uniform
from ...trainer.model import Batch, Grads, Params
from ..ctr_batches import CtrBatch
from ..ctr_model import CriteoModel, positive_float
from ..layers import gather_slots, scatter_slots, scatter_sum_slots, sigmoid_xent, stack, sum_slots
from .wide import wide_optimizer

WIDE_SLOT = "wide.slot"
WIDE_DENSE = "wide.dense"
WIDE_BIAS = "wide.b"
DEEP_EMB = "deep.emb"


class WideDeep(CriteoModel):
    """wide&deep; every argument has a default and accepts text (``--model-arg``).
    ``init_range`` is the deep embedding's uniform init half-width; wide weights start at 0;
    ``bias_correction`` is sparse Adam's, ``row`` or ``step`` (docs/modes.md, "Sparse Adam");
    ``l2`` the L2 decay of every table; ``wide_optimizer=ftrl`` trains the wide part with FTRL
    (``ftrl_alpha``, ``ftrl_beta``, ``ftrl_l1``; its l2 is ``l2``). ``ftrl_alpha`` is 1, not
    per-example FTRL's usual 0.05: the gradients are of the batch mean, and 1 gave the better test
    AUC on every data set measured (bench/README.md, "ctr_ablation.py"). ``wide_optimizer=adagrad``
    trains it with Adagrad at ``wide_lr``. With ``same`` (the default) its slot weights are
    trained as the embeddings (``sparse_optimizer``: Adagrad in online passes) and the rest with
    the model's optimizer."""

    name = "wide_deep"
    slot_tables = (WIDE_SLOT, DEEP_EMB)
    offline_init_range = 0.1

    def __init__(
        self,
        embedding_size: int = 8,
        hidden: str = "400,400,400",
        batch_size: int | None = None,
        lr: float | None = None,
        optimizer: str | None = None,
        init_range: float | None = None,
        meta: str | None = None,
        seed: int = 0,
        bias_correction: str = "row",
        table: str = "fixed",
        admit_probability: float = 1.0,
        admit_count: int = 1,
        max_keys: int | None = None,
        l2: float = 0.0,
        wide_optimizer: str = "same",
        ftrl_alpha: float = 1.0,
        ftrl_beta: float = 1.0,
        ftrl_l1: float = 0.0,
        sparse_optimizer: str = "same",
        sparse_lr: float | None = None,
        table_dtype: str = "float32",
        wide_lr: float = 0.05,
        table_disk_ram: int | None = None,
        table_state_dtype: str = "float32",
        table_stats: str = "full",
    ) -> None:
        # checked here, not when the wide part is made: a bad value fails whatever wide_optimizer is
        wide_lr = positive_float(self.name, "wide_lr", wide_lr)
        self.wide = (str(wide_optimizer), ftrl_alpha, ftrl_beta, ftrl_l1, wide_lr)
        super().__init__(
            embedding_size=embedding_size, hidden=hidden, batch_size=batch_size, lr=lr, optimizer=optimizer,
            init_range=init_range, meta=meta, seed=seed, bias_correction=bias_correction,
            table=table, admit_probability=admit_probability, admit_count=admit_count, max_keys=max_keys, l2=l2,
            sparse_optimizer=sparse_optimizer, sparse_lr=sparse_lr, table_dtype=table_dtype,
            table_disk_ram=table_disk_ram, table_state_dtype=table_state_dtype,
            table_stats=table_stats,
        )

    def _build_tables(self, optimizer: Optimizer, sparse_optimizer: Optimizer) -> list[TableSpec]:
        fmt, r = self.format, self.init_range
        wide = wide_optimizer(self.name, self.wide[0], optimizer, *self.wide[1:])
        wide_slot = sparse_optimizer if self.wide[0] == "same" else wide
        self.layers = stack("deep", fmt.slots * self.embedding_size + fmt.dense, self.hidden, 1)
        tables: list[TableSpec] = [
            self._sparse_table(WIDE_SLOT, 1, Constant(0.0), wide_slot),
            self._sparse_table(DEEP_EMB, self.embedding_size, Uniform(-r, r), sparse_optimizer),
            DenseTable(WIDE_DENSE, (max(fmt.dense, 1), 1), Constant(0.0), wide, seed=self.seed),
            DenseTable(WIDE_BIAS, (1,), Constant(0.0), wide, seed=self.seed),
        ]
        for layer in self.layers:
            tables.extend(layer.tables(optimizer, self.seed))
        return tables

    def describe(self) -> dict[str, Any]:
        name, alpha, beta, l1, lr = self.wide
        wide = {"ftrl": {"wide_optimizer": name, "ftrl_alpha": alpha, "ftrl_beta": beta, "ftrl_l1": l1},
                "adagrad": {"wide_optimizer": name, "wide_lr": lr}}.get(name, {})
        return {**super().describe(), **wide}

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        """Gradients of the batch-mean loss into ``grads``; returns the summed loss."""
        loss, x, d_logit = self._forward(batch, params)
        data: CtrBatch = batch.data
        slots = self.format.slots
        d_x = self._mlp().backward(x, d_logit[:, None], params.dense, grads.dense)
        scatter_slots(d_x, data.inverse, slots, self.embedding_size, grads.sparse[DEEP_EMB])
        scatter_sum_slots(d_logit, data.inverse, slots, grads.sparse[WIDE_SLOT])
        if self.format.dense:
            np.matmul(data.dense.T, d_logit[:, None], out=grads.dense[WIDE_DENSE])
        grads.dense[WIDE_BIAS][0] += d_logit.sum()
        return loss

    def _forward(self, batch: Batch, params: Params) -> tuple[float, np.ndarray, np.ndarray]:
        data: CtrBatch = batch.data
        n = batch.examples
        x = self._buffer("x", (self.batch_size, self.layers[0].fan_in))[:n]
        gather_slots(params.sparse[DEEP_EMB], data.ids, data.dense, x)
        deep = self._mlp().forward(x, params.dense)[:, 0]
        logit = deep + sum_slots(params.sparse[WIDE_SLOT], data.ids) + params.dense[WIDE_BIAS][0]
        if self.format.dense:
            logit += (data.dense @ params.dense[WIDE_DENSE])[:, 0]
        d_logit = self._buffer("d_logit", (self.batch_size,))[:n]
        loss = sigmoid_xent(logit, data.labels, data.probs, d_logit)
        return float(loss), x, d_logit
