"""aps-ray: run N pservers and M trainers on a Ray cluster, each role a Ray actor placed by Ray.

Ray decides where every role runs (pservers spread over the nodes); each pserver listens on its
node's address and a free port and hands ``host:port`` back through Ray, and the trainers are
started with that list, so no port list is written anywhere. The driver supervises like
aps-local: one failed role (a non-zero exit, a pserver gone before the trainers are done, an
actor or node lost) stops every other role and fails the job with that role's log tail; the
summary names each role's node, exit and time. Ray is an optional dependency (``aps[ray]``).

This module is the command: its options and ``main``. The driver that starts and supervises the
actors is :mod:`aps.launcher.ray_driver`, what each actor runs :mod:`aps.launcher.ray_roles`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..launcher.ray_driver import EXIT_USAGE, RayJob
from .local import parse_layout, trainer_args_problem

#: flags aps-ray sets for each trainer itself, from what Ray tells it
OWN_TRAINER_FLAGS = ("--pservers", "--trainers", "--trainer-id")

DESCRIPTION = """\
Run N aps pservers and M aps trainers as Ray actors, placed by Ray on the cluster's nodes.
Each pserver binds its node's address on a free port and reports host:port through Ray; the
trainers get that list (--pservers, --trainers, --trainer-id are set by aps-ray). Trainer
options follow `--`. Logs: LOG_DIR/pserver.K.log and LOG_DIR/trainer.K.log on the node that ran
the role (the failed role's tail is printed here). APS_TOKEN, when set, is handed to every role
through Ray (not on a command line).

exit status: 0 every role exited 0; 1 a role failed or was lost; 2 usage error; 124 --timeout
expired; 130 interrupted.
"""

EPILOG = """\
examples:
  aps-ray 2x2 -- --model word2vec --data /shared/data/word2vec/train --mode geo --epochs 1
  aps-ray 1x4 --address ray://head:10001 --trainer-cpus 8 -- --model ctr_dnn --data /shared/ctr --workers 8
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aps-ray", description=DESCRIPTION, epilog=EPILOG,
                                usage="aps-ray NxM [options] -- trainer options",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("layout", type=parse_layout, metavar="NxM", help="N pservers and M trainers, e.g. 2x2")
    p.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a new local Ray)")
    p.add_argument("--log-dir", default="log", help="role logs, on each role's node (default log)")
    p.add_argument("--workdir", default=str(Path.cwd()), help="working directory of every role; must exist on "
                   "every node (default: this directory)")
    p.add_argument("--server-args", default="", help="extra aps-server flags, one quoted string")
    p.add_argument("--pserver-cpus", type=float, help="CPUs Ray reserves per pserver (default: 1, or the "
                   "cluster's CPUs shared by every role when it has fewer than one each)")
    p.add_argument("--trainer-cpus", type=float, help="CPUs Ray reserves per trainer (default: as --pserver-cpus)")
    p.add_argument("--timeout", type=float, help="stop every role and exit 124 after SECONDS")
    p.add_argument("--start-timeout", type=float, default=300.0, help="fail when Ray has not placed and started "
                   "every role within SECONDS, e.g. for want of free CPUs (default 300)")
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """aps-ray's options and the trainer options after ``--``; usage errors exit 2."""
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = build_parser()
    opts = parser.parse_args(argv[:cut])
    trainer_args = argv[cut + 1:]
    if not trainer_args:
        parser.error("trainer options go after -- (at least --model and --data)")
    given = [f for f in OWN_TRAINER_FLAGS if any(a == f or a.startswith(f + "=") for a in trainer_args)]
    if given:
        parser.error(f"{given[0]} is set by aps-ray from what Ray reports; leave it out")
    if problem := trainer_args_problem(trainer_args):
        parser.error(f"trainer options: {problem} (see aps-trainer --help)")
    cpus = [c for c in (opts.pserver_cpus, opts.trainer_cpus) if c is not None]
    if min([*cpus, opts.start_timeout]) <= 0 or (opts.timeout is not None and opts.timeout <= 0):
        parser.error("--pserver-cpus, --trainer-cpus, --timeout and --start-timeout must be > 0")
    opts.server_argv = shlex.split(opts.server_args)
    return opts, trainer_args


def main(argv: list[str] | None = None) -> int:
    opts, trainer_args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import ray
    except ImportError:
        print("aps-ray: error: Ray is not installed: pip install 'aps[ray]'", file=sys.stderr)
        return EXIT_USAGE
    owned = not ray.is_initialized()
    if owned:
        ray.init(address=opts.address, log_to_driver=False)
    try:
        return RayJob(ray, opts, trainer_args).run()
    finally:
        if owned:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
