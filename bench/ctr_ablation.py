#!/usr/bin/env python3
"""Where does aps's CTR AUC differ from PyTorch's? Settings x data sets, 3 seeds each.

Issue 19's ablation: each row is one aps setting (mode, workers, prefetch, sparse Adam's bias
correction, embedding init, wide&deep's wide optimizer), each column one data set; a cell is aps's
test AUC minus PyTorch's on the same data and seed (mean over the seeds, and the spread: min..max).
PyTorch runs once per (data set, seed), with the default init, and every row of that column is
compared with that one run, so the rows are also comparable with each other.

Data sets (every run is ``bench/ctr_vs_torch.py``'s: same network, batches and Adam, 1 pserver +
1 trainer, whole run timed, other processes' CPU recorded):

* ``default``, ``longtail``, ``drift``: ``examples/ctr_dnn/make_data.py --scale full --shape S
  --seed N`` (``--train-lines`` / ``--test-lines``, 2 files), CTR-DNN, 1 epoch; the seed is the data's,
  PyTorch's init's and aps's model seed;
* ``adult``: the Adult census set (``examples/wide_deep/prepare_adult.py``, ``--adult DIR``),
  wide&deep, ``--adult-epochs`` epochs, batches of 256; the seed is both systems' init seed.

Runs go one at a time and each result is appended to the JSON at once: an interrupted run resumes
where it stopped (``--rows`` / ``--datasets`` pick a subset; the order of ``--rows`` is the order of
the work, so the rows that decide defaults can go first). ``--table`` only prints the table of the
JSON.

    .venv/bin/python bench/ctr_ablation.py --adult data/adult --data-root /tmp/ablation
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import ctr_vs_torch as bench  # bench/ctr_vs_torch.py: data, both systems' runs, the metrics
import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: row name -> (model it applies to, aps mode (None: the model's, hybrid), workers, extra trainer args)
ROWS: dict[str, tuple[str, str | None, int, str]] = {
    "hybrid, 2 workers (default mode)": ("ctr_dnn", None, 2, ""),
    "hybrid, 2 workers, init_range=0.05": ("ctr_dnn", None, 2, "--model-arg init_range=0.05"),
    "hybrid, 2 workers, bias_correction=step": ("ctr_dnn", None, 2, "--model-arg bias_correction=step"),
    "sync, 1 worker": ("ctr_dnn", "sync", 1, ""),
    "async, 2 workers": ("ctr_dnn", "async", 2, ""),
    "hybrid, 1 worker": ("ctr_dnn", None, 1, ""),
    "async, 1 worker": ("ctr_dnn", "async", 1, ""),
    "hybrid, 2 workers, --no-prefetch": ("ctr_dnn", None, 2, "--no-prefetch"),
    "hash tables": ("ctr_dnn", None, 2, "--model-arg table=hash"),
    "hash tables, float16 values": ("ctr_dnn", None, 2, "--model-arg table=hash --model-arg table_dtype=float16"),
    "hash tables, row-wise Adagrad 0.05 embeddings": (
        "ctr_dnn", None, 2, "--model-arg table=hash --model-arg sparse_optimizer=adagrad_rowwise --model-arg sparse_lr=0.05"),
    "hash tables, row-wise Adagrad 0.05 embeddings, float16 values": (
        "ctr_dnn", None, 2,
        "--model-arg table=hash --model-arg sparse_optimizer=adagrad_rowwise --model-arg sparse_lr=0.05 --model-arg table_dtype=float16"),
    "hash tables, bfloat16 values": ("ctr_dnn", None, 2, "--model-arg table=hash --model-arg table_dtype=bfloat16"),
    "hash tables, bfloat16 Adam moments": ("ctr_dnn", None, 2, "--model-arg table=hash --model-arg table_state_dtype=bfloat16"),
    "hash tables, float16 values, bfloat16 Adam moments": (
        "ctr_dnn", None, 2, "--model-arg table=hash --model-arg table_dtype=float16 --model-arg table_state_dtype=bfloat16"),
    "hash tables, row-wise Adagrad 0.05 embeddings, float16 values, bfloat16 accumulators, compact statistics": (
        "ctr_dnn", None, 2,
        "--model-arg table=hash --model-arg sparse_optimizer=adagrad_rowwise --model-arg sparse_lr=0.05 --model-arg table_dtype=float16"
        " --model-arg table_state_dtype=bfloat16 --model-arg table_stats=compact"),
    "wide&deep, Adam (default)": ("wide_deep", None, 2, ""),
    "wide&deep, FTRL wide, ftrl_alpha=0.05": ("wide_deep", None, 2, "--model-arg wide_optimizer=ftrl --model-arg ftrl_alpha=0.05"),
    "wide&deep, FTRL wide, ftrl_alpha=1": ("wide_deep", None, 2, "--model-arg wide_optimizer=ftrl --model-arg ftrl_alpha=1"),
}
#: PyTorch with another embedding init (CTR-DNN): the reference for aps's row of the same init
TORCH_ROWS = {"PyTorch, init_range=0.05": 0.05}
#: aps rows compared with a PyTorch row besides the default one
VERSUS = {"hybrid, 2 workers, init_range=0.05": "PyTorch, init_range=0.05"}
#: CTR-DNN's embedding init in every run unless the row names another: the reference's (and
#: the model's default when the ablation ran; it is 0.05 since, on this table's evidence)
REFERENCE_INIT = 1.0
GENERATED = ("default", "longtail", "drift")
DATASETS = (*GENERATED, "adult")
ADULT_BATCH = 256


def run_args(opts: argparse.Namespace, dataset: str, seed: int, row: str | None) -> argparse.Namespace:
    """ctr_vs_torch's arguments for one run (row None or in TORCH_ROWS: PyTorch's)."""
    torch_model = ("wide_deep" if dataset == "adult" else "ctr_dnn", None, 2, "")
    model, mode, workers, extra = ROWS[row] if row in ROWS else torch_model
    adult = dataset == "adult"
    return argparse.Namespace(
        train_lines=opts.train_lines, test_lines=opts.test_lines, train_files=2, scale="full",
        shape="default" if adult else dataset, seed=seed, adult=opts.adult if adult else None, model=model,
        mode=mode, epochs=opts.adult_epochs if adult else 1, batch_size=ADULT_BATCH if adult else bench.BATCH,
        init_range=TORCH_ROWS.get(row or "", REFERENCE_INIT if model == "ctr_dnn" else None), workers=workers, threads=opts.threads, aps_extra=f"--model-arg seed={seed} {extra}".strip(),
    )


class Data:
    """One (data set, seed): its files, generated once, and the test batches, parsed once."""

    def __init__(self, opts: argparse.Namespace, dataset: str, seed: int) -> None:
        args = run_args(opts, dataset, seed, None)
        if dataset == "adult":
            self.dir = Path(opts.adult).resolve()
            self.meta = json.loads((self.dir / "meta.json").read_text())
        else:
            self.dir = Path(opts.data_root).resolve() / f"{dataset}-{seed}"
            self.meta = bench.make_data(self.dir, args)
        self.spec = bench.setup(args)
        self.train_files = bench.data_files(self.dir / "train_data")
        self.test_files = bench.data_files(self.dir / "test_data")
        self.test_batches = bench.parse_batches(self.test_files, self.spec["meta"], self.spec["batch"])
        self.test_labels = np.concatenate([b[2] for b in self.test_batches])


def one_run(opts: argparse.Namespace, data: Data, dataset: str, seed: int, row: str | None, work: Path) -> dict:
    """Train and test one system; the record the JSON keeps."""
    args = run_args(opts, dataset, seed, row)
    load = os.getloadavg()[0]
    if row is None or row in TORCH_ROWS:
        r = bench.run_torch(data.train_files, work, args)
        probs = bench.torch_predict(work / "model.pt", data.test_batches, args.threads, bench.setup(args))
    else:
        r = bench.run_aps(data.dir, work, args)
        # the row's own model arguments (table=hash, ...) shape the tables the checkpoint holds
        extra = shlex.split(ROWS[row][3])
        row_args = [extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "--model-arg"]
        spec = {**data.spec, "model_args": [*data.spec["model_args"], *row_args]}
        probs, labels = bench.aps_predict(r["checkpoint"], data.test_files, spec)
        if not np.array_equal(labels, data.test_labels):
            raise RuntimeError("aps and PyTorch saw different test labels")
    r.update(bench.test_metrics(probs, data.test_labels))
    keep = ("auc", "logloss", "examples", "steps", "wall_s", "loop_examples_per_s", "wall_examples_per_s",
            "own_cpu", "other_cpu", "wait_share", "command")
    return {"dataset": dataset, "seed": seed, "row": row or "pytorch", "load_before": load, "threads": args.threads,
            "bayes_auc_test": data.meta.get("bayes_auc_test"), **{k: r[k] for k in keep if k in r}}


def work_items(opts: argparse.Namespace) -> list[tuple[str, int, str | None]]:
    """(data set, seed, row) in the order of --rows; PyTorch's run before a column's first row."""
    items: list[tuple[str, int, str | None]] = []
    for row in opts.rows:
        model = ROWS[row][0] if row in ROWS else "ctr_dnn"
        for dataset in opts.datasets:
            if (model == "wide_deep") != (dataset == "adult"):
                continue
            for seed in opts.seeds:
                if (dataset, seed, None) not in items:
                    items.append((dataset, seed, None))
                items.append((dataset, seed, row))
    return items


def load_results(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"runs": []}


def cell(results: list[dict], dataset: str, row: str, base: str = "pytorch") -> tuple[float, float, float, int] | None:
    """(mean, min, max, seeds) of the row's AUC minus the base row's over the seeds both ran."""
    torch_auc = {r["seed"]: r["auc"] for r in results if r["dataset"] == dataset and r["row"] == base}
    diffs = [r["auc"] - torch_auc[r["seed"]] for r in results
             if r["dataset"] == dataset and r["row"] == row and r["seed"] in torch_auc]
    if not diffs:
        return None
    return statistics.mean(diffs), min(diffs), max(diffs), len(diffs)


def table(results: list[dict]) -> str:
    """Markdown: rows x data sets, 'mean (min..max)' of AUC - PyTorch, n seeds when not 3."""
    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in results)]
    lines = ["| aps setting | " + " | ".join(datasets) + " |", "|---|" + "---:|" * len(datasets)]
    torch_row = []
    for d in datasets:
        aucs = [r["auc"] for r in results if r["dataset"] == d and r["row"] == "pytorch"]
        torch_row.append(f"{statistics.mean(aucs):.4f} (n={len(aucs)})" if aucs else "")
    lines.append("| PyTorch, test AUC (mean) | " + " | ".join(torch_row) + " |")
    lines += [line for row in TORCH_ROWS for line in table_line(results, datasets, row)]
    for row in ROWS:
        lines += table_line(results, datasets, row)
        if row in VERSUS:
            lines += table_line(results, datasets, row, VERSUS[row])
    return "\n".join(lines)


def table_line(results: list[dict], datasets: list[str], row: str, base: str = "pytorch") -> list[str]:
    """The row's cells against ``base`` (no line when the row has no results)."""
    cells = []
    for d in datasets:
        c = cell(results, d, row, base)
        if c is None:
            cells.append("")
            continue
        mean, lo, hi, n = c
        cells.append(f"{mean:+.4f} ({lo:+.4f}..{hi:+.4f})" + ("" if n == 3 else f" n={n}"))
    name = row if base == "pytorch" else f"{row}, minus {base}"
    return [f"| {name} | " + " | ".join(cells) + " |"] if any(cells) else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", choices=[*ROWS, *TORCH_ROWS], default=[*ROWS, *TORCH_ROWS], metavar="ROW",
                        help="settings to run, in this order (default: all): " + "; ".join([*ROWS, *TORCH_ROWS]))
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--train-lines", type=bench.positive_int, default=200_000, help="generated sets (default: %(default)s)")
    parser.add_argument("--test-lines", type=bench.positive_int, default=50_000, help="generated sets (default: %(default)s)")
    parser.add_argument("--adult", metavar="DIR", help="prepare_adult.py's output (needed for the adult column)")
    parser.add_argument("--adult-epochs", type=bench.positive_int, default=3, help="default: %(default)s")
    parser.add_argument("--threads", type=bench.positive_int, default=1,
                        help="PyTorch's threads (default: %(default)s: with 2 on 2 busy shared cores, its OpenMP "
                             "threads wait on each other and a run takes minutes; the AUC does not depend on it)")
    parser.add_argument("--data-root", default="/tmp/aps-ctr-ablation", help="generated data go here (kept, reused)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "ctr_ablation.json"), help="default: %(default)s")
    parser.add_argument("--table", action="store_true", help="only print the table of --json")
    opts = parser.parse_args()
    out = Path(opts.json)
    saved = load_results(out)
    if opts.table:
        print(table(saved["runs"]))
        return 0
    if "adult" in opts.datasets and not opts.adult:
        opts.datasets = [d for d in opts.datasets if d != "adult"]
        print("no --adult DIR: skipping the adult column", file=sys.stderr)
    saved.setdefault("machine", bench.machine_info())
    done = {(r["dataset"], r["seed"], r["row"]) for r in saved["runs"]}
    loaded: dict[tuple[str, int], Data] = {}
    work = Path(opts.data_root).resolve() / "runs"
    for dataset, seed, row in work_items(opts):
        if (dataset, seed, row or "pytorch") in done:
            continue
        if (dataset, seed) not in loaded:
            loaded.clear()  # one data set's test batches in memory at a time
            loaded[(dataset, seed)] = Data(opts, dataset, seed)
        started = time.perf_counter()
        try:
            record = one_run(opts, loaded[(dataset, seed)], dataset, seed, row, work / f"{dataset}-{seed}")
        except (RuntimeError, OSError, ValueError) as exc:  # one failed run costs its cell, not the table
            print(f"{dataset} seed {seed} {row or 'pytorch'}: FAILED, left out: {exc}", file=sys.stderr, flush=True)
            continue
        record["date"] = time.strftime("%Y-%m-%d %H:%M")
        saved["runs"].append(record)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(saved, indent=1) + "\n")
        print(f"{dataset} seed {seed} {row or 'pytorch'}: AUC {record['auc']:.4f}, whole run {record['wall_s']:.1f} s, "
              f"load {record['load_before']:.1f}, other CPU {record['other_cpu'] or 0:.2f} cores "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    print(table(saved["runs"]))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
