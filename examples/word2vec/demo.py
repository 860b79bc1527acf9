#!/usr/bin/env python3
"""The default demo (``make demo``): word2vec on a local 2x2 cluster in GEO-SGD mode.

1. prepare the corpus (cached in data/word2vec: free English text from Debian packages),
2. run ``aps-local 2x2 --mode geo`` (2 pservers, 2 trainers x 2 workers),
3. evaluate the saved embeddings on the analogy set and print accuracy and words/s,
4. draw the trainers' loss and words/s curves into log/curves.png (when matplotlib is installed).

Defaults are sized to finish in a few minutes on 2 cores (dim 100, 1 epoch, 1 worker per trainer; the reference uses
dim 300 and more data). Every step can be changed with flags; see --help.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG = Path("log")  # aps-local's default --log-dir: role logs and the trainers' metrics files
sys.path.insert(0, str(ROOT / "examples" / "word2vec"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/word2vec", help="prepared corpus directory (default data/word2vec)")
    parser.add_argument("--cluster", default="2x2", help="pservers x trainers (default 2x2)")
    parser.add_argument("--workers", type=int, default=1,
                        help="compute workers per trainer (default 1: 2 trainers x 1 worker fill 2 cores)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--k-steps", type=int, default=400, help="geo push interval in trainer steps (default 400)")
    parser.add_argument("--out", default="model/word2vec", help="checkpoints go to OUT/epoch_N")
    parser.add_argument(
        "--model-arg", action="append", default=None, metavar="KEY=VALUE",
        help="word2vec settings (default: the model's: negatives shared by each target's window, linear "
        "decay over the run; pass --model-arg negatives=batch --model-arg lr=1.0 --model-arg "
        "lr_schedule=exponential for the reference network's)",
    )
    args = parser.parse_args()

    from prepare_data import prepare

    data = Path(prepare(args.data))
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    cmd = [
        sys.executable, str(ROOT / "bin" / "aps-local"), args.cluster, "--mode", "geo", "--status-interval", "15", "--",
        "--model", "word2vec", "--model-arg", f"dict_path={data / 'dict.txt'}", "--model-arg", f"dim={args.dim}",
        "--data", str(data / "train"), "--epochs", str(args.epochs), "--workers", str(args.workers),
        "--k-steps", str(args.k_steps), "--save-dir", str(out), "--print-period", "15",
    ]
    for arg in args.model_arg or []:
        cmd += ["--model-arg", arg]
    for old_metrics in LOG.glob("trainer.*.metrics.jsonl"):
        old_metrics.unlink()  # aps-local replaces its trainers' files; a bigger earlier --cluster left more
    print("$", " ".join(cmd), flush=True)
    started = time.monotonic()
    if subprocess.call(cmd) != 0:
        print("demo: the cluster failed; see log/", file=sys.stderr)
        return 1
    wall = time.monotonic() - started

    from aps.models.word2vec.evaluate import analogy_accuracy, load_checkpoint_table, read_words

    vectors = load_checkpoint_table(out / f"epoch_{args.epochs - 1}", "emb")
    result = analogy_accuracy(vectors, read_words(data / "dict.txt"), data / "questions-words.txt")
    print()
    print(result.table())
    seconds = 0.0
    trainers = int(args.cluster.split("x")[1])
    for k in range(trainers):
        epochs = [json.loads(line) for line in (LOG / f"trainer.{k}.metrics.jsonl").read_text().splitlines()]
        seconds = max(seconds, sum(r["seconds"] for r in epochs if r["event"] == "epoch"))
    # raw corpus words (before min_count and downsampling), as gensim counts its words/s
    tokens = int(json.loads((data / "meta.json").read_text())["total_tokens"]) * args.epochs
    total = result.total
    print(
        f"\nanalogy accuracy {100 * total.accuracy:.1f}% on {total.asked} of {total.questions} questions "
        f"(coverage {100 * total.coverage:.1f}%)"
    )
    print(f"trained {tokens:,} corpus words in {seconds:.1f} s of epoch time: {tokens / max(seconds, 1e-9):,.0f} words/s "
          f"over {trainers} trainers; whole run {wall:.0f} s incl. start-up: {tokens / max(wall, 1e-9):,.0f} words/s")
    plot_curves(LOG)
    return 0


def plot_curves(log_dir: Path) -> None:
    """The training curves as a PNG: a picture is the quickest check that loss fell steadily.
    Optional: without matplotlib (or with unreadable metrics) the demo still succeeds."""
    from aps.cli.plot import PlotUnavailable, plot_metrics
    from aps.errors import ApsError

    try:
        print(f"training curves: {plot_metrics(log_dir)}")
    except (PlotUnavailable, ApsError, OSError) as exc:  # PlotUnavailable: "needs matplotlib: pip install ..."
        print(f"(no training curves: {exc})")


if __name__ == "__main__":
    sys.exit(main())
