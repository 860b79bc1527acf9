#!/usr/bin/env python3
"""aps.torch's zoo through aps against the same module trained by plain PyTorch.

For every model (``--models``, names aps-trainer knows: ``deepfm``, ...) and data set
(``--data DIR``: ``meta.json`` + ``train_data/`` + ``test_data/``, as
``examples/wide_deep/prepare_adult.py``, ``prepare_ratings.py`` and ``examples/ctr_dnn/make_data.py``
write them) and seed:

* **aps**: ``aps-local 1x1 -- --model NAME --model-arg meta=... --model-arg seed=S --workers 2``
  with the model's defaults otherwise (hybrid, Adam 0.001, batch 1000, hash tables), run as
  ``aps.LocalCluster``; then its checkpoint scored by the model's own forward pass;
* **PyTorch**: the same module in one process with 2 threads (:func:`aps.torch.plain.plain_network`:
  each ``aps.torch.Embedding`` a ``torch.nn.Embedding(buckets, dim, sparse=True)`` over ids hashed
  modulo the data's buckets, drawn from the same init; ``SparseAdam`` + ``Adam`` at the same lr),
  fed batches of the model's ``batch_size`` lines, the lines of one aps update (1 MiB chunks re-cut
  into whole batches, the model's own batcher, so any layout the zoo reads: the Criteo one, or
  several labels and list columns for DIN and MMoE; aps's 2 workers each cut half of that in
  hybrid mode), aps's loss, the same epochs; its loop over pre-parsed batches is timed alone.

With ``--numba``, ``torch_ctr_dnn`` and ``torch_wide_deep`` are also compared with their numba twins
(``ctr_dnn``, ``wide_deep``) run through aps the same way with their own defaults: the torch port's
examples/s against the hand-written kernels' (a second table).

Test AUC (exact, sklearn) over every test line for both; examples/s of aps's epochs and whole run
(the launcher's start to exit) against PyTorch's bare loop and its whole process. A table per
data set and one JSON (``--json``). PyTorch comes with the ``torch`` extra.

    .venv/bin/python bench/torch_models.py --data data/adult --models deepfm --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ctr_vs_torch import CHUNK_BYTES, CpuMeter, data_files, test_metrics  # bench/ctr_vs_torch.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import aps  # noqa: E402

THREADS = 2
#: the numba model each torch port of a built-in network is compared with (``--numba``)
NUMBA_TWIN = {"torch_ctr_dnn": "ctr_dnn", "torch_wide_deep": "wide_deep"}


def model_args(meta: str, seed: int, *extra: str) -> list[str]:
    return [f"meta={meta}", f"seed={seed}", *extra]


def run_aps(name: str, data: Path, seed: int, epochs: int, work: Path, extra: Sequence[str] = ()) -> dict:
    """aps-local 1x1 with the model's defaults, and ``extra`` aps-trainer arguments after them
    (``--aps-args``); the test set scored from its last checkpoint."""
    from aps.models import build_model
    from aps.models.ctr_eval import load_params, predict
    from aps.trainer.model import WorkerContext

    meta = str(data / "meta.json")
    args = ["--model", name, *(a for arg in model_args(meta, seed) for a in ("--model-arg", arg)),
            "--data", str(data / "train_data"), "--epochs", str(epochs), "--workers", str(THREADS),
            "--save-dir", str(work / "model"), "--print-period", "0", *extra]
    cluster = aps.LocalCluster(1, 1, args, log_dir=work / "log", cwd=work)
    with CpuMeter() as meter:
        result = cluster.run()
    if not result.ok:
        role = result.failed[0] if result.failed else result.roles[-1]
        raise RuntimeError(f"aps failed: {role.name}:\n" + "\n".join(role.log_tail(30)))
    records = [json.loads(line) for line in (work / "log" / "trainer.0.metrics.jsonl").read_text().splitlines()]
    epochs_done = [r for r in records if r.get("event") == "epoch"]
    extra_model_args = [value for flag, value in zip(extra, extra[1:]) if flag == "--model-arg"]
    model = build_model(name, model_args(meta, seed, *extra_model_args))
    params = load_params(model, epochs_done[-1].get("saved") or str(work / "model" / f"epoch_{epochs - 1}"))
    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0))

    async def collect() -> list:
        return [(p.copy(), y.copy()) async for p, y in predict(model, params, data_files(data / "test_data"), ctx)]

    pairs = asyncio.run(collect())
    probs, labels = np.concatenate([p for p, _ in pairs]), np.concatenate([y for _, y in pairs])
    seen = sum(e["examples"] for e in epochs_done)
    return {**test_metrics(probs, labels), "loop_examples_per_s": seen / sum(e["seconds"] for e in epochs_done),
            "wall_s": meter.wall, "wall_examples_per_s": seen / meter.wall, "other_cpu": meter.other_cpu,
            "command": "aps-local 1x1 -- " + " ".join(args)}


def plain_batches(model: Any, files: Sequence[str]) -> list:
    """Batches of ``model.batch_size`` lines from ``files``, one aps update's (1 MiB chunks re-cut
    into whole batches, the model's batcher; ``model`` never shares its batch), as
    :class:`aps.torch.Features` for the plain network: ``model`` is built on fixed tables, so each
    key is an id modulo the data's buckets, a row of the plain tables."""
    from aps.torch.plain import plain_features
    from aps.trainer.model import WorkerContext
    from aps.trainer.reader import read_chunks, whole_batches

    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0))

    async def cut(path: str) -> list:
        return [b async for chunk in whole_batches(read_chunks(path, CHUNK_BYTES), model.batch_size)
                for b in model.batches(chunk, ctx)]

    return [plain_features(model, batch) for path in files for batch in asyncio.run(cut(path))]


def torch_child(config: str) -> int:
    """The PyTorch process: build, train, score; its wall time is PyTorch's whole run. The loss is
    aps's: binary cross-entropy summed over the batch's examples and tasks, over its examples."""
    t0 = time.perf_counter()
    cfg = json.loads(Path(config).read_text())
    import torch
    import torch.nn.functional as F

    from aps.models import build_model
    from aps.torch.plain import plain_network, plain_optimizers

    torch.set_num_threads(THREADS)
    model = build_model(cfg["model"], model_args(cfg["meta"], cfg["seed"], "table=fixed"))
    gen = torch.Generator().manual_seed(cfg["seed"])
    net = plain_network(model.network, model.format.buckets, generator=gen, padding=bool(model.meta.lists))
    opts = plain_optimizers(net, model.optimizer.lr)
    train = plain_batches(model, cfg["train"])
    test = plain_batches(model, cfg["test"])
    t_loop = time.perf_counter()
    for _ in range(cfg["epochs"]):
        for f in train:
            loss = F.binary_cross_entropy_with_logits(net(f), f.labels, reduction="sum") / f.batch_size
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()
            for o in opts:
                o.step()
    loop_s = time.perf_counter() - t_loop
    with torch.no_grad():
        logits = [net(f) for f in test]
        probs = np.concatenate([torch.sigmoid(z if z.ndim == 1 else z[:, 0]).numpy() for z in logits])
    labels = np.concatenate([(f.labels if f.labels.ndim == 1 else f.labels[:, 0]).numpy() for f in test])
    np.save(cfg["out"], np.stack([probs, labels]))
    seen = sum(f.batch_size for f in train) * cfg["epochs"]
    print(json.dumps({"loop_examples_per_s": seen / loop_s, "seen": seen, "process_s": time.perf_counter() - t0}))
    return 0


def run_torch(name: str, data: Path, seed: int, epochs: int, work: Path) -> dict:
    cfg = {"model": name, "meta": str(data / "meta.json"), "seed": seed, "epochs": epochs, "out": str(work / "torch.npy"),
           "train": data_files(data / "train_data"), "test": data_files(data / "test_data")}
    (work / "torch.json").write_text(json.dumps(cfg))
    with CpuMeter() as meter:
        proc = subprocess.run([sys.executable, __file__, "--torch-child", str(work / "torch.json")],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"PyTorch run failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    probs, labels = np.load(work / "torch.npy")
    return {**test_metrics(probs, labels), "loop_examples_per_s": r["loop_examples_per_s"], "wall_s": meter.wall,
            "wall_examples_per_s": r["seen"] / meter.wall, "other_cpu": meter.other_cpu}


def profile_step(name: str, data: Path, steps: int = 30) -> dict:
    """One worker's step, in this process with one torch thread: ``compute`` on batches of the
    data (rows and dense values made up, gradient buffers as the runtime's), split by cProfile into
    the network's forward pass, autograd's backward pass, and aps's own work around them
    (features, binding the rows and the replica, the loss, copying a hash table's rows' gradient)."""
    import cProfile
    import pstats

    import torch

    from aps.models import build_model
    from aps.trainer.model import Grads, Params, WorkerContext
    from aps.trainer.reader import read_chunks

    torch.set_num_threads(1)
    model = build_model(name, model_args(str(data / "meta.json"), 0))
    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0))

    async def first_batches() -> list:
        out: list = []
        async for chunk in read_chunks(data_files(data / "train_data")[0], 1 << 20):
            out.extend(model.batches(chunk, ctx))
            if len(out) >= steps:
                break
        return out[:steps]

    batches = asyncio.run(first_batches())
    rng = np.random.default_rng(0)
    dense = {t.name: (rng.standard_normal(t.shape) * 0.05).astype(np.float32) for t in model.dense_tables()}
    d_grads = {t.name: np.zeros(t.shape, np.float32) for t in model.dense_tables()}

    def inputs(batch) -> tuple:
        rows, grads = {}, {}
        for t in model.sparse_tables():  # a hash table's rows in batch order, its buffer with 2 statistics columns
            n = len(batch.sparse_ids[t.name])
            rows[t.name] = (rng.standard_normal((n, t.dim)) * 0.05).astype(np.float32)
            grads[t.name] = np.zeros((n, t.dim + 2), np.float32)[:, : t.dim]
        return Params(rows, dense), Grads(grads, d_grads)

    prepared = [inputs(b) for b in batches]
    for b, (p, g) in zip(batches[:3], prepared[:3]):
        model.compute(b, p, g)
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    for b, (p, g) in zip(batches, prepared):
        model.compute(b, p, g)
    profiler.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(profiler).stats  # (file, line, function) -> (calls, primitive, tottime, cumtime, callers)
    forward = sum(v[3] for (f, _, fn), v in stats.items() if fn == "forward" and "torch/nn" not in f and "aps/torch/embedding" not in f)
    backward = sum(v[3] for (_, _, fn), v in stats.items() if fn.startswith("<method 'run_backward'"))
    total = sum(v[3] for (f, _, fn), v in stats.items() if fn == "compute" and f.endswith("aps/torch/model.py"))
    n = len(batches)
    return {"model": name, "data": data.name, "steps": n, "batch": batches[0].examples,
            "step_ms": 1e3 * total / n, "forward_ms": 1e3 * forward / n, "backward_ms": 1e3 * backward / n,
            "aps_ms": 1e3 * (total - forward - backward) / n, "aps_share": (total - forward - backward) / total,
            "examples_per_s": sum(b.examples for b in batches) / wall}


def mean(runs: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in runs)


def spread(runs: list[dict], key: str, fmt: str) -> str:
    values = [r[key] for r in runs]
    text = format(statistics.mean(values), fmt)
    return text if len(values) == 1 else f"{text} ({format(min(values), fmt)}..{format(max(values), fmt)})"


def table(rows: list[dict]) -> str:
    lines = ["| data | model | PyTorch test AUC | aps test AUC | aps - PyTorch | PyTorch loop ex/s | aps epoch ex/s "
             "| aps epoch / PyTorch loop | aps whole run ex/s / PyTorch loop |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        a, t = row["aps"], row["torch"]
        lines.append(
            f"| {row['data']} | {row['model']} | {spread(t, 'auc', '.4f')} | {spread(a, 'auc', '.4f')} "
            f"| {mean(a, 'auc') - mean(t, 'auc'):+.4f} | {spread(t, 'loop_examples_per_s', ',.0f')} "
            f"| {spread(a, 'loop_examples_per_s', ',.0f')} | {mean(a, 'loop_examples_per_s') / mean(t, 'loop_examples_per_s'):.2f}x "
            f"| {mean(a, 'wall_examples_per_s') / mean(t, 'loop_examples_per_s'):.2f}x |")
    return "\n".join(lines)


def twin_table(rows: list[dict]) -> str:
    """The torch ports through aps against their numba twins through aps (``--numba``)."""
    lines = ["| data | torch model | numba model | torch test AUC | numba test AUC | torch epoch ex/s | numba epoch ex/s "
             "| torch / numba, epoch | torch / numba, whole run |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if not row.get("numba"):
            continue
        a, n = row["aps"], row["numba"]
        lines.append(
            f"| {row['data']} | {row['model']} | {NUMBA_TWIN[row['model']]} | {spread(a, 'auc', '.4f')} | {spread(n, 'auc', '.4f')} "
            f"| {spread(a, 'loop_examples_per_s', ',.0f')} | {spread(n, 'loop_examples_per_s', ',.0f')} "
            f"| {mean(a, 'loop_examples_per_s') / mean(n, 'loop_examples_per_s'):.2f}x "
            f"| {mean(a, 'wall_examples_per_s') / mean(n, 'wall_examples_per_s'):.2f}x |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-child":
        return torch_child(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", action="append", type=Path, required=True, help="a data directory (repeatable)")
    p.add_argument("--models", nargs="+", default=["deepfm"], help="zoo names (default: deepfm)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=5, help="default 5")
    p.add_argument("--json", type=Path)
    p.add_argument("--profile", action="store_true", help="profile one worker's step of each model instead")
    p.add_argument("--numba", action="store_true",
                   help=f"also run the numba twins of {', '.join(NUMBA_TWIN)} through aps ({', '.join(NUMBA_TWIN.values())})")
    p.add_argument("--aps-args", default="", metavar="ARGS",
                   help="more aps-trainer arguments for aps's runs, one string (e.g. '--max-staleness 0')")
    args = p.parse_args()
    run_aps_with = functools.partial(run_aps, extra=shlex.split(args.aps_args))
    if args.profile:
        profiles = [profile_step(name, data.resolve()) for data in args.data for name in args.models]
        print("| data | model | batch | step ms | network forward ms | backward ms | aps around them ms | aps share | examples/s, one thread |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in profiles:
            print(f"| {r['data']} | {r['model']} | {r['batch']} | {r['step_ms']:.2f} | {r['forward_ms']:.2f} | {r['backward_ms']:.2f} "
                  f"| {r['aps_ms']:.2f} | {r['aps_share']:.1%} | {r['examples_per_s']:,.0f} |")
        if args.json:
            args.json.write_text(json.dumps({"profiles": profiles}, indent=1))
        return 0
    rows = []
    for data in args.data:
        for name in args.models:
            row: dict[str, Any] = {"data": data.name, "model": name, "epochs": args.epochs, "aps": [], "torch": [], "numba": []}
            systems = [("torch", name, run_torch), ("aps", name, run_aps_with)]
            if args.numba and name in NUMBA_TWIN:
                systems.append(("numba", NUMBA_TWIN[name], run_aps_with))
            for seed in args.seeds:
                with tempfile.TemporaryDirectory(prefix="aps-torch-bench-") as tmp:
                    for system, model, run in systems:
                        work = Path(tmp) / system
                        work.mkdir()
                        r = run(model, data.resolve(), seed, args.epochs, work)
                        row[system].append({"seed": seed, **r})
                        print(f"  {data.name} {name} seed {seed} {system}: test AUC {r['auc']:.4f}, "
                              f"{r['loop_examples_per_s']:,.0f} ex/s", file=sys.stderr, flush=True)
            rows.append(row)
    print(table(rows))
    if any(row["numba"] for row in rows):
        print()
        print(twin_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
        print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
