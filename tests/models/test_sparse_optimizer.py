"""The CTR models' ``sparse_optimizer`` / ``sparse_lr``: the tables indexed by slot ids get
their own optimizer (Adagrad here, as embeddings are trained in most CTR systems), the dense
tables keep the model's; 20 sync steps through a real pserver equal numpy's, table by table."""

from __future__ import annotations

from pathlib import Path

import pytest

import aps
from aps.models import build_model
from aps.models.ctr_dnn.model import EMBEDDING, CtrDnn
from aps.models.wide_deep.model import DEEP_EMB, WIDE_SLOT, WideDeep
from tests.conftest import Processes
from tests.models.test_ctr_models import ctr_dnn_ref, wide_deep_ref
from tests.models.test_ctr_step_equality import BATCH, assert_tables_equal, make_lines, train_both, write_meta
from tests.models.test_wide_ftrl import PerTable

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("cls,ref", [(CtrDnn, ctr_dnn_ref), (WideDeep, wide_deep_ref)], ids=["ctr_dnn", "wide_deep"])
def test_sparse_adagrad_and_dense_adam_steps_equal_numpy(cls, ref, tmp_path: Path, processes: Processes) -> None:
    model = cls(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=BATCH,
                optimizer="adam", lr=0.05, init_range=0.5, sparse_optimizer="adagrad", sparse_lr=0.3)
    initial, final, (per_table,), _ = train_both(model, ref, make_lines(3), processes, lambda t: [PerTable(model, t)])
    sparse = {t.name for t in model.sparse_tables()}
    assert {type(per_table.refs[n].opt) for n in sparse} == {aps.Adagrad}
    assert {type(r.opt) for n, r in per_table.refs.items() if n not in sparse} == {aps.Adam}
    assert_tables_equal(final, per_table.p)
    for name in sparse:  # the sparse tables moved, by Adagrad's steps
        assert (final[name] != initial[name]).any()


def test_sparse_optimizer_arguments() -> None:
    model = build_model("wide_deep", ["sparse_optimizer=adagrad", "sparse_lr=0.05", "l2=0.001"])
    opts = {t.name: t.optimizer for t in model.tables()}
    assert opts[WIDE_SLOT] == opts[DEEP_EMB] == aps.Adagrad(lr=0.05, l2=0.001)
    assert {o for n, o in opts.items() if n not in (WIDE_SLOT, DEEP_EMB)} == {aps.Adam(lr=0.001, l2=0.001)}
    assert model.describe()["sparse_optimizer"] == "adagrad" and model.describe()["sparse_lr"] == 0.05
    # under wide_optimizer=ftrl the wide weights stay FTRL's; the embedding takes the sparse optimizer
    ftrl = {t.name: t.optimizer for t in WideDeep(wide_optimizer="ftrl", sparse_optimizer="sgd", sparse_lr=0.5).tables()}
    assert isinstance(ftrl[WIDE_SLOT], aps.Ftrl) and ftrl[DEEP_EMB] == aps.SGD(lr=0.5)
    # no sparse_lr: the model's lr; the default: the model's optimizer on every table
    assert {t.name: t.optimizer for t in CtrDnn(sparse_optimizer="adagrad").tables()}[EMBEDDING] == aps.Adagrad(lr=0.001)
    assert {t.optimizer for t in CtrDnn().tables()} == {aps.Adam(lr=0.001)} and "sparse_optimizer" not in CtrDnn().describe()
    with pytest.raises(aps.ConfigError, match="ctr_dnn sparse_optimizer must be one of same, adam, sgd, adagrad, adagrad_rowwise, got 'ftrl'"):
        CtrDnn(sparse_optimizer="ftrl")
    with pytest.raises(aps.ConfigError, match="wide_deep sparse_lr must be a positive number, got -1"):
        build_model("wide_deep", ["sparse_optimizer=adagrad", "sparse_lr=-1"])


def test_rowwise_adagrad_and_float16_values_as_model_arguments() -> None:
    model = build_model("ctr_dnn", ["table=hash", "sparse_optimizer=adagrad_rowwise", "sparse_lr=0.05", "table_dtype=float16"])
    emb = {t.name: t for t in model.tables()}[EMBEDDING]
    assert emb.optimizer == aps.Adagrad(lr=0.05, rowwise=True) and emb.dtype == "float16"
    assert model.describe()["table_dtype"] == "float16" and "table_dtype" not in CtrDnn(table="hash").describe()
    with pytest.raises(aps.ConfigError, match="table_dtype=float16 stores hash tables' values: it needs table=hash"):
        CtrDnn(table_dtype="float16")
    with pytest.raises(aps.ConfigError, match="dtype must be one of float32, float16"):
        CtrDnn(table="hash", table_dtype="int8")
    with pytest.raises(aps.ConfigError, match="dense table has no rows"):
        CtrDnn(optimizer="adagrad_rowwise")


def test_the_compact_row_and_disk_options_as_model_arguments() -> None:
    args = ["table=hash", "table_dtype=float16", "table_state_dtype=bfloat16", "table_stats=compact", f"table_disk_ram={64 << 20}"]
    model = build_model("wide_deep", args)
    for table in model.sparse_tables():
        assert (table.dtype, table.state_dtype, table.stats) == ("float16", "bfloat16", "compact")
        assert table.disk == aps.Disk(ram_bytes=64 << 20)
    described = model.describe()
    assert described["table_state_dtype"] == "bfloat16" and described["table_stats"] == "compact"
    assert described["table_disk_ram"] == 64 << 20
    for arg in ("table_state_dtype=bfloat16", "table_stats=compact", "table_disk_ram=67108864"):
        with pytest.raises(aps.ConfigError, match="it needs table=hash"):
            build_model("ctr_dnn", [arg])
    with pytest.raises(aps.ConfigError, match="state_dtype must be one of float32, bfloat16"):
        build_model("ctr_dnn", ["table=hash", "table_state_dtype=float16"])
