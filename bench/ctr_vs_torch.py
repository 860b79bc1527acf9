#!/usr/bin/env python3
"""CTR-DNN: aps against PyTorch on the CPU, same network, data, batches and optimizer.

* data: ``examples/ctr_dnn/make_data.py`` (synthetic Criteo lines from a known model, so the
  Bayes-optimal test AUC is known), generated once per run into a temporary directory;
* aps: ``aps-local 1x1 --mode async -- --model ctr_dnn --workers 2`` (1 pserver + 1 trainer with
  2 compute workers), run through its API ``aps.LocalCluster`` in this process, one epoch, then ``examples/ctr_dnn/infer.py`` on the test files;
* PyTorch: the same network in ``torch.nn`` with ``torch.set_num_threads(2)``, trained in its
  own process on the arrays aps's own parser (``aps.models.criteo.CriteoFormat``) makes from the
  same files, cut into the same batches (1 MiB chunks, batches of 1000 lines within a chunk, as
  aps's workers do), files in the same sorted order, one epoch; then the test files.

The network (aps/models/ctr_dnn/model.py): one 1,000,001 x 10 embedding, Uniform(-1, 1) init,
looked up for each of the 26 slots; the 260 values concatenated with the 13 dense features ->
FC 400 ReLU x 3 -> FC 2, softmax cross-entropy, mean over the batch; FC weights
Normal(0, 1/sqrt(fan_in)), biases 0; Adam lr 0.001, betas 0.9/0.999, eps 1e-8 on everything.
aps updates the embedding with lazy Adam (only the batch's rows, each with its own step count);
PyTorch gets ``nn.Embedding(sparse=True)`` + ``torch.optim.SparseAdam`` for it (also lazy: only
the batch's rows, but bias correction uses one step count for the whole table) and
``torch.optim.Adam`` for the FC layers.

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
        [--scale full] [--repeats 1] [--aps-extra "--max-merge-var-num 8 --send-queue-size 8"]
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

TORCH_VERSION = "2.13.0"
INSTALL_HINT = (
    f"PyTorch is needed for this benchmark (a bench-only dependency, not in pyproject): "
    f".venv/bin/pip install torch=={TORCH_VERSION}"
)
CHUNK_BYTES = 1 << 20  # aps-trainer's default --chunk-bytes: batches never cross a chunk
BATCH = 1000  # ctr_dnn's default batch_size
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


# ----------------------------------------------------------------------------- data


def make_data(out: Path, args: argparse.Namespace) -> dict:
    """Write (or reuse, when meta.json says it is the same) the data set; returns meta.json."""
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        have = (meta.get("train_lines"), meta.get("test_lines"), meta.get("scale"), meta.get("seed"),
                len(meta.get("train_files", [])))
        same = have == (args.train_lines, args.test_lines, args.scale, args.seed, args.train_files)
        if same:
            print(f"reusing the data in {out}", file=sys.stderr)
            return meta
    cmd = [
        sys.executable, str(ROOT / "examples" / "ctr_dnn" / "make_data.py"), "--out", str(out),
        "--train-lines", str(args.train_lines), "--test-lines", str(args.test_lines),
        "--train-files", str(args.train_files), "--scale", args.scale, "--seed", str(args.seed),
    ]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.loads(meta_path.read_text())


def data_files(directory: Path) -> list[str]:
    from aps.trainer.files import expand_inputs

    return expand_inputs([str(directory)])  # the trainer's order: sorted


def parse_batches(files: list[str]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(ids, dense, labels) per batch, cut exactly as aps's workers cut them: each file read in
    CHUNK_BYTES line-aligned chunks, each chunk parsed by CriteoFormat and split into BATCH lines."""
    from aps.models.criteo import CriteoFormat
    from aps.trainer.reader import read_chunks

    async def chunks(path: str) -> list:
        return [c async for c in read_chunks(path, CHUNK_BYTES)]

    fmt = CriteoFormat()
    out = []
    for path in files:
        for chunk in asyncio.run(chunks(path)):
            rec = fmt.parse(chunk)
            for lo in range(0, rec.n, BATCH):
                hi = min(rec.n, lo + BATCH)
                out.append((rec.ids[lo:hi], rec.dense[lo:hi], rec.labels[lo:hi]))
    return out


# ----------------------------------------------------------------------------- PyTorch


def torch_network(torch: Any, seed: int) -> Any:
    """CTR-DNN in torch.nn, initialised as aps initialises it (different random numbers)."""
    nn = torch.nn

    class CtrDnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(1000001, 10, sparse=True)
            widths = [26 * 10 + 13, 400, 400, 400, 2]
            self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
            with torch.no_grad():
                self.emb.weight.uniform_(-1.0, 1.0)
                for fc in self.fcs:
                    fc.weight.normal_(0.0, 1.0 / fc.in_features ** 0.5)
                    fc.bias.zero_()

        def forward(self, ids: Any, dense: Any) -> Any:
            x = torch.cat([self.emb(ids).reshape(ids.shape[0], -1), dense], dim=1)
            for fc in self.fcs[:-1]:
                x = torch.relu(fc(x))
            return self.fcs[-1](x)

    torch.manual_seed(seed)
    return CtrDnn()


def torch_train_child(cfg: dict) -> int:
    """The PyTorch training process: its wall time (start to exit) is PyTorch's whole run."""
    t_start = time.perf_counter()
    import torch
    import torch.nn.functional as F

    t_import = time.perf_counter()
    torch.set_num_threads(cfg["threads"])
    batches = parse_batches(cfg["files"])
    tensors = [
        (torch.from_numpy(ids), torch.from_numpy(dense), torch.from_numpy(labels.astype(np.int64)))
        for ids, dense, labels in batches
    ]
    t_parse = time.perf_counter()
    net = torch_network(torch, cfg["seed"])
    sparse_opt = torch.optim.SparseAdam([net.emb.weight], lr=0.001, betas=(0.9, 0.999), eps=1e-8)
    dense_opt = torch.optim.Adam(net.fcs.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-8)
    loss_sum = 0.0
    examples = 0
    t_loop = time.perf_counter()  # from t_parse: building the network and the optimizers
    for ids, dense, labels in tensors:
        logits = net(ids, dense)
        loss = F.cross_entropy(logits, labels)
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
        "examples": examples, "steps": len(tensors), "adam_steps": len(tensors), "loss": loss_sum / max(1, examples),
        "import_s": t_import - t_start, "parse_s": t_parse - t_import, "setup_s": t_loop - t_parse,
        "loop_s": t_loop_end - t_loop,
        "save_s": t_end - t_loop_end, "threads": torch.get_num_threads(),
    }))
    return 0


def run_torch(files: list[str], work: Path, args: argparse.Namespace) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    cfg = {"files": files, "threads": args.threads, "seed": args.seed, "save": str(work / "model.pt")}
    (work / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-child", str(work / "config.json")]
    with CpuMeter() as meter:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"PyTorch training failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r.update({
        "loop_examples_per_s": r["examples"] / r["loop_s"],
        "loop_parse_examples_per_s": r["examples"] / (r["loop_s"] + r["parse_s"]),
        "wall_s": meter.wall, "wall_examples_per_s": r["examples"] / meter.wall,
        "own_cpu": meter.own_cpu, "other_cpu": meter.other_cpu,
    })
    return r


def torch_predict(save: Path, batches: list, threads: int) -> np.ndarray:
    import torch

    torch.set_num_threads(threads)
    net = torch_network(torch, 0)
    net.load_state_dict(torch.load(save, weights_only=True)["model"])
    net.eval()
    probs = []
    with torch.no_grad():
        for ids, dense, _labels in batches:
            logits = net(torch.from_numpy(ids), torch.from_numpy(dense))
            probs.append(torch.softmax(logits, dim=1)[:, 1].numpy())
    return np.concatenate(probs)


# ----------------------------------------------------------------------------- aps


def run_aps(data: Path, work: Path, args: argparse.Namespace) -> dict:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    trainer_args = [
        "--model", "ctr_dnn", "--data", str(data / "train_data"), "--epochs", "1", "--workers", str(args.workers),
        "--save-dir", str(work / "model"), "--print-period", "5", *shlex.split(args.aps_extra),
    ]
    cluster = aps.LocalCluster(1, 1, trainer_args, mode="async", log_dir=work / "log", cwd=work)
    with CpuMeter() as meter:
        result = cluster.run()
    if not result.ok:
        role = result.failed[0] if result.failed else result.roles[-1]
        tail = "\n".join(role.log_tail(30))
        raise RuntimeError(f"aps failed (exit {result.code}{', ' + result.reason if result.reason else ''}): "
                           f"{role.name} {role.state}; its log ({role.log_path}) ends:\n{tail}")
    records = [json.loads(line) for line in (work / "log" / "trainer.0.metrics.jsonl").read_text().splitlines()]
    epoch = [r for r in records if r.get("event") == "epoch"][-1]
    return {
        "command": f"aps-local 1x1 --mode async -- {shlex.join(trainer_args)}  (run as aps.LocalCluster)",
        "examples": epoch["examples"], "steps": epoch["steps"],
        "loss": epoch["loss"], "train_auc": epoch["auc"], "epoch_s": epoch["seconds"],
        "loop_examples_per_s": epoch["examples_per_s"], "wait_share": epoch["wait_share"],
        "wall_s": meter.wall, "wall_examples_per_s": epoch["examples"] / meter.wall,
        "own_cpu": meter.own_cpu, "other_cpu": meter.other_cpu,
        "checkpoint": epoch.get("saved") or str(work / "model" / "epoch_0"),
    }


def aps_adam_steps(checkpoint: str) -> int | None:
    """How many times the pserver applied Adam to fc1.w (pushes after merging), from the manifest."""
    try:
        manifest = json.loads(next(Path(checkpoint).glob("shard-*/manifest.json")).read_text())
        return int(manifest["tables"]["fc1.w"]["blocks"][0]["step"])
    except (StopIteration, OSError, KeyError, IndexError, ValueError):
        return None


def aps_infer(checkpoint: str, data: Path, work: Path) -> dict:
    """infer.py as a user runs it (its AUC is bucketed, as the reference's)."""
    out = work / "infer.json"
    cmd = [sys.executable, str(ROOT / "examples" / "ctr_dnn" / "infer.py"), "--checkpoint", checkpoint,
           "--data", str(data / "test_data"), "--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def aps_predict(checkpoint: str, files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """aps's test predictions (its own forward kernel on the checkpoint) for the exact AUC."""
    from aps.models.ctr_dnn.model import CtrDnn
    from aps.models.ctr_eval import load_params, predict
    from aps.trainer.model import WorkerContext

    net = CtrDnn()
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


def table(aps_name: str, torch_name: str, aps_runs: list[dict], torch_runs: list[dict], bayes: float) -> str:
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
            f"| {fmt_stat(col(runs, 'logloss'), '.4f')} | {bayes:.4f} | {steps} | {wait} | {other} |"
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
        data = Path(args.data).resolve() if args.data else tmp / "data"
        t0 = time.perf_counter()
        meta = make_data(data, args)
        data_s = time.perf_counter() - t0
        train_files = data_files(data / "train_data")
        test_files = data_files(data / "test_data")
        test_batches = parse_batches(test_files)
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
                    r["infer"] = aps_infer(r["checkpoint"], data, work)
                    r["adam_steps"] = aps_adam_steps(r["checkpoint"])
                    probs, labels = aps_predict(r["checkpoint"], test_files)
                    if not np.array_equal(labels, test_labels):
                        raise RuntimeError("aps and PyTorch saw different test labels")
                    aps_runs.append(r)
                else:
                    r = run_torch(train_files, work, args)
                    probs = torch_predict(work / "model.pt", test_batches, args.threads)
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

    bayes = float(meta["bayes_auc_test"])
    aps_name = f"aps 1x1 async, {args.workers} workers"
    if args.aps_extra:
        aps_name += f", tuned communicator `{args.aps_extra}`"
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
        f"CTR-DNN, 1 epoch over {examples:,} train lines ({args.train_files} files, scale {args.scale}, seed {args.seed}) "
        f"in {steps} batches of <= {BATCH}, test on {len(test_labels):,} lines; {os.cpu_count()} cores; "
        f"{args.repeats} run(s) each" + (" (median (min-max))" if args.repeats > 1 else ""),
        "",
        out_table,
        "",
        verdict(aps_runs, torch_runs),
        "",
        "Notes: same network, init distributions, data, batches (1 MiB chunks, batches of 1000 within a chunk) and "
        "file order; Adam lr 0.001 (0.9/0.999, eps 1e-8). aps: lazy Adam on the pserver for the embedding (per-row "
        "step count), Adam for the FC tables; async mode merges up to --max-merge-var-num queued batches into one push "
        "(one Adam step: 'Adam steps (FC)' counts the pserver's applications), and a worker pulls the next batch's rows "
        "while the current one computes (async staleness). PyTorch: "
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
