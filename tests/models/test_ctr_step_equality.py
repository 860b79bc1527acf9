"""Step-for-step equality of the CTR models against a numpy reference.

One trainer, one worker, sync mode (and hybrid mode with ``max_staleness=0``), a real pserver process: the reference starts from the
parameters the pserver created (pulled after table creation), takes the same batches, computes
the gradients of the batch-mean loss in float64 (tests/models/test_ctr_models.py's references,
themselves checked by finite differences) and applies the optimizer in float64 with float32
storage, as the pserver does. After 20 steps every table equals the reference's.

Both sparse Adam semantics are pinned: aps's lazy Adam (each row corrects its bias with its own
count of updates) and PyTorch's ``SparseAdam`` (one step count for the whole table, epsilon added
to the uncorrected ``sqrt(v)``). Rare ids make the two visibly different, so each reference
matches one of them and not the other.

Hybrid's one-step dense lag (``dense_lag=1``) is pinned too: with fresh sparse rows, its tables equal a
reference whose dense gradients are computed with the dense tables of the step before last.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aps
from aps.models.ctr_dnn.model import CtrDnn
from aps.models.wide_deep.model import WideDeep
from aps.trainer.stepwise import StepTrainer
from tests.conftest import Processes
from tests.models.test_ctr_models import ctr_dnn_ref, wide_deep_ref

pytestmark = pytest.mark.timeout(120)

SLOTS, DENSE, BUCKETS = 3, 2, 60
STEPS, BATCH = 20, 8
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


def write_meta(path: Path) -> str:
    path.write_text(json.dumps({"dense": DENSE, "slots": SLOTS, "cont_min": [0, 0], "cont_diff": [10, 4],
                                "buckets": BUCKETS}))
    return str(path)


def make_lines(seed: int) -> list[str]:
    """STEPS * BATCH Criteo-format lines: frequent values, rare ones (seen in one or two
    batches, so a row's own update count falls behind the step count) and missing fields."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS * BATCH):
        dense = [str(int(rng.integers(0, 10))) if rng.random() < 0.8 else "" for _ in range(DENSE)]
        cats = []
        for _ in range(SLOTS):
            u = rng.random()
            cats.append("" if u < 0.1 else f"{int(rng.integers(0, 4)):x}" if u < 0.7 else f"r{int(rng.integers(0, 40))}")
        out.append("\t".join([str(int(rng.random() < 0.3)), *dense, *cats]))
    return out


# ------------------------------------------------------------ reference optimizers


class Reference:
    """The optimizer over float32 tables, arithmetic in float64, one application per step.

    ``adam``: None (SGD), ``"row"`` (lazy Adam: a touched row's bias correction uses its own
    update count; epsilon scaled by ``sqrt(1 - beta2^t)``, i.e. added to the corrected
    ``sqrt(v_hat)`` as torch.optim.Adam does) or ``"step"`` (PyTorch's SparseAdam: every touched
    row corrected with the table's step count; epsilon added to the raw ``sqrt(v)``). Dense
    tables use torch.optim.Adam's form with the step count in every case.
    """

    def __init__(self, params: dict[str, np.ndarray], sparse: set[str], lr: float, adam: str | None) -> None:
        self.p = {k: v.astype(np.float32) for k, v in params.items()}
        self.sparse, self.lr, self.adam = sparse, lr, adam
        self.m = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.t_row = {k: np.zeros(len(self.p[k]), np.int64) for k in sparse}
        self.step = 0

    def apply(self, grads: dict[str, np.ndarray], touched: dict[str, np.ndarray]) -> None:
        self.step += 1
        for name, g in grads.items():
            rows = touched[name] if name in self.sparse else slice(None)
            self._update(name, rows, np.asarray(g, np.float64)[rows])

    def _update(self, name: str, rows: np.ndarray | slice, g: np.ndarray) -> None:
        p = self.p[name]
        if self.adam is None:
            p[rows] = p[rows] - self.lr * g
            return
        m = BETA1 * self.m[name][rows].astype(np.float64) + (1 - BETA1) * g
        v = BETA2 * self.v[name][rows].astype(np.float64) + (1 - BETA2) * g * g
        self.m[name][rows], self.v[name][rows] = m, v
        if name in self.sparse and self.adam == "row":
            self.t_row[name][rows] += 1
            t = self.t_row[name][rows].astype(np.float64)[:, None]
        else:
            t = float(self.step)
        corr2 = np.sqrt(1 - BETA2**t)
        eps = EPS if (name in self.sparse and self.adam == "step") else EPS * corr2
        p[rows] = p[rows] - self.lr * corr2 / (1 - BETA1**t) * m / (np.sqrt(v) + eps)


# ------------------------------------------------------------ the runs


async def pull_all(servers: list[str], model: aps.Model, keys: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every dense table, and every row of each sparse table (``keys``: those keys' rows, a hash table's)."""
    async with aps.connect(servers) as ps:
        out = {t.name: await ps.pull_sparse(t.name, np.arange(t.rows, dtype=np.int64) if keys is None else keys)
               for t in model.sparse_tables()}
        for t in model.dense_tables():
            out[t.name] = await ps.pull_dense(t.name)
    return out


def finish(st: StepTrainer, servers: list[str], model: aps.Model, keys: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """End the run and return every table as the pservers hold it. The epoch's end flushes what is
    in flight first: with dense_lag=1 the last step's dense round runs in the background after its
    step returned, and a pull made before it lands misses it."""
    st.end_epoch()
    final = asyncio.run(pull_all(servers, model, keys))
    st.stop()
    return final


#: sync, and hybrid with fresh rows: with one trainer and one worker both are the reference's
#: steps (dense_lag=0 makes hybrid's dense part synchronous; max_staleness=0 makes each pull wait
#: for the previous batch's sparse push)
STRATEGIES = {"sync": aps.Strategy(mode="sync"), "hybrid": aps.Strategy(mode="hybrid", max_staleness=0, dense_lag=0)}


def train_both(model: aps.Model, ref_grads, lines: list[str], processes: Processes,
               adam: tuple[str | None, ...] | Callable[[dict[str, np.ndarray]], list[Any]], mode: str = "sync",
               strategy: aps.Strategy | None = None,
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[Reference], int]:
    """20 steps in ``mode`` on a real pserver and on a reference per entry of ``adam`` (or the
    references ``adam(initial tables)`` makes: objects with ``p`` and ``apply`` as
    :class:`Reference`); returns the pserver's tables before and after, the references, and how
    many rows were touched fewer times than the step count (rows where the two Adam semantics part)."""
    servers = processes.start_servers(1, trainers=1)
    st = StepTrainer(model, strategy or STRATEGIES[mode], aps.ClusterSpec(servers, 1), 0).start()
    try:
        initial = asyncio.run(pull_all(servers, model))
        sparse = {t.name for t in model.sparse_tables()}
        refs = adam(initial) if callable(adam) else [Reference(initial, sparse, model.lr, a) for a in adam]
        batches = list(st.batches(lines))
        assert [b.examples for b in batches] == [BATCH] * STEPS
        seen: dict[str, np.ndarray] = {}
        for batch in batches:
            st.step(batch)
            d = batch.data
            for ref in refs:
                p64 = {k: v.astype(np.float64) for k, v in ref.p.items()}
                _, g, _ = ref_grads(p64, d.ids, d.dense.astype(np.float64), d.labels.astype(np.float64), len(model.layers))
                ref.apply(g, batch.sparse_ids)
            for name, ids in batch.sparse_ids.items():
                seen[name] = np.concatenate([seen.get(name, ids[:0]), ids])
        final = finish(st, servers, model)
    finally:
        if not st._stopped:
            st.close()
    assert processes.procs[0].wait(timeout=15) == 0
    counts = np.bincount(seen[sorted(sparse)[0]], minlength=BUCKETS)
    lagging = int(((counts > 0) & (counts < STEPS)).sum())
    return initial, final, refs, lagging


def max_rel_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """The largest |got - want| over all tables, relative to each table's largest |want|."""
    return max(float(np.abs(got[k] - want[k].reshape(got[k].shape)).max() / max(np.abs(want[k]).max(), 1e-3))
               for k in got)


def assert_tables_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name].reshape(value.shape), rtol=2e-5, atol=2e-6, err_msg=name)


MODELS = {
    "ctr_dnn": (CtrDnn, ctr_dnn_ref),
    "wide_deep": (WideDeep, wide_deep_ref),
}


@pytest.mark.parametrize("mode", sorted(STRATEGIES))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_sgd_steps_equal_the_reference(name: str, mode: str, tmp_path: Path, processes: Processes) -> None:
    cls, ref_grads = MODELS[name]
    model = cls(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=BATCH,
                optimizer="sgd", lr=0.5, init_range=0.5)
    initial, final, (ref,), _ = train_both(model, ref_grads, make_lines(1), processes, (None,), mode)
    assert max_rel_error(final, initial) > 1e-2  # the steps moved the tables
    assert_tables_equal(final, ref.p)


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(STRATEGIES))
@pytest.mark.parametrize("bias_correction", ["row", "step"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_adam_steps_equal_the_reference_of_their_bias_correction(name: str, bias_correction: str, mode: str,
                                                                   tmp_path: Path, processes: Processes) -> None:
    """``bias_correction="row"``: lazy Adam with a per-row step count; ``"step"``: PyTorch's
    SparseAdam (one count per table). Each ends where its reference does and away from the
    other's on the same batches."""
    cls, ref_grads = MODELS[name]
    model = cls(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=BATCH,
                optimizer="adam", lr=0.05, init_range=0.5, bias_correction=bias_correction)
    initial, final, refs, lagging = train_both(model, ref_grads, make_lines(2), processes, ("row", "step"), mode)
    assert lagging >= 10  # many rows were updated fewer times than the table
    assert max_rel_error(final, initial) > 1e-2
    same, other = refs if bias_correction == "row" else refs[::-1]
    assert_tables_equal(final, same.p)
    assert max_rel_error(final, other.p) > 1e-2


class DelayedDense:
    """A :class:`Reference` whose gradients are computed with the dense tables of the step
    before last (hybrid's ``dense_lag=1``): ``p`` is what step s computes with (the sparse
    tables now, the dense ones after ``max(s - 1, 0)`` steps), ``now`` the tables after the
    steps applied so far."""

    def __init__(self, inner: Reference, dense: set[str]) -> None:
        self.inner, self.dense = inner, dense
        self.after = [{k: inner.p[k].copy() for k in dense}]  # after[k]: dense tables after k steps

    @property
    def p(self) -> dict[str, np.ndarray]:
        return {**self.inner.p, **self.after[max(len(self.after) - 2, 0)]}

    @property
    def now(self) -> dict[str, np.ndarray]:
        return self.inner.p

    def apply(self, grads: dict[str, np.ndarray], touched: dict[str, np.ndarray]) -> None:
        self.inner.apply(grads, touched)
        self.after.append({k: self.inner.p[k].copy() for k in self.dense})


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_hybrid_with_a_dense_lag_equals_the_reference_of_delayed_dense_steps(optimizer: str, tmp_path: Path,
                                                                                processes: Processes) -> None:
    """Hybrid's one-step dense lag (dense_lag=1) with fresh sparse rows (max_staleness=0): after 20
    steps CTR-DNN's tables equal the reference whose dense gradients are computed with the
    dense tables of the step before last, and not the synchronous one."""
    adam = optimizer == "adam"
    model = CtrDnn(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=BATCH,
                   optimizer=optimizer, lr=0.05 if adam else 0.5, init_range=0.5)
    dense = {t.name for t in model.dense_tables()}
    sparse = {t.name for t in model.sparse_tables()}

    def refs(initial: dict[str, np.ndarray]) -> list[Any]:
        return [DelayedDense(Reference(initial, sparse, model.lr, "row" if adam else None), dense),
                Reference(initial, sparse, model.lr, "row" if adam else None)]

    strategy = aps.Strategy(mode="hybrid", max_staleness=0, dense_lag=1)
    _, final, (delayed, fresh), _ = train_both(model, ctr_dnn_ref, make_lines(2), processes, refs, strategy=strategy)
    assert_tables_equal(final, delayed.now)
    assert max_rel_error(final, fresh.p) > 1e-2
