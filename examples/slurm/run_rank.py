#!/usr/bin/env python3
"""One command for every rank of an srun / mpirun step: become aps-server or aps-trainer.

Slurm and MPI start the same command on every rank. This reads the rank the way aps does
(``aps.cluster.rank_env``: the first ``APS_NUM_PSERVERS`` ranks are pservers, the rest trainers)
and replaces itself with the right program, so each role's own flags and environment names
apply unchanged::

    srun python examples/slurm/run_rank.py --server-args="--checkpoint-dir ckpt" -- \\
        --model word2vec --data data/word2vec/train --mode geo --epochs 1

Arguments after ``--`` go to aps-trainer; ``--server-args`` (one shell-quoted string) to
aps-server (write it with =, as its value starts with a dash).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from aps.cluster import cluster_from_env
from aps.errors import ConfigError


def command(argv: list[str]) -> list[str]:
    """The program and arguments this rank runs (ConfigError when the rank says nothing)."""
    parser = argparse.ArgumentParser(prog="run_rank.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server-args", default="", help="flags for aps-server, one quoted string")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then flags for aps-trainer")
    args = parser.parse_args(argv)
    trainer_args = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    _, own = cluster_from_env()
    bin_dir = os.path.dirname(sys.executable)  # the venv's bin, where aps is installed
    if own["role"] == "pserver":
        return [os.path.join(bin_dir, "aps-server"), *shlex.split(args.server_args)]
    if own["role"] == "trainer":
        return [os.path.join(bin_dir, "aps-trainer"), *trainer_args]
    raise ConfigError("no role: set APS_NUM_PSERVERS and run under srun or mpirun")


def main() -> int:
    try:
        argv = command(sys.argv[1:])
    except ConfigError as exc:
        print(f"run_rank.py: error: {exc}", file=sys.stderr)
        return 2
    os.execv(argv[0], argv)
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
