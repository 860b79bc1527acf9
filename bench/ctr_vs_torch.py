#!/usr/bin/env python3
"""CTR-DNN (or wide&deep): aps against PyTorch on the CPU, same network, data, batches and optimizer.

* data: ``examples/ctr_dnn/make_data.py`` (synthetic Criteo lines from a known model, so the
  Bayes-optimal test AUC is known; ``--shape`` default, longtail or drift), generated once per run
  into a temporary directory; or, with ``--adult DIR``, the Adult census set that
  ``examples/wide_deep/prepare_adult.py`` wrote there (its meta.json gives the columns);
* aps: ``aps-local 1x1 -- --model ctr_dnn --workers 2`` (1 pserver + 1 trainer with 2 compute
  workers) in the CTR models' default mode, hybrid (``--mode`` names another), run through its
  API ``aps.LocalCluster`` in this process, ``--epochs`` epochs (default 1), then
  ``examples/<model>/infer.py`` on the test files;
* PyTorch: the same network in ``torch.nn`` with ``torch.set_num_threads(2)``, trained in its
  own process on the arrays aps's own parser (``aps.models.criteo.CriteoFormat``) makes from the
  same files, cut into the same batches (1 MiB chunks, batches of ``--batch-size`` lines within a
  chunk, as aps's workers do), files in the same sorted order, the same epochs; then the test files.

The network (aps/models/ctr_dnn/model.py): one 1,000,001 x 10 embedding, Uniform(-r, r) init
(r: the model's ``init_range``, 0.05, or ``--init-range``; the reference's is 1.0),
looked up for each of the 26 slots; the 260 values concatenated with the 13 dense features ->
FC 400 ReLU x 3 -> FC 2, softmax cross-entropy, mean over the batch; FC weights
Normal(0, 1/sqrt(fan_in)), biases 0; Adam lr 0.001, betas 0.9/0.999, eps 1e-8 on everything.
aps updates the embedding with lazy Adam (only the batch's rows, each with its own step count);
PyTorch gets ``nn.Embedding(sparse=True)`` + ``torch.optim.SparseAdam`` for it (also lazy: only
the batch's rows, but bias correction uses one step count for the whole table) and
``torch.optim.Adam`` for the FC layers.

``--model wide_deep`` (aps/models/wide_deep/model.py): a dim-1 weight per slot value summed over
the slots plus a linear term on the dense features and a bias (all zero at start), plus a deep
part: a dim-8 embedding, Uniform(-0.1, 0.1), concatenated with the dense features -> FC 400 ReLU
x 3 -> FC 1; logit = wide + deep, sigmoid cross-entropy, mean over the batch; PyTorch's has the
same shape, SparseAdam on both embeddings and Adam on the rest.

What is timed:

* train loop examples/s - aps: the epoch's ``examples_per_s`` from log/trainer.0.metrics.jsonl
  (its workers parse the text inside the epoch); PyTorch: the loop over the pre-parsed batches
  alone (forward, backward, both optimizer steps). ``loop + parse`` adds PyTorch's parse time,
  which is the like-for-like number against aps's epoch;
* whole run, as the user waits - aps: the launcher's run (the pserver's and the trainer's
  process start-up, epoch, checkpoint save, shut-down; the aps-local command adds only its own
  interpreter's start to that); PyTorch: its training process (interpreter start-up, ``import
  torch``, parsing, loop, saving the model and optimizer state like aps's checkpoint).
  Evaluation is not in either.

Test metrics are computed the same way for both: exact AUC (``sklearn.metrics.roc_auc_score``)
and mean logloss (``aps.metrics.logloss``) over every test line; infer.py's own (bucketed) AUC for
aps is in the JSON too. Other processes' CPU use during each run is measured from /proc/stat and
a run it disturbed is marked (!).

PyTorch is a bench-only dependency, not in pyproject: ``.venv/bin/pip install torch==2.13.0``.

    .venv/bin/python bench/ctr_vs_torch.py [--train-lines 1000000] [--test-lines 100000]
        [--scale full] [--shape default] [--mode hybrid] [--repeats 1] [--aps-extra "--no-prefetch"]
    .venv/bin/python bench/ctr_vs_torch.py --model wide_deep --adult data/adult --epochs 5 --batch-size 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import machine_busy_seconds  # bench/machine.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import aps  # noqa: E402
from aps.trainer.strategy import MODES  # noqa: E402

TORCH_VERSION = "2.13.0"
INSTALL_HINT = (
    f"PyTorch is needed for this benchmark (a bench-only dependency, not in pyproject): "
    f".venv/bin/pip install torch=={TORCH_VERSION}"
)
CHUNK_BYTES = 1 << 20  # aps-trainer's default --chunk-bytes: batches never cross a chunk
BATCH = 1000  # the CTR models' default batch_size
MODELS = ("ctr_dnn", "wide_deep")
FIRST_FC = {"ctr_dnn": "fc1.w", "wide_deep": "deep1.w"}  # a dense table: its step is the pserver's updates
BUSY_LOAD = 1.0  # 1-minute load average above this before starting: warn
NOISY_OTHER_CPU = 0.2  # other processes used more than this many cores during a run: mark it


# ----------------------------------------------------------------------------- machine


def own_cpu_seconds() -> float:
    """This process plus its reaped children (the launcher here reaps the roles, the trainer its workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class CpuMeter:
    """Wall time and CPU (in cores) of one run: ours and everything else's on the machine."""

    def __enter__(self) -> CpuMeter:
        self.t0 = time.perf_counter()
        self.own0 = own_cpu_seconds()
        self.m0 = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = max(1e-9, time.perf_counter() - self.t0)
        self.own_cpu = (own_cpu_seconds() - self.own0) / self.wall
        m1 = machine_busy_seconds()
        self.other_cpu = None if m1 is None or self.m0 is None else max(0.0, (m1 - self.m0) / self.wall - self.own_cpu)


def wait_quiet(limit_s: float, window: float = 2.0) -> tuple[float | None, float]:
    """Wait (up to ``limit_s``) until the machine's other processes use under NOISY_OTHER_CPU
    cores over a ``window``; returns (cores busy in the last window, seconds waited)."""
    started = time.perf_counter()
    told = False
    while True:
        m0 = machine_busy_seconds()
        if m0 is None:
            return None, 0.0
        time.sleep(window)
        busy = max(0.0, (machine_busy_seconds() - m0) / window)
        waited = time.perf_counter() - started
        if busy < NOISY_OTHER_CPU or waited >= limit_s:
            if told:
                print(f"  {'quiet' if busy < NOISY_OTHER_CPU else 'still busy'} after {waited:.0f} s "
                      f"({busy:.2f} cores busy)", file=sys.stderr)
            return busy, waited
        if not told:
            print(f"waiting up to {limit_s:.0f} s for other processes to stop ({busy:.2f} cores busy)", file=sys.stderr)
            told = True


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
        "platform": platform.platform(), "numpy": np.__version__,
    }


# ----------------------------------------------------------------------------- setup


def setup(args: argparse.Namespace) -> dict:
    """What both systems must agree on: model, columns (meta.json), batch size, epochs, init."""
    meta = str(Path(args.adult).resolve() / "meta.json") if args.adult else None
    init_range = args.init_range if args.init_range is not None else default_init_range(args.model)
    model_args = [f"batch_size={args.batch_size}", f"init_range={init_range}", *([f"meta={meta}"] if meta else [])]
    return {"model": args.model, "meta": meta, "batch": args.batch_size, "epochs": args.epochs,
            "init_range": init_range, "model_args": model_args}


def default_init_range(model: str) -> float:
    """The model's own default embedding init half-width offline (both systems start from it)."""
    from aps.models import load_model_class

    return float(load_model_class(model).offline_init_range)


def default_spec() -> dict:
    """CTR-DNN on Criteo-layout data with the model's defaults (bench/ctr_step_ablation.py's)."""
    return {"model": "ctr_dnn", "meta": None, "init_range": default_init_range("ctr_dnn")}


def criteo_format(meta: str | None) -> Any:
    from aps.models.criteo import CriteoFormat

    return CriteoFormat() if meta is None else CriteoFormat.from_meta(meta)


# ----------------------------------------------------------------------------- data


def make_data(out: Path, args: argparse.Namespace) -> dict:
    """Write (or reuse, when meta.json says it is the same) the data set; returns meta.json."""
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        have = (meta.get("train_lines"), meta.get("test_lines"), meta.get("scale"), meta.get("seed"),
                len(meta.get("train_files", [])), meta.get("shape", "default"))
        same = have == (args.train_lines, args.test_lines, args.scale, args.seed, args.train_files, args.shape)
        if same:
            print(f"reusing the data in {out}", file=sys.stderr)
            return meta
    cmd = [
        sys.executable, str(ROOT / "examples" / "ctr_dnn" / "make_data.py"), "--out", str(out),
        "--train-lines", str(args.train_lines), "--test-lines", str(args.test_lines),
        "--train-files", str(args.train_files), "--scale", args.scale, "--seed", str(args.seed),
        "--shape", args.shape,
    ]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.loads(meta_path.read_text())


def data_files(directory: Path) -> list[str]:
    from aps.trainer.files import expand_inputs

    return expand_inputs([str(directory)])  # the trainer's order: sorted


def parse_batches(files: list[str], meta: str | None = None, batch: int = BATCH
                  ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(ids, dense, labels) per batch, cut exactly as aps's workers cut them: each file read in
    CHUNK_BYTES line-aligned chunks re-cut into whole batches (the file's last one short), each
    chunk parsed by CriteoFormat and split into ``batch`` lines."""
    from aps.trainer.reader import read_chunks, whole_batches

    async def chunks(path: str) -> list:
        return [c async for c in whole_batches(read_chunks(path, CHUNK_BYTES), batch)]

    fmt = criteo_format(meta)
    out = []
    for path in files:
        for chunk in asyncio.run(chunks(path)):
            rec = fmt.parse(chunk)
            for lo in range(0, rec.n, batch):
                hi = min(rec.n, lo + batch)
                out.append((rec.ids[lo:hi], rec.dense[lo:hi], rec.labels[lo:hi]))
    return out


# ----------------------------------------------------------------------------- PyTorch


def torch_network(torch: Any, seed: int, spec: dict | None = None) -> Any:
    """CTR-DNN or wide&deep in torch.nn, initialised as aps initialises it (different random numbers).
    Both have ``emb`` (and wide&deep ``wide``) as sparse embeddings, the rest in ``dense_parameters``."""
    nn = torch.nn
    spec = spec or default_spec()
    fmt = criteo_format(spec["meta"])

    def fc_stack(widths: list[int]) -> Any:
        fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        with torch.no_grad():
            for fc in fcs:
                fc.weight.normal_(0.0, 1.0 / fc.in_features ** 0.5)
                fc.bias.zero_()
        return fcs

    def deep(fcs: Any, x: Any) -> Any:
        for fc in fcs[:-1]:
            x = torch.relu(fc(x))
        return fcs[-1](x)

    class CtrDnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(fmt.buckets, 10, sparse=True)
            with torch.no_grad():
                self.emb.weight.uniform_(-spec["init_range"], spec["init_range"])
            self.fcs = fc_stack([fmt.slots * 10 + fmt.dense, 400, 400, 400, 2])

        def sparse_parameters(self) -> list:
            return [self.emb.weight]

        def dense_parameters(self) -> Any:
            return self.fcs.parameters()

        def forward(self, ids: Any, dense: Any) -> Any:
            return deep(self.fcs, torch.cat([self.emb(ids).reshape(ids.shape[0], -1), dense], dim=1))

    class WideDeep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wide = nn.Embedding(fmt.buckets, 1, sparse=True)
            self.emb = nn.Embedding(fmt.buckets, 8, sparse=True)
            self.linear = nn.Linear(max(fmt.dense, 1), 1)
            with torch.no_grad():
                self.wide.weight.zero_()
                self.emb.weight.uniform_(-spec["init_range"], spec["init_range"])
                self.linear.weight.zero_()
                self.linear.bias.zero_()
            self.fcs = fc_stack([fmt.slots * 8 + fmt.dense, 400, 400, 400, 1])

        def sparse_parameters(self) -> list:
            return [self.wide.weight, self.emb.weight]

        def dense_parameters(self) -> list:
            return [*self.linear.parameters(), *self.fcs.parameters()]

        def forward(self, ids: Any, dense: Any) -> Any:
            x = torch.cat([self.emb(ids).reshape(ids.shape[0], -1), dense], dim=1)
            return deep(self.fcs, x)[:, 0] + self.wide(ids).sum(dim=(1, 2)) + self.linear(dense)[:, 0]

    torch.manual_seed(seed)
    return CtrDnn() if spec["model"] == "ctr_dnn" else WideDeep()


def torch_loss(F: Any, spec: dict, logits: Any, labels: Any) -> Any:
    """The models' losses: softmax over 2 logits (CTR-DNN), sigmoid of one (wide&deep); batch mean."""
    if spec["model"] == "ctr_dnn":
        return F.cross_entropy(logits, labels)
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def torch_probs(torch: Any, spec: dict, logits: Any) -> Any:
    return torch.softmax(logits, dim=1)[:, 1] if spec["model"] == "ctr_dnn" else torch.sigmoid(logits)


def torch_train_child(cfg: dict) -> int:
    """The PyTorch training process: its wall time (start to exit) is PyTorch's whole run."""
    t_start = time.perf_counter()
    import torch
    import torch.nn.functional as F

    t_import = time.perf_counter()
    torch.set_num_threads(cfg["threads"])
    spec = cfg["spec"]
    batches = parse_batches(cfg["files"], spec["meta"], spec["batch"])
    tensors = [
        (torch.from_numpy(ids), torch.from_numpy(dense), torch.from_numpy(labels.astype(np.int64)))
        for ids, dense, labels in batches
    ]
    t_parse = time.perf_counter()
    net = torch_network(torch, cfg["seed"], spec)
    sparse_opt = torch.optim.SparseAdam(net.sparse_parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-8)
    dense_opt = torch.optim.Adam(net.dense_parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-8)
    loss_sum = 0.0
    examples = 0
    t_loop = time.perf_counter()  # from t_parse: building the network and the optimizers
    for ids, dense, labels in [t for _epoch in range(spec["epochs"]) for t in tensors]:
        logits = net(ids, dense)
        loss = torch_loss(F, spec, logits, labels)
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        loss_sum += loss.item() * labels.shape[0]
        examples += labels.shape[0]
    t_loop_end = time.perf_counter()
    torch.save({"model": net.state_dict(), "sparse_adam": sparse_opt.state_dict(), "adam": dense_opt.state_dict()},
               cfg["save"])
    t_end = time.perf_counter()
    print(json.dumps({
        "examples": examples // spec["epochs"], "steps": len(tensors), "adam_steps": len(tensors) * spec["epochs"],
        "loss": loss_sum / max(1, examples),
        "import_s": t_import - t_start, "parse_s": t_parse - t_import, "setup_s": t_loop - t_parse,
        "loop_s": t_loop_end - t_loop,
        "save_s": t_end - t_loop_end, "threads": torch.get_num_threads(),
    }))
    return 0


def run_torch(files: list[str], work: Path, args: argparse.Namespace) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    cfg = {"files": files, "threads": args.threads, "seed": args.seed, "save": str(work / "model.pt"), "spec": setup(args)}
    (work / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-child", str(work / "config.json")]
    with CpuMeter() as meter:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"PyTorch training failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    seen = r["examples"] * cfg["spec"]["epochs"]
    r.update({
        "loop_examples_per_s": seen / r["loop_s"],
        "loop_parse_examples_per_s": seen / (r["loop_s"] + r["parse_s"]),
        "wall_s": meter.wall, "wall_examples_per_s": seen / meter.wall,
        "own_cpu": meter.own_cpu, "other_cpu": meter.other_cpu,
    })
    return r


def torch_predict(save: Path, batches: list, threads: int, spec: dict | None = None) -> np.ndarray:
    import torch

    torch.set_num_threads(threads)
    spec = spec or default_spec()
    net = torch_network(torch, 0, spec)
    net.load_state_dict(torch.load(save, weights_only=True)["model"])
    net.eval()
    probs = []
    with torch.no_grad():
        for ids, dense, _labels in batches:
            logits = net(torch.from_numpy(ids), torch.from_numpy(dense))
            probs.append(torch_probs(torch, spec, logits).numpy())
    return np.concatenate(probs)


# ----------------------------------------------------------------------------- aps


def run_aps(data: Path, work: Path, args: argparse.Namespace) -> dict:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    spec = setup(args)
    model_args = [a for arg in spec["model_args"] for a in ("--model-arg", arg)]
    trainer_args = [
        "--model", args.model, "--data", str(data / "train_data"), "--epochs", str(args.epochs),
        "--workers", str(args.workers), "--save-dir", str(work / "model"), "--print-period", "5", *model_args,
        *shlex.split(args.aps_extra),
    ]
    cluster = aps.LocalCluster(1, 1, trainer_args, mode=args.mode, log_dir=work / "log", cwd=work)
    with CpuMeter() as meter:
        result = cluster.run()
    if not result.ok:
        role = result.failed[0] if result.failed else result.roles[-1]
        tail = "\n".join(role.log_tail(30))
        raise RuntimeError(f"aps failed (exit {result.code}{', ' + result.reason if result.reason else ''}): "
                           f"{role.name} {role.state}; its log ({role.log_path}) ends:\n{tail}")
    records = [json.loads(line) for line in (work / "log" / "trainer.0.metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r.get("event") == "epoch"]
    epoch = epochs[-1]
    mode = f" --mode {args.mode}" if args.mode else ""
    return {
        "command": f"aps-local 1x1{mode} -- {shlex.join(trainer_args)}  (run as aps.LocalCluster)",
        "examples": epoch["examples"], "steps": epoch["steps"],
        "loss": epoch["loss"], "train_auc": epoch["auc"], "epoch_s": sum(e["seconds"] for e in epochs),
        "loop_examples_per_s": statistics.mean(e["examples_per_s"] for e in epochs), "wait_share": epoch["wait_share"],
        "wall_s": meter.wall, "wall_examples_per_s": sum(e["examples"] for e in epochs) / meter.wall,
        "own_cpu": meter.own_cpu, "other_cpu": meter.other_cpu,
        "checkpoint": epoch.get("saved") or str(work / "model" / f"epoch_{args.epochs - 1}"),
    }


def aps_adam_steps(checkpoint: str, model: str = "ctr_dnn") -> int | None:
    """How many times the pserver applied Adam to the first FC weights (pushes after merging), from the manifest."""
    try:
        manifest = json.loads(next(Path(checkpoint).glob("shard-*/manifest.json")).read_text())
        return int(manifest["tables"][FIRST_FC[model]]["blocks"][0]["step"])
    except (StopIteration, OSError, KeyError, IndexError, ValueError):
        return None


def aps_infer(checkpoint: str, data: Path, work: Path, spec: dict) -> dict:
    """infer.py as a user runs it (its AUC is bucketed, as the reference's)."""
    out = work / "infer.json"
    cmd = [sys.executable, str(ROOT / "examples" / spec["model"] / "infer.py"), "--checkpoint", checkpoint,
           "--data", str(data / "test_data"), "--json", str(out),
           *(a for arg in spec["model_args"] for a in ("--model-arg", arg))]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def aps_predict(checkpoint: str, files: list[str], spec: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """aps's test predictions (its own forward kernel on the checkpoint) for the exact AUC."""
    from aps.models import load_model_class
    from aps.models.ctr_eval import load_params, predict
    from aps.trainer.model import WorkerContext

    spec = spec or {"model": "ctr_dnn", "model_args": []}
    net = load_model_class(spec["model"])(**dict(arg.split("=", 1) for arg in spec["model_args"]))
    params = load_params(net, checkpoint)
    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0))

    async def collect() -> list:
        return [(p.copy(), y.copy()) async for p, y in predict(net, params, files, ctx)]

    pairs = asyncio.run(collect())
    return np.concatenate([p for p, _ in pairs]), np.concatenate([y for _, y in pairs])


# ----------------------------------------------------------------------------- report


def test_metrics(probs: np.ndarray, labels: np.ndarray) -> dict:
    from sklearn.metrics import roc_auc_score

    from aps.metrics import logloss

    return {"auc": float(roc_auc_score(labels, probs)), "logloss": logloss(probs, labels), "test_examples": int(labels.size)}


def summarize(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def fmt_stat(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    s = summarize(values)
    return f"{format(s['median'], fmt)} ({format(s['min'], fmt)}-{format(s['max'], fmt)})"


def noisy(runs: list[dict]) -> bool:
    return any((r.get("other_cpu") or 0.0) > NOISY_OTHER_CPU for r in runs)


def table(aps_name: str, torch_name: str, aps_runs: list[dict], torch_runs: list[dict], bayes: float | None) -> str:
    def col(runs: list[dict], key: str) -> list[float]:
        return [r[key] for r in runs]

    t_loop = statistics.median(col(torch_runs, "loop_examples_per_s"))
    t_loop_parse = statistics.median(col(torch_runs, "loop_parse_examples_per_s"))
    t_wall = statistics.median(col(torch_runs, "wall_examples_per_s"))
    t_auc = statistics.median(col(torch_runs, "auc"))
    lines = [
        "| system | train loop ex/s | loop + parse ex/s | whole run s | whole run ex/s | test AUC | AUC - torch "
        "| test logloss | Bayes AUC | Adam steps (FC) | aps wait_share | other CPU (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in ((torch_name, torch_runs), (aps_name, aps_runs)):
        is_aps = runs is aps_runs
        mark = " (!)" if noisy(runs) else ""
        loop = fmt_stat(col(runs, "loop_examples_per_s"), ",.0f")
        loop_parse = loop if is_aps else fmt_stat(col(runs, "loop_parse_examples_per_s"), ",.0f")
        wall = f"{fmt_stat(col(runs, 'wall_s'), '.1f')} | {fmt_stat(col(runs, 'wall_examples_per_s'), ',.0f')}"
        d_auc = "-" if not is_aps else f"{statistics.median(col(runs, 'auc')) - t_auc:+.4f}"
        wait = fmt_stat(col(runs, "wait_share"), ".2f") if is_aps else "-"
        other = fmt_stat([r["other_cpu"] or 0.0 for r in runs], ".2f")
        steps = "?" if any(r.get("adam_steps") is None for r in runs) else fmt_stat(col(runs, "adam_steps"), ".0f")
        lines.append(
            f"| {name}{mark} | {loop} | {loop_parse} | {wall} | {fmt_stat(col(runs, 'auc'), '.4f')} | {d_auc} "
            f"| {fmt_stat(col(runs, 'logloss'), '.4f')} | {'-' if bayes is None else format(bayes, '.4f')} "
            f"| {steps} | {wait} | {other} |"
        )
    a_loop = statistics.median(col(aps_runs, "loop_examples_per_s"))
    a_wall = statistics.median(col(aps_runs, "wall_examples_per_s"))
    lines.append(
        f"| **aps / PyTorch** | **{a_loop / t_loop:.2f}x** | {a_loop / t_loop_parse:.2f}x | | {a_wall / t_wall:.2f}x "
        f"| | | | | | | |"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def verdict(aps_runs: list[dict], torch_runs: list[dict]) -> str:
    """The two targets: aps at >= 1.0x PyTorch's loop examples/s, test AUC within 0.002 of PyTorch's."""
    ratio = statistics.median(r["loop_examples_per_s"] for r in aps_runs) / statistics.median(
        r["loop_examples_per_s"] for r in torch_runs)
    diff = statistics.median(r["auc"] for r in aps_runs) - statistics.median(r["auc"] for r in torch_runs)
    return (f"Targets: aps train loop at {ratio:.2f}x PyTorch's (>= 1.0x: {'met' if ratio >= 1.0 else 'NOT met'}); "
            f"test AUC {diff:+.4f} from PyTorch's (within 0.002: {'met' if abs(diff) <= 0.002 else 'NOT met'}).")


def positive_int(text: str) -> int:
    value = int(text.replace(",", "").replace("_", ""))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-lines", type=positive_int, default=1_000_000, help="default: %(default)s")
    parser.add_argument("--test-lines", type=positive_int, default=100_000, help="default: %(default)s")
    parser.add_argument("--train-files", type=positive_int, default=8, help="default: %(default)s")
    parser.add_argument("--scale", choices=["full", "small"], default="full", help="make_data.py --scale (default: full)")
    parser.add_argument("--shape", choices=["default", "longtail", "drift"], default="default",
                        help="make_data.py --shape (default: %(default)s)")
    parser.add_argument("--adult", metavar="DIR",
                        help="train and test on the Adult set prepare_adult.py wrote in DIR instead of generated data")
    parser.add_argument("--model", choices=MODELS, default="ctr_dnn", help="default: %(default)s")
    parser.add_argument("--mode", choices=MODES,
                        help="aps's mode (default: the model's own, hybrid)")
    parser.add_argument("--epochs", type=positive_int, default=1, help="default: %(default)s")
    parser.add_argument("--batch-size", type=positive_int, default=BATCH, help="default: %(default)s")
    parser.add_argument("--init-range", type=float, metavar="R",
                        help="embedding init half-width for both systems (default: the model's own)")
    parser.add_argument("--seed", type=int, default=0, help="data seed and PyTorch's init seed (default: 0)")
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="runs of each system (alternating which goes first); >1 reports median (min-max)")
    parser.add_argument("--aps-extra", default="", metavar="ARGS",
                        help="extra aps-trainer arguments, one shell-quoted string, e.g. "
                             '"--max-merge-var-num 8 --send-queue-size 8" (a single flag: --aps-extra=--flag)')
    parser.add_argument("--workers", type=positive_int, default=2, help="aps compute workers (default: 2)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch.set_num_threads (default: 2)")
    parser.add_argument("--wait-quiet", type=float, default=120.0, metavar="SECONDS",
                        help="before each run, wait up to this long for other processes to leave the cores idle "
                             "(0: do not wait; default: %(default)s)")
    parser.add_argument("--data", metavar="DIR",
                        help="generate the data here (or reuse it if its meta.json matches) instead of a temp dir")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "ctr_vs_torch.json"), help="default: %(default)s")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (data, models, logs)")
    parser.add_argument("--torch-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_child:
        return torch_train_child(json.loads(Path(args.torch_child).read_text()))

    try:
        import torch
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("scikit-learn is needed for the test AUC: .venv/bin/pip install scikit-learn", file=sys.stderr)
        return 2
    if torch.__version__.split("+")[0] != TORCH_VERSION:
        print(f"note: torch {torch.__version__} is installed; the README's numbers used {TORCH_VERSION}", file=sys.stderr)

    load = os.getloadavg()
    warnings = []
    if load[0] > BUSY_LOAD:
        warnings.append(f"WARNING: the machine is busy (1-minute load average {load[0]:.2f} > {BUSY_LOAD} on "
                        f"{os.cpu_count()} cores before starting); numbers will be pessimistic and noisy")
        print(warnings[-1], file=sys.stderr)

    tmp = Path(tempfile.mkdtemp(prefix="aps-ctr-vs-torch-"))
    started = time.perf_counter()
    try:
        data = Path(args.adult or args.data or tmp / "data").resolve()
        t0 = time.perf_counter()
        meta = json.loads((data / "meta.json").read_text()) if args.adult else make_data(data, args)
        data_s = time.perf_counter() - t0
        spec = setup(args)
        train_files = data_files(data / "train_data")
        test_files = data_files(data / "test_data")
        test_batches = parse_batches(test_files, spec["meta"], spec["batch"])
        test_labels = np.concatenate([b[2] for b in test_batches])

        aps_runs: list[dict] = []
        torch_runs: list[dict] = []
        for rep in range(args.repeats):
            order = ("aps", "torch") if rep % 2 == 0 else ("torch", "aps")
            for system in order:
                work = tmp / f"{system}{rep}"
                busy_before, waited = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else (None, 0.0)
                load_before = os.getloadavg()[0]
                if system == "aps":
                    r = run_aps(data, work, args)
                    r["infer"] = aps_infer(r["checkpoint"], data, work, spec)
                    r["adam_steps"] = aps_adam_steps(r["checkpoint"], args.model)
                    probs, labels = aps_predict(r["checkpoint"], test_files, spec)
                    if not np.array_equal(labels, test_labels):
                        raise RuntimeError("aps and PyTorch saw different test labels")
                    aps_runs.append(r)
                else:
                    r = run_torch(train_files, work, args)
                    probs = torch_predict(work / "model.pt", test_batches, args.threads, spec)
                    torch_runs.append(r)
                r.update(test_metrics(probs, test_labels))
                r.update({"load_before": load_before, "busy_cores_before": busy_before, "quiet_wait_s": waited})
                print(f"{system} run {rep + 1}/{args.repeats}: {r['loop_examples_per_s']:,.0f} ex/s in the loop, "
                      f"whole run {r['wall_s']:.1f} s, test AUC {r['auc']:.4f}, other CPU {r['other_cpu'] or 0:.2f} cores",
                      file=sys.stderr)
        if warnings and args.wait_quiet > 0 and all(
            (r["busy_cores_before"] or 0.0) < NOISY_OTHER_CPU for r in aps_runs + torch_runs
        ):  # the busy start is history: every run began on idle cores
            waited = sum(r["quiet_wait_s"] for r in aps_runs + torch_runs)
            warnings[0] = (f"note: the machine was busy at the start (1-minute load average {load[0]:.2f}); "
                           f"the runs waited {waited:.0f} s in all for idle cores before starting")
        if aps_runs[0]["examples"] != torch_runs[0]["examples"] or aps_runs[0]["steps"] != torch_runs[0]["steps"]:
            warnings.append(f"WARNING: aps trained {aps_runs[0]['examples']} examples in {aps_runs[0]['steps']} steps, "
                            f"PyTorch {torch_runs[0]['examples']} in {torch_runs[0]['steps']}")
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    bayes = meta.get("bayes_auc_test")  # None on real data (Adult)
    extra_mode = shlex.split(args.aps_extra)  # a --mode in the extra arguments wins, as in aps-trainer
    named = [extra_mode[i + 1] for i, a in enumerate(extra_mode[:-1]) if a == "--mode"]
    mode = named[-1] if named else args.mode
    aps_name = f"aps 1x1 {mode or 'hybrid (default)'}, {args.workers} workers"
    if args.aps_extra:
        aps_name += f", with `{args.aps_extra}`"
    torch_name = f"PyTorch {torch.__version__}, {args.threads} threads"
    if any(noisy(runs) for runs in (aps_runs, torch_runs)):
        warnings.append(f"WARNING: other processes used more than {NOISY_OTHER_CPU} cores during a run marked (!): "
                        "rerun on a quiet machine (PyTorch's OpenMP threads slow down badly when another process takes a core)")
    examples = aps_runs[0]["examples"]
    steps = aps_runs[0]["steps"]
    out_table = table(aps_name, torch_name, aps_runs, torch_runs, bayes)
    parse_s = statistics.median(r["parse_s"] for r in torch_runs)
    lines = [
        "",
        *warnings,
        f"{args.model}, {args.epochs} epoch(s) over {examples:,} train lines ("
        + (f"Adult, {args.adult}" if args.adult else
           f"{args.train_files} files, scale {args.scale}, shape {args.shape}, seed {args.seed}")
        + f", init seed {args.seed}) in {steps} batches of <= {args.batch_size}, test on {len(test_labels):,} lines; {os.cpu_count()} cores; "
        f"{args.repeats} run(s) each" + (" (median (min-max))" if args.repeats > 1 else ""),
        "",
        out_table,
        "",
        verdict(aps_runs, torch_runs),
        "",
        f"Notes: same network, init distributions, data, batches (1 MiB chunks, batches of {args.batch_size} within a chunk) and "
        "file order; Adam lr 0.001 (0.9/0.999, eps 1e-8). aps: lazy Adam on the pserver for the embedding (per-row "
        "step count), Adam for the FC tables; in hybrid mode (the default) the dense part gets one averaged update per "
        "step and the sparse rows run asynchronously, a worker pulling the next batch's rows while the current one "
        "computes; async mode merges up to --max-merge-var-num queued batches into one push (one Adam step: "
        "'Adam steps (FC)' counts the pserver's applications). PyTorch: "
        "nn.Embedding(sparse=True) + torch.optim.SparseAdam (lazy too, one step count per table) and torch.optim.Adam "
        "for the FC layers, one update per batch. Train loop ex/s: aps = the epoch's examples_per_s (its workers parse "
        f"inside the epoch); PyTorch = the loop over pre-parsed batches (parsing with aps's CriteoFormat took "
        f"{parse_s:.1f} s more, counted in 'loop + parse' and in the whole run). Whole run: the launcher's start of the "
        "pserver to its last exit (incl. checkpoint save) vs the PyTorch process start to exit (import, parse, loop, save model + optimizer "
        "state). Test AUC: sklearn roc_auc_score over all test lines for both; logloss: aps.metrics.logloss.",
    ]
    print("\n".join(lines))

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_info(), "load_avg_before": load,
        "warnings": warnings, "args": {k: v for k, v in vars(args).items() if k != "torch_child"},
        "torch": {"version": torch.__version__, "threads": args.threads, "mkldnn": torch.backends.mkldnn.is_available()},
        "data": {"bayes_auc_test": bayes, "bayes_logloss_test": meta.get("bayes_logloss_test"),
                 "train_examples": examples, "steps": steps, "test_examples": int(len(test_labels)), "seconds": data_s},
        "aps": {"name": aps_name, "runs": aps_runs},
        "pytorch": {"name": torch_name, "runs": torch_runs},
        "ratio": {
            "loop_examples_per_s": statistics.median(r["loop_examples_per_s"] for r in aps_runs)
            / statistics.median(r["loop_examples_per_s"] for r in torch_runs),
            "loop_vs_torch_loop_parse": statistics.median(r["loop_examples_per_s"] for r in aps_runs)
            / statistics.median(r["loop_parse_examples_per_s"] for r in torch_runs),
            "whole_run_examples_per_s": statistics.median(r["wall_examples_per_s"] for r in aps_runs)
            / statistics.median(r["wall_examples_per_s"] for r in torch_runs),
            "auc_difference": statistics.median(r["auc"] for r in aps_runs)
            - statistics.median(r["auc"] for r in torch_runs),
        },
        "summary": {
            system: {key: summarize([r[key] for r in runs]) for key in
                     ("loop_examples_per_s", "wall_s", "wall_examples_per_s", "auc", "logloss")}
            for system, runs in (("aps", aps_runs), ("pytorch", torch_runs))
        },
        "total_seconds": time.perf_counter() - started,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
