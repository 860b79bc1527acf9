#!/usr/bin/env python3
"""Trainer scaling: examples/s of one trainer with 1 vs 2 compute workers, in every mode, and the
share of step time the workers spend waiting on the network.

One pserver runs as a separate process (aps-server, started with aps.PServerProcess); the trainer
runs here with the Trainer API. Prints a Markdown table and writes JSON (default bench/results/trainer_scaling.json).

    python bench/trainer_scaling.py                       # word2vec on data/word2vec if prepared
    python bench/trainer_scaling.py --model linreg        # the small test model, generated data
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aps import PServerProcess  # noqa: E402
from aps.cluster import ClusterSpec  # noqa: E402
from aps.trainer import Strategy, Trainer, TrainOptions  # noqa: E402


def make_model(args: argparse.Namespace, tmp: Path) -> tuple[object, list[str]]:
    if args.model == "word2vec":
        from aps.models.word2vec.model import Word2Vec

        data = Path(args.data or ROOT / "data" / "word2vec")
        files = sorted(str(p) for p in (data / "train").iterdir())[: args.files]
        # one setting for every mode: the linear schedule (the default) trains in geo only, so
        # the modes are compared with the reference's exponential one
        return Word2Vec(dict_path=str(data / "dict.txt"), dim=args.dim, lr_schedule="exponential"), files
    from examples.linreg.model import LinReg, make_data

    make_data(tmp / "linreg", files=8, lines_per_file=50_000, features=100_000)
    return LinReg(features=100_000, batch_size=256, lr=0.1), sorted(str(p) for p in (tmp / "linreg").iterdir())


async def run_once(model: object, files: list[str], mode: str, workers: int, tmp: Path, k_steps: int) -> dict:
    server = PServerProcess.start("--log-level", "warning", log_path=tmp / f"pserver.{mode}.{workers}.log")
    try:
        strategy = Strategy(mode=mode, workers=workers, k_steps=k_steps)
        options = TrainOptions(save_dir=None, print_period=3600, live_line=False)
        result = await Trainer(model, strategy, ClusterSpec([server.address], 1), 0, options).atrain(files, 1)  # type: ignore[arg-type]
        epoch = result.epochs[-1]
        return {k: epoch[k] for k in ("examples", "seconds", "examples_per_s", "wait_share", "loss")}
    finally:
        server.wait(timeout=30)  # exits by itself after worker_done (killed and an error if not)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["word2vec", "linreg"], default="word2vec")
    parser.add_argument("--data", help="prepared word2vec directory (default data/word2vec)")
    parser.add_argument("--files", type=int, default=4, help="word2vec training files to use (default 4)")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--modes", default="geo,async,half_async,sync")
    parser.add_argument("--k-steps", type=int, default=400, help="geo exchange interval in trainer steps (default 400)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "trainer_scaling.json"))
    args = parser.parse_args()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        model, files = make_model(args, tmp)
        for mode in args.modes.split(","):
            one = asyncio.run(run_once(model, files, mode, 1, tmp, args.k_steps))
            two = asyncio.run(run_once(model, files, mode, 2, tmp, args.k_steps))
            rows.append({"mode": mode, "workers_1": one, "workers_2": two, "speedup": two["examples_per_s"] / one["examples_per_s"]})
            print(f"{mode}: 1 worker {one['examples_per_s']:.0f}/s, 2 workers {two['examples_per_s']:.0f}/s", file=sys.stderr)
    print(f"\nTrainer scaling ({args.model}, 1 pserver, 1 trainer; {os.cpu_count()} cores)\n")
    print("| mode | 1 worker ex/s | 2 workers ex/s | speedup (aim >= 1.8x) | network wait share 1w | 2w |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        a, b = r["workers_1"], r["workers_2"]
        print(
            f"| {r['mode']} | {a['examples_per_s']:,.0f} | {b['examples_per_s']:,.0f} | {r['speedup']:.2f}x | "
            f"{a['wait_share']:.1%} | {b['wait_share']:.1%} |"
        )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "files": len(files), "cpus": os.cpu_count(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=2))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
