#!/usr/bin/env python3
"""Online learning on real data in time order: aps's trainer against the baselines a user would try.

A data set (``examples/wide_deep/prepare_ratings.py``: ``all_data/part-00000`` + ``meta.json``,
or any directory of that layout) is cut into ``--passes`` passes of ``--pass-lines`` lines, in
order. Every learner sees the passes in the same order and **scores each pass before it trains on
it** (the online AUC, what an online model is judged by); the table reports the mean online AUC of
passes 3 to the last (the first two meet a model that has seen almost nothing).

* **aps**: ``aps-server`` + ``aps-trainer`` (one trainer, the model's defaults unless ``--aps``
  says otherwise; each ``--aps "ARGS"`` is one more row), reading pass folders ``DAY/PASS/part-00000``
  written for it (``--data-passes``), or with ``--source stream`` the set replayed in order
  through a Redis stream (``--data-stream``, ``--pass-records``; a redis-server started here);
  its online AUC is the trainer's own per pass (the metrics file's ``online_auc``);
* **FTRL-LR**: logistic regression by FTRL-Proximal (McMahan et al. 2013), one example at a time,
  one-hot hashed slot values + the normalised dense columns + a bias, a small grid of ``alpha`` and
  ``l1``/``l2`` (the best row is the baseline; every row is in the JSON);
* **PyTorch**: the same network as aps's model in ``torch.nn`` (``bench/ctr_vs_torch.py``'s),
  trained one pass at a time in batches, with several optimizer settings (``--torch``).

All AUCs are the same bucketed AUC (``aps.metrics.Auc``, the trainer's). PyTorch is a bench-only
dependency: ``.venv/bin/pip install torch==2.13.0``.

    .venv/bin/python examples/wide_deep/prepare_ratings.py movielens --out data/movielens
    .venv/bin/python bench/online_baselines.py --data data/movielens --pass-lines 5000
    .venv/bin/python bench/online_baselines.py --data data/movielens --aps "" --aps "--model-arg lr=0.01"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from ctr_vs_torch import criteo_format, torch_network, torch_probs  # noqa: E402

from aps.metrics import Auc  # noqa: E402
from aps.models.ctr_model import ONLINE_INIT_RANGE  # noqa: E402

DAY = "20261126"
DONE = "_SUCCESS"
SKIP = 2  # passes left out of the mean: the first two meet a model that has seen almost nothing
#: FTRL-Proximal settings tried: (alpha, beta, l1, l2)
FTRL_GRID = [(a, 1.0, l1, l2) for a in (0.03, 0.1, 0.3, 1.0, 3.0) for l1, l2 in ((0.0, 0.0), (1.0, 1.0))]
#: PyTorch settings tried by default: optimizer, lr, batch
TORCH_DEFAULT = ["adam:0.001:256", "adam:0.001:32", "adagrad:0.05:256", "adagrad:0.05:32"]


# ----------------------------------------------------------------------------- data


def read_lines(data: Path) -> list[bytes]:
    """Every line of the set in order: all_data/ when there, else train_data/ then test_data/."""
    dirs = [data / "all_data"] if (data / "all_data").is_dir() else [data / "train_data", data / "test_data"]
    lines: list[bytes] = []
    for d in dirs:
        for part in sorted(d.glob("part-*")):
            lines.extend(part.read_bytes().splitlines())
    return lines


def cut_passes(lines: list[bytes], passes: int, pass_lines: int) -> list[list[bytes]]:
    if passes * pass_lines > len(lines):
        raise SystemExit(f"online_baselines.py: error: {passes} passes of {pass_lines} lines need "
                         f"{passes * pass_lines:,} lines; the set has {len(lines):,}")
    return [lines[k * pass_lines : (k + 1) * pass_lines] for k in range(passes)]


def parse_pass(meta: str, lines: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids [n, slots], dense [n, dense], labels [n]) as aps's own parser makes them."""
    from aps.trainer.reader import Chunk

    text = b"\n".join(lines) + b"\n"
    rec = criteo_format(meta).parse(Chunk("pass", 0, text, len(lines)))
    return rec.ids.copy(), rec.dense.copy(), rec.labels.astype(np.float64)


def write_pass_folders(root: Path, passes: list[list[bytes]]) -> None:
    for k, lines in enumerate(passes):
        folder = root / DAY / f"{k + 1:04d}"
        folder.mkdir(parents=True)
        (folder / "part-00000").write_bytes(b"\n".join(lines) + b"\n")
        (folder / DONE).write_text("")
    (root / DONE).write_text("")  # no more passes: the trainer ends after the last


def online_auc(probs: np.ndarray, labels: np.ndarray) -> float:
    auc = Auc()
    auc.update(probs.astype(np.float32), labels.astype(np.float32))
    return auc.global_auc()


def summary(name: str, aucs: list[float], **extra: Any) -> dict[str, Any]:
    return {"learner": name, "online_auc": aucs, "mean_online_auc": float(np.mean(aucs[SKIP:])), **extra}


# ----------------------------------------------------------------------------- FTRL-Proximal LR


@njit(cache=True)
def _ftrl_pass(ids: np.ndarray, dense: np.ndarray, labels: np.ndarray, buckets: int, z: np.ndarray, n: np.ndarray,
               alpha: float, beta: float, l1: float, l2: float, train: bool, probs: np.ndarray) -> None:
    """Predict (and with ``train`` update) example by example. Feature index: slot id in
    [0, buckets), dense column j at buckets + j, the bias last; value 1 for slots and the bias."""
    slots, nd = ids.shape[1], dense.shape[1]
    idx = np.empty(slots + nd + 1, np.int64)
    val = np.empty(slots + nd + 1, np.float64)
    w = np.empty(slots + nd + 1, np.float64)
    for r in range(ids.shape[0]):
        for s in range(slots):
            idx[s] = ids[r, s]
            val[s] = 1.0
        for j in range(nd):
            idx[slots + j] = buckets + j
            val[slots + j] = dense[r, j]
        idx[slots + nd] = buckets + nd
        val[slots + nd] = 1.0
        logit = 0.0
        for f in range(slots + nd + 1):
            i = idx[f]
            if abs(z[i]) <= l1:
                w[f] = 0.0
            else:
                w[f] = -(z[i] - math.copysign(l1, z[i])) / ((beta + math.sqrt(n[i])) / alpha + l2)
            logit += w[f] * val[f]
        p = 1.0 / (1.0 + math.exp(-max(min(logit, 35.0), -35.0)))
        probs[r] = p
        if train:
            for f in range(slots + nd + 1):
                i = idx[f]
                g = (p - labels[r]) * val[f]
                sigma = (math.sqrt(n[i] + g * g) - math.sqrt(n[i])) / alpha
                z[i] += g - sigma * w[f]
                n[i] += g * g


def run_ftrl(parsed: list[tuple[np.ndarray, np.ndarray, np.ndarray]], buckets: int, setting: tuple[float, ...]) -> dict[str, Any]:
    alpha, beta, l1, l2 = setting
    size = buckets + parsed[0][1].shape[1] + 1
    z, n = np.zeros(size), np.zeros(size)
    aucs = []
    t0 = time.perf_counter()
    for ids, dense, labels in parsed:
        probs = np.empty(len(labels))
        _ftrl_pass(ids, dense.astype(np.float64), labels, buckets, z, n, alpha, beta, l1, l2, False, probs)
        aucs.append(online_auc(probs, labels))
        _ftrl_pass(ids, dense.astype(np.float64), labels, buckets, z, n, alpha, beta, l1, l2, True, probs)
    return summary(f"FTRL-LR alpha {alpha:g} beta {beta:g} l1 {l1:g} l2 {l2:g}", aucs, seconds=time.perf_counter() - t0)


# ----------------------------------------------------------------------------- PyTorch


def run_torch(parsed: list[tuple[np.ndarray, np.ndarray, np.ndarray]], spec: dict[str, Any], setting: str,
              seed: int, threads: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    name, lr_text, batch_text = setting.split(":")
    lr, batch = float(lr_text), int(batch_text)
    net = torch_network(torch, seed, spec)
    if name == "adam":
        opts = [torch.optim.SparseAdam(net.sparse_parameters(), lr=lr), torch.optim.Adam(net.dense_parameters(), lr=lr)]
    elif name == "adagrad":
        opts = [torch.optim.Adagrad([*net.sparse_parameters(), *net.dense_parameters()], lr=lr)]
    else:
        raise SystemExit(f"online_baselines.py: error: --torch optimizer must be adam or adagrad, got {name!r}")
    aucs = []
    t0 = time.perf_counter()
    for ids, dense, labels in parsed:
        tids, tdense, tlabels = torch.from_numpy(ids), torch.from_numpy(dense), torch.from_numpy(labels.astype(np.float32))
        with torch.no_grad():
            probs = torch_probs(torch, spec, net(tids, tdense)).numpy()
        aucs.append(online_auc(probs, labels))
        for lo in range(0, len(labels), batch):
            loss = F.binary_cross_entropy_with_logits(net(tids[lo : lo + batch], tdense[lo : lo + batch]), tlabels[lo : lo + batch])
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in opts:
                opt.step()
    return summary(f"PyTorch {name} lr {lr:g} batch {batch}", aucs, seconds=time.perf_counter() - t0)


# ----------------------------------------------------------------------------- aps


class StreamReplay:
    """A redis-server of its own (Debian's ``redis-server``, on a free port, no persistence) whose
    stream ``lines`` holds the set's lines in order; each aps run reads it from the start as a
    consumer group of its own, ``pass_lines`` entries to a pass."""

    def __init__(self, work: Path, lines: list[bytes], pass_lines: int) -> None:
        import shutil
        import socket

        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("online_baselines.py: error: --source stream needs redis-server (apt-get install redis-server)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--dir", str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("online_baselines.py: error: redis-server did not start") from None
                time.sleep(0.05)
        for lo in range(0, len(lines), 1000):
            pipe = client.pipeline(transaction=False)
            for line in lines[lo : lo + 1000]:
                pipe.xadd("lines", {"line": line})
            pipe.execute()
        client.close()
        self.pass_lines = pass_lines

    def source_args(self, group: str) -> list[str]:
        return ["--data-stream", f"redis://127.0.0.1:{self.port}/lines", "--stream-group", group,
                "--pass-records", str(self.pass_lines), "--pass-wait", "3"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_aps(source_args: list[str], meta: str, model: str, extra: str, work: Path, seed: int, timeout: float) -> dict[str, Any]:
    """One aps-server and one aps-trainer over the passes ``source_args`` name (pass folders, or
    a Redis stream); the trainer's online AUCs."""
    (work / "ckpt").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    port_file = work / "ps.port"
    logs = [open(work / f"{name}.log", "wb") for name in ("aps-server", "aps-trainer")]
    server = subprocess.Popen([sys.executable, str(ROOT / "bin" / "aps-server"), "--port", "0", "--port-file", str(port_file),
                               "--checkpoint-root", str(work / "ckpt"), "--no-exit-when-done"],
                              stdout=logs[0], stderr=subprocess.STDOUT, env=env)
    trainer = None
    t0 = time.perf_counter()
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"aps-server did not start (see {work / 'aps-server.log'})")
            time.sleep(0.05)
        metrics = work / "trainer.metrics.jsonl"
        trainer = subprocess.Popen(
            [sys.executable, str(ROOT / "bin" / "aps-trainer"), "--pservers", f"127.0.0.1:{int(port_file.read_text())}",
             "--model", model, "--model-arg", f"meta={meta}", "--model-arg", f"seed={seed}", "--seed", str(seed),
             *source_args, "--save-every-passes", "0", "--no-save", "--metrics", str(metrics), "--print-period", "0",
             *shlex.split(extra)],
            stdout=logs[1], stderr=subprocess.STDOUT, env=env)
        code = trainer.wait(timeout)
        if code != 0:
            raise SystemExit(f"aps-trainer exited with {code} (see {work / 'aps-trainer.log'})")
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
        aucs = [r["online_auc"] for r in records if r.get("event") == "epoch"]
    finally:
        for proc in (trainer, server):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        for log in logs:
            log.close()
    return summary(f"aps {model}" + (f" {extra}" if extra else " (defaults)"), aucs, seconds=time.perf_counter() - t0)


# ----------------------------------------------------------------------------- main


def grouped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per learner: the mean over its runs (seeds) of the mean online AUC, and the range."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["learner"], []).append(r)
    return [{"learner": name, "runs": len(rs), "mean": float(np.mean([r["mean_online_auc"] for r in rs])),
             "low": min(r["mean_online_auc"] for r in rs), "high": max(r["mean_online_auc"] for r in rs),
             "seconds": float(np.mean([r["seconds"] for r in rs]))} for name, rs in by.items()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a directory with meta.json and all_data/ (or train_data/ + test_data/)")
    p.add_argument("--passes", type=int, default=20, help="default 20")
    p.add_argument("--pass-lines", type=int, help="lines a pass (default: the set's lines / passes, at most 5,000)")
    p.add_argument("--source", choices=["passes", "stream"], default="passes",
                   help="how aps reads the passes: pass folders (--data-passes) or a Redis stream replayed in order "
                   "(--data-stream, a redis-server started here; default passes)")
    p.add_argument("--model", default="wide_deep", choices=["wide_deep", "ctr_dnn"], help="default wide_deep")
    p.add_argument("--aps", action="append", metavar="ARGS",
                   help="aps-trainer arguments of one aps row (repeatable; default one row: '--model-arg table=hash'); 'none': no aps rows")
    p.add_argument("--torch", action="append", metavar="OPT:LR:BATCH",
                   help=f"a PyTorch row (repeatable; default {' '.join(TORCH_DEFAULT)}); 'none': no PyTorch rows")
    p.add_argument("--init-range", type=float, default=ONLINE_INIT_RANGE, metavar="R",
                   help="the PyTorch network's embedding init half-width (default %(default)s: aps's online default)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="aps's and PyTorch's init seeds, one run of each row per seed (default 0 1 2)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds an aps run may take (default 1800)")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "online_baselines.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta_path = (args.data / "meta.json").resolve()
    meta = json.loads(meta_path.read_text())
    lines = read_lines(args.data)
    pass_lines = args.pass_lines or min(5000, len(lines) // args.passes)
    passes = cut_passes(lines, args.passes, pass_lines)
    parsed = [parse_pass(str(meta_path), p) for p in passes]
    rows: list[dict[str, Any]] = []

    def report(row: dict[str, Any]) -> None:
        rows.append(row)
        seed = f" seed {row['seed']}" if "seed" in row else ""
        print(f"  {row['learner']}{seed}: mean online AUC {row['mean_online_auc']:.4f} ({row['seconds']:.1f} s)", file=sys.stderr)

    print(f"{args.data}: {args.passes} passes of {pass_lines} lines", file=sys.stderr)
    for setting in FTRL_GRID:
        report(run_ftrl(parsed, int(meta.get("buckets", 1_000_001)), setting))
    spec = {"model": args.model, "meta": str(meta_path), "init_range": args.init_range}
    for setting in [] if args.torch == ["none"] else (args.torch or TORCH_DEFAULT):
        for seed in args.seeds:
            report(run_torch(parsed, spec, setting, seed, args.threads) | {"seed": seed})
    with tempfile.TemporaryDirectory(prefix="aps-online-") as tmp:
        write_pass_folders(Path(tmp) / "passes", passes)
        stream = StreamReplay(Path(tmp), [line for p in passes for line in p], pass_lines) if args.source == "stream" else None
        try:
            for k, extra in enumerate([] if args.aps == ["none"] else args.aps or ["--model-arg table=hash"]):
                for seed in args.seeds:
                    work = Path(tmp) / f"aps-{k}-{seed}"
                    source = (stream.source_args(f"run-{k}-{seed}") if stream is not None
                              else ["--data-passes", str(Path(tmp) / "passes"), "--pass-wait", "30"])
                    report(run_aps(source, str(meta_path), args.model, extra, work, seed, args.timeout) | {"seed": seed})
        finally:
            if stream is not None:
                stream.close()
    table = grouped(rows)
    ftrl = max((r for r in table if r["learner"].startswith("FTRL")), key=lambda r: r["mean"])
    torch_rows = [r for r in table if r["learner"].startswith("PyTorch")]
    best_torch = max(torch_rows, key=lambda r: r["mean"]) if torch_rows else None
    print(f"\n{args.data.name}: {args.passes} passes of {pass_lines:,} lines in order, each scored before it is trained "
          f"on; mean online AUC of passes {SKIP + 1}-{args.passes}; seeds {' '.join(map(str, args.seeds))} "
          "(mean, min..max)\n")
    print("| learner | mean online AUC | - best FTRL-LR | - best PyTorch | seconds a run |\n|---|---:|---:|---:|---:|")
    for r in table:
        vs_torch = f"{r['mean'] - best_torch['mean']:+.4f}" if best_torch else "-"
        spread = f" ({r['low']:.4f}..{r['high']:.4f})" if r["runs"] > 1 else ""
        print(f"| {r['learner']} | {r['mean']:.4f}{spread} | {r['mean'] - ftrl['mean']:+.4f} | {vs_torch} | {r['seconds']:.1f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"data": str(args.data), "passes": args.passes, "pass_lines": pass_lines,
                                     "skip": SKIP, "seeds": args.seeds, "rows": rows, "table": table}, indent=1) + "\n")
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
