"""A drifting click stream as pass folders: the input of an online trainer (``--data-passes``).

    python examples/online/make_passes.py --out /tmp/passes --days 3 --passes-per-day 4 --lines 5000

It reuses the CTR generator's ``--shape drift`` (examples/ctr_dnn/make_data.py: Criteo-format
lines drawn from a known logistic model) instead of a second generator: its training lines are in
time order, new ids appear and old ones fade as the clock runs (a share of each big slot's draws,
growing to 0.6, takes values never seen before) and the dense part of the click model moves. The
time-ordered lines are cut into ``days x passes-per-day`` passes, ``OUT/<day>/<pass>/part-00000``,
each marked complete by its ``_SUCCESS`` done-file, and ``OUT/_SUCCESS`` says no more come, so a
trainer ends after the last pass. ``OUT/meta.json`` is the generator's (seed, Bayes AUC, ...).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctr_dnn"))

import make_data  # noqa: E402

DONE = "_SUCCESS"
FIRST_DAY = 20261126


def pass_names(days: int, passes_per_day: int) -> list[str]:
    """``DAY/PASS`` of every pass, in order (days from 2026-11-26, passes numbered from 1)."""
    return [f"{FIRST_DAY + d}/{p + 1:04d}" for d in range(days) for p in range(passes_per_day)]


def write_passes(out: Path, *, days: int, passes_per_day: int, lines: int, seed: int = 0, end: bool = True) -> dict[str, Any]:
    """Write the passes (``lines`` lines each) under ``out``; returns the generator's meta with
    ``passes`` (their names) added. ``end``: also write ``out/_SUCCESS`` (no more passes)."""
    names = pass_names(days, passes_per_day)
    staging = out / ".staging"
    meta = make_data.generate(
        staging, train_lines=lines * len(names), test_lines=max(1, lines // 10), train_files=len(names),
        test_files=1, seed=seed, scale="small", shape="drift", log=lambda _text: None,
    )
    for k, name in enumerate(names):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        (staging / "train_data" / f"part-{k:05d}").replace(folder / "part-00000")
        (folder / DONE).write_text("")  # last: the pass is complete
    (staging / "meta.json").replace(out / "meta.json")
    shutil.rmtree(staging)
    if end:
        (out / DONE).write_text("")
    return {**meta, "passes": names}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the pass root to write (trainer: --data-passes OUT)")
    p.add_argument("--days", type=make_data.positive_int, default=3, help="days (default %(default)s)")
    p.add_argument("--passes-per-day", type=make_data.positive_int, default=4, help="passes a day (default %(default)s)")
    p.add_argument("--lines", type=make_data.positive_int, default=5000, help="lines a pass (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the click model and the lines (default %(default)s)")
    args = p.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        p.error(f"--out {args.out} is not empty")
    meta = write_passes(args.out, days=args.days, passes_per_day=args.passes_per_day, lines=args.lines, seed=args.seed)
    print(f"wrote {len(meta['passes'])} passes of {args.lines} lines under {args.out} "
          f"({meta['passes'][0]} .. {meta['passes'][-1]}); Bayes AUC at the end of the drift {meta['bayes_auc_test']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
