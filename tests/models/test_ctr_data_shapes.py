"""make_data.py's data shapes: the default bytes are pinned, and ``--shape longtail`` / ``drift``
each show the property they promise (a longer tail of rare values and slot x slot interactions;
ids that change over the training files' order), deterministically by seed."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# sha256 of train part-* then test part-* for --scale small --train-lines 3000 --test-lines 1000
# --train-files 2 --seed 3: the files every earlier measurement used must not change
DEFAULT_DIGEST = "bf81dfe97e56989c33ae27a3eebc6c649983b57e1896f91dc0f0f8a32e714dd9"


@pytest.fixture(scope="module")
def make_data() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_data", ROOT / "examples" / "ctr_dnn" / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_data"] = module       # its dataclass looks its module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["make_data"]
    return module


def generate(md: ModuleType, out: Path, shape: str, lines: int = 20_000, files: int = 4, seed: int = 0) -> dict:
    return md.generate(out, train_lines=lines, test_lines=2000, train_files=files, test_files=1, seed=seed,
                       scale="small", shape=shape, log=lambda _text: None)


def slot_columns(path: Path) -> list[list[str]]:
    return [line.split("\t")[14:] for line in path.read_text().splitlines()]


def split_bytes(out: Path, split: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((out / split).glob("part-*")))


def rare_share(out: Path) -> float:
    """Share of the training set's (slot, value) occurrences whose value occurs once."""
    counts = Counter((j, v) for f in sorted((out / "train_data").glob("part-*"))
                     for row in slot_columns(f) for j, v in enumerate(row) if v)
    return sum(n for n in counts.values() if n == 1) / sum(counts.values())


def first_last_distance(out: Path) -> float:
    """Mean over the slots of the total variation distance between the value frequencies of the
    first and the last training file."""
    files = sorted((out / "train_data").glob("part-*"))
    first, last = slot_columns(files[0]), slot_columns(files[-1])
    distances = []
    for j in range(len(first[0])):
        a, b = Counter(r[j] for r in first), Counter(r[j] for r in last)
        distances.append(0.5 * sum(abs(a[k] / len(first) - b[k] / len(last)) for k in set(a) | set(b)))
    return float(np.mean(distances))


def test_default_shape_bytes_are_unchanged(make_data: ModuleType, tmp_path: Path) -> None:
    make_data.generate(tmp_path, train_lines=3000, test_lines=1000, train_files=2, test_files=1, seed=3,
                       scale="small", log=lambda _text: None)
    digest = hashlib.sha256(split_bytes(tmp_path, "train_data") + split_bytes(tmp_path, "test_data")).hexdigest()
    assert digest == DEFAULT_DIGEST
    assert "shape" not in json.loads((tmp_path / "meta.json").read_text())


@pytest.mark.slow  # generates 2 x 20,000 lines and counts every value: 4-7 s on 2 cores
def test_longtail_has_more_rare_values_and_interactions(make_data: ModuleType, tmp_path: Path) -> None:
    base = generate(make_data, tmp_path / "default", "default")
    meta = generate(make_data, tmp_path / "longtail", "longtail")
    again = generate(make_data, tmp_path / "again", "longtail", files=1)
    assert split_bytes(tmp_path / "again", "train_data") == split_bytes(tmp_path / "longtail", "train_data")
    assert again["bayes_auc_test"] == meta["bayes_auc_test"]
    assert meta["shape"] == "longtail" and 0.7 < meta["bayes_auc_test"] < 0.9
    assert abs(meta["positive_rate_train"] - make_data.TARGET_RATE) < 0.02
    assert rare_share(tmp_path / "longtail") > 1.15 * rare_share(tmp_path / "default")
    assert base["bayes_auc_test"] != meta["bayes_auc_test"]
    # the interaction part of the true logit has PAIR_SHARE of the per-value part's spread
    model = make_data.build_model(0, "small", "longtail")
    assert len(model.pairs) == make_data.PAIRS
    cats, _dense = make_data.sample_features(model, np.random.default_rng(9), 50_000)
    ratio = (model.pair_scale * make_data.pair_logit(model.pairs, cats)).std() / make_data.categorical_logit(model, cats).std()
    assert ratio == pytest.approx(make_data.PAIR_SHARE, rel=0.05)


def test_drift_changes_the_ids_over_the_files(make_data: ModuleType, tmp_path: Path) -> None:
    generate(make_data, tmp_path / "default", "default")
    meta = generate(make_data, tmp_path / "drift", "drift")
    other_seed = generate(make_data, tmp_path / "seed1", "drift", lines=1000, seed=1)
    assert meta["shape"] == "drift" and 0.7 < meta["bayes_auc_test"] < 0.9
    assert other_seed["bayes_auc_test"] != meta["bayes_auc_test"]
    assert first_last_distance(tmp_path / "drift") > 0.25          # measured 0.33
    assert first_last_distance(tmp_path / "default") < 0.12        # sampling noise: 0.07
    # drifting slots have old and new values: twice the ids of the default shape
    cards = dict(zip(meta["slot_cardinality"], make_data.build_model(0, "small").cdfs))
    assert max(meta["slot_cardinality"]) == 2 * make_data.SMALL_CAP
    assert min(meta["slot_cardinality"]) == min(c.size for c in cards.values())
    generate(make_data, tmp_path / "again", "drift", lines=1000, files=1)   # the test set is drawn at the end
    assert split_bytes(tmp_path / "again", "test_data") == split_bytes(tmp_path / "drift", "test_data")
