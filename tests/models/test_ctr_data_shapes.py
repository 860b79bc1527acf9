"""make_data.py's data shapes: the default bytes are pinned, and ``--shape longtail`` / ``drift``
each show the property they promise (a longer tail of rare values and slot x slot interactions;
ids that change over the training files' order), deterministically by seed. ``--labels 2`` and
``--history L`` (a second task, a behaviour sequence sharing a slot's ids) leave those bytes alone
when not given, and their lines are what aps.models.tabular.TabularFormat reads from meta.json."""

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

from aps.models.tabular import TabularFormat, TabularRecords
from aps.trainer.reader import Chunk

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


# ----------------------------------------------------------------------------- --labels 2, --history L

SMALL_ARGS = ["--scale", "small", "--train-lines", "3000", "--test-lines", "1000", "--train-files", "2", "--seed", "3"]


def lines_of(out: Path, split: str) -> list[list[bytes]]:
    return [line.split(b"\t") for line in split_bytes(out, split).splitlines()]


def parse_split(fmt: TabularFormat, out: Path, split: str) -> TabularRecords:
    data = split_bytes(out, split)
    return fmt.parse(Chunk(split, 1, data, data.count(b"\n")))


def test_new_options_off_keep_the_default_bytes(make_data: ModuleType, tmp_path: Path) -> None:
    """--labels 1 --history 0 on the command line: the pinned bytes and a meta.json without the new
    keys. --labels 2 only inserts the second label (click labels and features unchanged);
    --history only changes the click labels (its term) and appends the sequence."""
    assert make_data.main(["--out", str(tmp_path / "off"), *SMALL_ARGS, "--labels", "1", "--history", "0"]) == 0
    off = tmp_path / "off"
    digest = hashlib.sha256(split_bytes(off, "train_data") + split_bytes(off, "test_data")).hexdigest()
    assert digest == DEFAULT_DIGEST
    meta = json.loads((off / "meta.json").read_text())
    assert not {"labels", "lists", "bayes_auc_tasks", "bayes_auc_test_without_history"} & set(meta)
    for name, extra in (("labels2", ["--labels", "2"]), ("history", ["--history", "4"])):
        assert make_data.main(["--out", str(tmp_path / name), *SMALL_ARGS, *extra]) == 0
    for split in ("train_data", "test_data"):
        base = lines_of(off, split)
        two = lines_of(tmp_path / "labels2", split)
        assert [[r[0], *r[2:]] for r in two] == base and {r[1] for r in two} == {b"0", b"1"}
        hist = lines_of(tmp_path / "history", split)
        assert all(len(r) == 41 for r in hist)
        assert [r[1:40] for r in hist] == [r[1:] for r in base]


@pytest.fixture(scope="module")
def tasks_data(make_data: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tasks")
    meta = make_data.generate(out, train_lines=20_000, test_lines=5000, train_files=3, test_files=1, seed=0,
                              scale="small", labels=2, history=8, log=lambda _text: None)
    return out, meta


def test_two_labels_and_history_parse_as_tabular(make_data: ModuleType, tasks_data: tuple[Path, dict]) -> None:
    out, meta = tasks_data
    assert meta["labels"] == 2
    assert meta["lists"] == [{"name": "history", "max_len": 8, "shares": make_data.HISTORY_SLOT, "separator": ","}]
    fmt = TabularFormat.from_meta(out / "meta.json")
    assert (fmt.labels, fmt.fields, fmt.lists[0].shares) == (2, 2 + 13 + 26 + 1, make_data.HISTORY_SLOT)
    for split, lines, key in (("train_data", 20_000, "positive_rate_train_tasks"),
                              ("test_data", 5000, "positive_rate_test_tasks")):
        rec = parse_split(fmt, out, split)
        assert (rec.n, rec.bad_lines) == (lines, 0)
        assert rec.counts.max() == 8 and (rec.counts == 0).any()          # lengths 0..8
        assert rec.labels.mean(axis=0).tolist() == pytest.approx(meta[key])
    assert abs(meta["positive_rate_train_tasks"][1] - make_data.TASK2_RATE) < 0.01   # measured 0.0496
    assert abs(meta["positive_rate_train"] - make_data.TARGET_RATE) < 0.02
    # the Bayes AUC of each task; the history term carries a real share of the click's
    assert meta["bayes_auc_tasks"][0] == meta["bayes_auc_test"]
    assert all(0.7 < a < 0.95 for a in meta["bayes_auc_tasks"])
    assert meta["bayes_auc_test_without_history"] < meta["bayes_auc_test"] - 0.03


def test_history_values_hash_as_the_shared_slot(make_data: ModuleType, tasks_data: tuple[Path, dict]) -> None:
    """A history value written like some line's value of the shared slot gets that slot's id."""
    out, _meta = tasks_data
    fmt = TabularFormat.from_meta(out / "meta.json")
    rec = parse_split(fmt, out, "train_data")
    lines = lines_of(out, "train_data")
    field = 2 + 13 + make_data.HISTORY_SLOT
    slot_ids: dict[bytes, set[int]] = {}
    for row, i in zip(lines, rec.ids[:, make_data.HISTORY_SLOT].tolist()):
        if row[field]:
            slot_ids.setdefault(row[field], set()).add(i)
    assert all(len(ids) == 1 for ids in slot_ids.values())
    offsets, matched = rec.offsets[:, 0], 0
    for r, row in enumerate(lines):
        texts = row[-1].split(b",") if row[-1] else []
        assert len(texts) == rec.counts[r, 0] and all(len(t) == 8 for t in texts)
        for text, value in zip(texts, rec.values[offsets[r]:offsets[r] + len(texts)].tolist()):
            if text in slot_ids:
                matched += 1
                assert slot_ids[text] == {value}
    assert matched > 0.9 * rec.counts.sum()                 # most history items are also some line's candidate


@pytest.mark.slow  # builds 3 models with sequences and writes 20,000 lines again: 5-10 s on 2 cores
def test_tasks_and_history_in_every_shape(make_data: ModuleType, tasks_data: tuple[Path, dict],
                                          tmp_path: Path) -> None:
    out, meta = tasks_data
    # deterministic, and the rows do not depend on the number of files
    again = make_data.generate(tmp_path / "again", train_lines=20_000, test_lines=5000, train_files=1, test_files=1,
                               seed=0, scale="small", labels=2, history=8, log=lambda _text: None)
    assert split_bytes(tmp_path / "again", "train_data") == split_bytes(out, "train_data")
    assert split_bytes(tmp_path / "again", "test_data") == split_bytes(out, "test_data")
    assert again["bayes_auc_tasks"] == meta["bayes_auc_tasks"]
    # the history term has its designed spread
    model = make_data.build_model(0, "small", "default", 2, 8)
    cats, _dense = make_data.sample_features(model, np.random.default_rng(9), 50_000)
    hist = make_data.sample_history(model, np.random.default_rng(10), cats)
    term = model.hist_scale * make_data.history_term(model, cats, hist)
    assert term.std() == pytest.approx(make_data.HIST_STD, rel=0.05)
    for shape in ("longtail", "drift"):
        m = make_data.generate(tmp_path / shape, train_lines=4000, test_lines=4000, train_files=2, test_files=1,
                               seed=0, scale="small", shape=shape, labels=2, history=8, log=lambda _text: None)
        assert m["shape"] == shape and m["labels"] == 2 and m["lists"][0]["max_len"] == 8
        assert all(0.7 < a < 0.95 for a in m["bayes_auc_tasks"]), (shape, m["bayes_auc_tasks"])
        assert m["bayes_auc_test_without_history"] < m["bayes_auc_test"] - 0.03
        rec = parse_split(TabularFormat.from_meta(tmp_path / shape / "meta.json"), tmp_path / shape, "train_data")
        assert rec.n == 4000 and rec.counts.max() <= 8
