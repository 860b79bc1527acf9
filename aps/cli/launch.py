"""aps-launch: the launcher command a Paddle user types, for a script written against aps.fleet.

``aps-launch --server-num 1 --worker-num 2 train.py ARGS`` is
``python -m paddle.distributed.launch --server_num=1 --worker_num=2 train.py ARGS`` (and
``fleetrun``) for aps. It is ``aps-local 1x2 -- train.py ARGS`` under another spelling: the same
launcher runs the script in every role with the environment set per process, logs per role in
LOG_DIR, a live status, fail-fast and no orphans (see aps-local --help for all of it).
"""

from __future__ import annotations

import argparse
import sys

from .local import main as local_main

DESCRIPTION = """\
Run SCRIPT as N pservers and M trainers on this machine: Paddle's
`python -m paddle.distributed.launch --server_num=N --worker_num=M SCRIPT ARGS` (or fleetrun)
for a script written against aps.fleet. Each process gets its role in the environment
(TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID,
PADDLE_PORT, POD_IP and aps's APS_* names); logs go to LOG_DIR/pserver.K.log and
LOG_DIR/trainer.K.log. It is `aps-local NxM -- SCRIPT ARGS`: same status line, summary, fail-fast
(one failed role stops the rest and shows its log's tail) and no orphans.

A SCRIPT ending in .py runs with this Python interpreter; anything else runs as a command.
Paddle's underscore spellings (--server_num, --worker_num, --log_dir) are accepted too.

exit status: 0 every role exited 0; 1 a role failed; 2 usage error; 124 --timeout expired;
130 / 143 / 129 interrupted by SIGINT / SIGTERM / SIGHUP.
"""

EPILOG = """\
examples:
  aps-launch --server-num 1 --worker-num 2 examples/fleet/wide_deep_train.py --data data/ctr/train_data
  aps-launch --server_num=2 --worker_num=2 --log_dir=/tmp/logs train.py --epochs 3
"""


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aps-launch", description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="aps-launch --server-num N --worker-num M [options] SCRIPT [script args]",
    )
    add = parser.add_argument
    add("--server-num", "--server_num", dest="server_num", type=_count, required=True, metavar="N",
        help="number of pservers")
    add("--worker-num", "--worker_num", dest="worker_num", type=_count, required=True, metavar="M",
        help="number of trainers")
    add("--log-dir", "--log_dir", dest="log_dir", default="log", help="where the per-role logs go (default: ./log)")
    add("--timeout", metavar="SECONDS", help="stop everything and fail (exit 124) after this long")
    add("--token-file", metavar="PATH", help="shared secret for every role (given to them as APS_TOKEN)")
    add("--metrics-port", metavar="BASE", help="pserver K serves metrics on BASE+K, trainer K on BASE+N+K")
    add("--status-interval", metavar="SECONDS", help="seconds between status lines off a terminal (default 10)")
    add("script", metavar="SCRIPT", help="the user's program, run in every role")
    add("args", nargs=argparse.REMAINDER, metavar="...", help="the script's own arguments, passed unchanged")
    return parser


def local_argv(args: argparse.Namespace) -> list[str]:
    """The aps-local command line that runs the same job."""
    argv = [f"{args.server_num}x{args.worker_num}", "--log-dir", args.log_dir]
    for flag, value in (("--timeout", args.timeout), ("--token-file", args.token_file),
                        ("--metrics-port", args.metrics_port), ("--status-interval", args.status_interval)):
        if value is not None:
            argv += [flag, value]
    return [*argv, "--", args.script, *args.args]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.script.startswith("-"):
        parser.error(f"unknown option {args.script}")
    return local_main(local_argv(args))


if __name__ == "__main__":
    sys.exit(main())
