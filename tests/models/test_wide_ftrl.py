"""wide&deep with FTRL on its wide part and L2 decay on every table (``wide_optimizer=ftrl``,
``l2``): 20 sync steps through a real pserver equal numpy's, table by table; the arguments, and
CTR-DNN's ``l2``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.models import build_model
from aps.models.ctr_dnn.model import CtrDnn
from aps.models.wide_deep.model import WIDE_BIAS, WIDE_DENSE, WIDE_SLOT, WideDeep
from tests.conftest import Processes
from tests.models.test_ctr_models import wide_deep_ref
from tests.models.test_ctr_step_equality import BATCH, assert_tables_equal, make_lines, train_both, write_meta
from tests.server.optim_reference import DenseReference, SparseReference

pytestmark = pytest.mark.timeout(120)

WIDE = {WIDE_SLOT, WIDE_DENSE, WIDE_BIAS}


class PerTable:
    """Each table's own optimizer in numpy (tests/server/optim_reference.py), behind the
    interface of test_ctr_step_equality's Reference: ``p`` (every table) and ``apply``."""

    def __init__(self, model: aps.Model, initial: dict[str, np.ndarray]) -> None:
        self.shapes = {k: v.shape for k, v in initial.items()}
        self.refs: dict[str, SparseReference | DenseReference] = {}
        for spec in model.tables():
            if spec.kind == "sparse":
                self.refs[spec.name] = SparseReference(spec.optimizer, np.arange(spec.rows), initial[spec.name])
            else:
                self.refs[spec.name] = DenseReference(spec.optimizer, initial[spec.name])

    @property
    def p(self) -> dict[str, np.ndarray]:
        return {k: (r.values if isinstance(r, DenseReference) else r.values(np.arange(self.shapes[k][0]))).reshape(self.shapes[k])
                for k, r in self.refs.items()}

    def apply(self, grads: dict[str, np.ndarray], touched: dict[str, np.ndarray]) -> None:
        for name, ref in self.refs.items():
            if isinstance(ref, DenseReference):
                ref.push(grads[name])
            else:
                ref.push(touched[name], grads[name][touched[name]])


def test_ftrl_wide_part_and_l2_steps_equal_numpy(tmp_path: Path, processes: Processes) -> None:
    model = WideDeep(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=BATCH,
                     optimizer="adam", lr=0.05, init_range=0.5, l2=0.01,
                     wide_optimizer="ftrl", ftrl_alpha=0.5, ftrl_l1=0.002)
    _, final, (ref,), _ = train_both(model, wide_deep_ref, make_lines(3), processes, lambda initial: [PerTable(model, initial)])
    assert {type(ref.refs[n].opt) for n in WIDE} == {aps.Ftrl}
    assert_tables_equal(final, ref.p)
    assert (final[WIDE_SLOT] == 0).any() and (final[WIDE_SLOT] != 0).any()  # l1's exact zeros among trained weights


def test_wide_optimizer_arguments() -> None:
    model = build_model("wide_deep", ["wide_optimizer=ftrl", "ftrl_alpha=0.1", "ftrl_beta=0.5", "ftrl_l1=0.01", "l2=0.001"])
    opts = {t.name: t.optimizer for t in model.tables()}
    assert {opts[n] for n in WIDE} == {aps.Ftrl(alpha=0.1, beta=0.5, l1=0.01, l2=0.001)}
    assert {o for n, o in opts.items() if n not in WIDE} == {aps.Adam(lr=0.001, l2=0.001)}
    assert model.describe() | {"wide_optimizer": "ftrl", "ftrl_alpha": 0.1, "l2": 0.001} == model.describe()
    assert {t.optimizer for t in WideDeep().tables()} == {aps.Adam(lr=0.001)}  # the default: Adam everywhere, no decay
    with pytest.raises(aps.ConfigError, match="wide_deep wide_optimizer must be one of same, ftrl, adagrad, got 'adam'"):
        WideDeep(wide_optimizer="adam")
    adagrad = build_model("wide_deep", ["wide_optimizer=adagrad", "wide_lr=0.1", "l2=0.001"])
    assert {t.optimizer for t in adagrad.tables() if t.name in WIDE} == {aps.Adagrad(lr=0.1, l2=0.001)}
    assert adagrad.describe() | {"wide_optimizer": "adagrad", "wide_lr": 0.1} == adagrad.describe()
    with pytest.raises(aps.ConfigError, match="wide_deep wide_lr must be a positive number, got -1"):
        WideDeep(wide_optimizer="adagrad", wide_lr=-1)
    with pytest.raises(aps.ConfigError, match="wide_deep wide_lr must be a number, got 'x'"):
        WideDeep(wide_lr="x")  # refused offline too, where the default wide part does not use it
    with pytest.raises(aps.ConfigError, match="wide_deep Ftrl: alpha must be a positive finite number"):
        WideDeep(wide_optimizer="ftrl", ftrl_alpha=0)
    with pytest.raises(aps.ConfigError, match="wide_deep l2 must be a number >= 0, got -1"):
        WideDeep(l2=-1)


def test_ftrl_wide_part_defaults_to_alpha_1() -> None:
    """alpha 1 beat FTRL's usual 0.05 on every data set measured (Adult, 3 init seeds, and a
    generated set; bench/README.md): the gradients are of the batch mean, so the per-example
    alpha is too small. Adam everywhere stays the model's default."""
    opts = {t.name: t.optimizer for t in WideDeep(wide_optimizer="ftrl").tables()}
    assert {opts[n] for n in WIDE} == {aps.Ftrl(alpha=1.0, beta=1.0)}
    assert WideDeep(wide_optimizer="ftrl").describe()["ftrl_alpha"] == 1.0


def test_ctr_dnn_takes_l2_for_every_table() -> None:
    assert {t.optimizer for t in CtrDnn(l2="0.0001").tables()} == {aps.Adam(lr=0.001, l2=1e-4)}
    assert CtrDnn(l2=1e-4, optimizer="sgd", lr=0.1).describe()["l2"] == 1e-4
