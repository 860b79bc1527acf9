"""CTR-DNN, the reference's distributed CTR network, as an aps model plug-in.

The network is PaddlePaddle Fleet's CTR-DNN example on Criteo data:

* one sparse table ``SparseFeatFactors`` (``buckets`` x ``embedding_size`` = 1,000,001 x 10,
  uniform init in [-0.05, 0.05); the reference's ``fluid.initializer.Uniform()`` is [-1, 1), which
  ``init_range=1.0`` restores: it cost 0.03-0.04 test AUC on each of three generated data sets,
  in aps and in PyTorch alike, bench/README.md "ctr_ablation.py"), looked up once per slot (26
  lookups per example);
* the 26 embeddings concatenated with the 13 normalised dense features (273 inputs) ->
  FC 400 ReLU -> FC 400 ReLU -> FC 400 ReLU -> FC 2 softmax; FC weights Normal(0, 1/sqrt(fan_in)),
  biases zero; every FC weight and bias a dense table on the pservers (``fc1.w`` ... ``fc4.b``);
* cross-entropy loss; Adam on the pservers for every table (``lr`` 0.001, Paddle's default).

**Loss and gradients.** ``compute`` returns the loss *summed* over the batch (for monitoring) and
writes gradients of the batch *mean* loss. The reference minimises the summed loss; with Adam the
two differ only through epsilon (Adam divides the scale out), and the mean makes the same ``lr``
mean the same thing at every batch size and with SGD (``optimizer=sgd``, which geo mode needs).

**Data.** Criteo lines (``label, I1..I13, C1..C26``) parsed by :mod:`aps.models.criteo`: dense
values normalised with the reference's constants, categorical values hashed with FNV-1a 64 (the
reference's Python ``hash`` is salted per process). ``meta=path/meta.json`` reads another layout
(numbers of dense and slot columns, normalisation, buckets), e.g. the Adult census data.

To write your own CTR model, copy this file: ``_build_tables`` says what lives on the pservers,
``_forward``/``compute`` are a handful of kernel calls; batching, the common arguments and AUC
come from :class:`~aps.models.ctr_model.CriteoModel`.
"""

from __future__ import annotations

import numpy as np

from ...specs import Optimizer, TableSpec, Uniform
from ...trainer.model import Batch, Grads, Params
from ..ctr_batches import CtrBatch
from ..ctr_model import CriteoModel
from ..layers import gather_slots, scatter_slots, softmax2_xent, stack

EMBEDDING = "SparseFeatFactors"


class CtrDnn(CriteoModel):
    """The reference CTR-DNN; every argument has a default and accepts text (``--model-arg``).
    ``init_range`` is the embedding's uniform init half-width (the reference's is 1.0);
    ``bias_correction`` is sparse Adam's, ``row`` or ``step`` (docs/modes.md, "Sparse Adam");
    ``l2`` the L2 decay of every table (docs/concepts.md, "Regularisation and clipping")."""

    name = "ctr_dnn"
    slot_tables = (EMBEDDING,)
    offline_init_range = 0.05

    def __init__(
        self,
        embedding_size: int = 10,
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
        sparse_optimizer: str = "same",
        sparse_lr: float | None = None,
        table_dtype: str = "float32",
        table_disk_ram: int | None = None,
        table_state_dtype: str = "float32",
        table_stats: str = "full",
    ) -> None:
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
        self.layers = stack("fc", fmt.slots * self.embedding_size + fmt.dense, self.hidden, 2)
        tables: list[TableSpec] = [
            self._sparse_table(EMBEDDING, self.embedding_size, Uniform(-r, r), sparse_optimizer)
        ]
        for layer in self.layers:
            tables.extend(layer.tables(optimizer, self.seed))
        return tables

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        """Gradients of the batch-mean loss into ``grads``; returns the summed loss."""
        loss, x, d_logits = self._forward(batch, params)
        d_x = self._mlp().backward(x, d_logits, params.dense, grads.dense)
        data: CtrBatch = batch.data
        scatter_slots(d_x, data.inverse, self.format.slots, self.embedding_size, grads.sparse[EMBEDDING])
        return loss

    def _forward(self, batch: Batch, params: Params) -> tuple[float, np.ndarray, np.ndarray]:
        data: CtrBatch = batch.data
        n = batch.examples
        x = self._buffer("x", (self.batch_size, self.layers[0].fan_in))[:n]
        gather_slots(params.sparse[EMBEDDING], data.ids, data.dense, x)
        logits = self._mlp().forward(x, params.dense)
        d_logits = self._buffer("d_logits", (self.batch_size, 2))[:n]
        loss = softmax2_xent(logits, data.labels, data.probs, d_logits)
        return float(loss), x, d_logits
