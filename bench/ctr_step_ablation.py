#!/usr/bin/env python3
"""CTR-DNN in PyTorch, one process: does sparse Adam's bias correction or the init cost AUC?

The PyTorch model and loop of ``bench/ctr_vs_torch.py`` (same data, batches, network, Adam
lr 0.001), in four variants, each over several init seeds:

* the embedding's optimizer: ``torch.optim.SparseAdam`` (one step count for the table: aps's
  ``bias_correction="step"``) or a lazy Adam with a step count per row (aps's default ``"row"``,
  written here in torch: only the batch's rows, each corrected by its own count);
* the initial values: drawn by ``torch.manual_seed(seed)``, or aps's own tables (the pserver's
  init kernels for ``CtrDnn(seed=seed)``, the values a 1-pserver aps run starts from).

Everything else is one process, one update per batch, so the table isolates what a step computes
from staleness and merging. Prints a Markdown table (test AUC per seed and the mean) and writes JSON.

    .venv/bin/python bench/ctr_step_ablation.py --train-lines 200000 --test-lines 50000 --train-files 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ctr_vs_torch as bench  # bench/ctr_vs_torch.py: data, batches, the network, the metrics
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def aps_init(torch: Any, net: Any, seed: int) -> None:
    """Copy the pserver's initial tables of ``CtrDnn(seed=seed)`` into the torch network."""
    from aps.models.ctr_dnn.model import CtrDnn
    from aps.specs import SparseTable
    from aps.storage.init_kernels import init_dense, init_sparse_rows, table_seed

    with torch.no_grad():
        for spec in CtrDnn(seed=seed).tables():
            s = table_seed(spec.name, spec.seed)
            if isinstance(spec, SparseTable):
                rows = init_sparse_rows(spec.init, s, np.arange(spec.rows, dtype=np.int64), spec.dim)
                net.emb.weight.copy_(torch.from_numpy(rows))
                continue
            value = init_dense(spec.init, s, 0, spec.size).reshape(spec.shape)
            fc = net.fcs[int(spec.name[2:].split(".")[0]) - 1]  # fcK.w / fcK.b
            if spec.name.endswith(".w"):
                fc.weight.copy_(torch.from_numpy(np.ascontiguousarray(value.T)))  # torch keeps (out, in)
            else:
                fc.bias.copy_(torch.from_numpy(value))


class RowAdam:
    """Lazy Adam on an ``nn.Embedding(sparse=True)``: each row of the batch corrected by its own
    count of updates, eps added to the corrected sqrt(v_hat) (aps's ``bias_correction="row"``)."""

    def __init__(self, torch: Any, weight: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.torch, self.w, self.lr, (self.b1, self.b2), self.eps = torch, weight, lr, betas, eps
        self.m = torch.zeros_like(weight)
        self.v = torch.zeros_like(weight)
        self.t = torch.zeros(weight.shape[0], dtype=torch.float64)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.w.grad = None

    def step(self) -> None:
        with self.torch.no_grad():
            grad = self.w.grad.coalesce()
            idx, g = grad.indices()[0], grad.values()
            self.t[idx] += 1
            t = self.t[idx]
            corr2 = self.torch.sqrt(1 - self.b2**t)
            lr_t = (self.lr * corr2 / (1 - self.b1**t)).float()[:, None]
            m = self.b1 * self.m[idx] + (1 - self.b1) * g
            v = self.b2 * self.v[idx] + (1 - self.b2) * g * g
            self.m[idx], self.v[idx] = m, v
            self.w[idx] -= lr_t * m / (v.sqrt() + self.eps * corr2.float()[:, None])


def train_and_test(torch: Any, train: list, test: list, init: str, correction: str, seed: int, threads: int) -> float:
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    net = bench.torch_network(torch, seed)
    if init == "aps":
        aps_init(torch, net, seed)
    sparse = torch.optim.SparseAdam([net.emb.weight], lr=1e-3) if correction == "step" else RowAdam(torch, net.emb.weight)
    dense = torch.optim.Adam(net.fcs.parameters(), lr=1e-3)
    for ids, dense_x, labels in train:
        loss = F.cross_entropy(net(ids, dense_x), labels)
        sparse.zero_grad(set_to_none=True)
        dense.zero_grad(set_to_none=True)
        loss.backward()
        sparse.step()
        dense.step()
    with torch.no_grad():
        probs = [torch.softmax(net(torch.from_numpy(i), torch.from_numpy(d)), 1)[:, 1].numpy() for i, d, _ in test]
    return float(bench.test_metrics(np.concatenate(probs), np.concatenate([b[2] for b in test]))["auc"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-lines", type=bench.positive_int, default=200_000, help="default: %(default)s")
    parser.add_argument("--test-lines", type=bench.positive_int, default=50_000, help="default: %(default)s")
    parser.add_argument("--train-files", type=bench.positive_int, default=2, help="default: %(default)s")
    parser.add_argument("--scale", choices=["full", "small"], default="full", help="make_data.py --scale (default: full)")
    parser.add_argument("--seed", type=int, default=0, help="the data's seed (default: 0)")
    parser.add_argument("--init-seeds", default="0,1,2", help="init seeds, comma-separated (default: %(default)s)")
    parser.add_argument("--threads", type=bench.positive_int, default=2, help="torch.set_num_threads (default: 2)")
    parser.add_argument("--data", metavar="DIR", help="generate the data here (or reuse it) instead of a temp dir")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "ctr_step_ablation.json"), help="default: %(default)s")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print(bench.INSTALL_HINT, file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.init_seeds.split(",")]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aps-ctr-ablation-") as tmp:
        data = Path(args.data).resolve() if args.data else Path(tmp) / "data"
        meta = bench.make_data(data, args)
        train = [(torch.from_numpy(i), torch.from_numpy(d), torch.from_numpy(y.astype(np.int64)))
                 for i, d, y in bench.parse_batches(bench.data_files(data / "train_data"))]
        test = bench.parse_batches(bench.data_files(data / "test_data"))
    rows = []
    for init in ("aps", "torch"):
        for correction in ("step", "row"):
            aucs = [train_and_test(torch, train, test, init, correction, s, args.threads) for s in seeds]
            rows.append({"init": init, "bias_correction": correction, "seeds": seeds, "auc": aucs,
                         "mean": statistics.mean(aucs)})
            print(f"init {init}, {correction}: {', '.join(f'{a:.4f}' for a in aucs)}", file=sys.stderr)
    lines = [
        f"CTR-DNN in PyTorch {torch.__version__}, {len(train)} batches of <= {bench.BATCH} "
        f"({args.train_lines:,} lines, scale {args.scale}, data seed {args.seed}), one epoch; test AUC on "
        f"{args.test_lines:,} lines; Bayes AUC {meta['bayes_auc_test']:.4f}",
        "",
        f"| init | SparseAdam (aps `step`), seeds {args.init_seeds} | mean | per-row lazy Adam (aps `row`) | mean |",
        "|---|---|---:|---|---:|",
    ]
    for init in ("aps", "torch"):
        step, row = (r for r in rows if r["init"] == init)
        lines.append(f"| {init} | {', '.join(f'{a:.4f}' for a in step['auc'])} | {step['mean']:.4f} "
                     f"| {', '.join(f'{a:.4f}' for a in row['auc'])} | {row['mean']:.4f} |")
    print("\n".join(lines))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "machine": bench.machine_info(),
                               "args": vars(args), "torch": torch.__version__, "rows": rows,
                               "bayes_auc_test": meta["bayes_auc_test"], "seconds": time.perf_counter() - started},
                              indent=2) + "\n")
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
