"""What the two fleet examples share: their options, the strategy they ask for, and the reader.

In the reference these are the script's ``params`` and its ``reader.py``: the lines of every
file of this trainer's share, in order, handed to the model's own batching.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

from aps.fleet import DistributedStrategy, Fleet
from aps.trainer import Batch
from aps.trainer.stepwise import StepTrainer


def add_arguments(parser: argparse.ArgumentParser, hidden: str, batch_size: int, lr: float, online: bool = False) -> None:
    """The options every example takes (each also has the model's own); ``online``: --data or
    --data-passes, --resume and --pass-wait."""
    add = parser.add_argument
    data_help = "directory of Criteo-format training files (train_data/ of make_data.py)"
    if online:
        data = parser.add_mutually_exclusive_group(required=True)
        data.add_argument("--data", help=data_help)
        data.add_argument("--data-passes", metavar="ROOT", help="online training: pass folders ROOT/<day>/<pass>/, each "
                          "trained once when its _SUCCESS appears, a checkpoint SAVE/pass-<seq> after each (needs --save)")
        add("--resume", action="store_true", help="--data-passes: continue after the newest pass checkpoint in --save")
        add("--pass-wait", type=float, default=600.0, help="--data-passes: seconds to wait for the next pass before "
            "stopping (default: %(default)s)")
    else:
        add("--data", required=True, help=data_help)
    add("--mode", choices=("sync", "async", "half_async", "geo"), default="async", help="default: %(default)s")
    add("--k-steps", type=int, default=100, help="geo: push every K steps (default: %(default)s)")
    add("--epochs", type=int, default=1, help="passes over this trainer's files (default: %(default)s)")
    add("--batch-size", type=int, default=batch_size, help="default: %(default)s")
    add("--lr", type=float, default=lr, help="default: %(default)s")
    add("--hidden", default=hidden, help="widths of the fully connected layers (default: %(default)s)")
    add("--meta", help="meta.json of the data (a layout other than Criteo's, e.g. Adult)")
    add("--save", help="the first trainer saves the pservers' tables here at the end")
    add("--init-model", help="pservers warm-start from this checkpoint (incremental training)")
    add("--table", choices=("fixed", "hash"), default="fixed",
        help="the sparse tables: fixed arrays of hashed feature ids, or hash tables keyed by the full 64-bit "
             "feature hash, admitted and evicted (sync, async, half_async; default: %(default)s)")
    add("--admit-probability", type=float, default=1.0, help="hash tables: admit a new key with this probability "
        "per occurrence (default: %(default)s)")
    add("--admit-count", type=int, default=1, help="hash tables: admit a key once pushed this many times "
        "(default: %(default)s)")
    add("--max-keys", type=int, help="hash tables: keys per pserver; past it the lowest-score keys are evicted "
        "(default: unbounded)")


def table_args(args: argparse.Namespace) -> dict[str, Any]:
    """The model's table arguments from --table, --admit-probability, --admit-count, --max-keys."""
    return {"table": args.table, "admit_probability": args.admit_probability, "admit_count": args.admit_count,
            "max_keys": args.max_keys}


def strategy_for(args: argparse.Namespace) -> DistributedStrategy:
    """--mode as the reference's DistributedStrategy (a_sync, a_sync_configs, half_async)."""
    strategy = DistributedStrategy()
    strategy.a_sync = args.mode != "sync"
    strategy.half_async = args.mode == "half_async"
    if args.mode == "geo":
        strategy.a_sync_configs = {"k_steps": args.k_steps}
    return strategy


def optimizer_for(args: argparse.Namespace) -> str:
    """Geo trains locally with SGD (the reference says the same); the other modes use Adam."""
    return "sgd" if args.mode == "geo" else "adam"


def train_files(fleet: Fleet, directory: str) -> list[str]:
    """This trainer's share of the files (the reference's ``fleet.split_files``)."""
    names = sorted(os.path.join(directory, n) for n in os.listdir(directory))
    return fleet.split_files(names)


def batches(worker: StepTrainer, files: list[str]) -> Iterator[Batch]:
    """The model's batches of every line of ``files`` (a bad line names its file and line)."""
    for path in files:
        with open(path, "rb") as lines:
            yield from worker.batches(lines, source=path)


def serve(fleet: Fleet, args: argparse.Namespace) -> None:
    """The pserver role: warm start when asked, then serve until every trainer stopped."""
    fleet.init_server(args.init_model)
    fleet.run_server()
