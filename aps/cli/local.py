"""aps-local: run a whole cluster (N pservers, M trainers) on this machine.

The local equivalent of Paddle's ``fleetrun --server_num N --worker_num M``. This module is the
command line only: its options, its terminal output (layout, status, summary, the failed role's
log tail) and its signals. The launcher itself is :mod:`aps.launcher.local` (``aps.LocalCluster``),
which programs use directly; the process model (a process group per role, death with the
launcher, SIGTERM then SIGKILL per group, no orphans) is described in :mod:`aps.launcher.supervisor`.
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..launcher.local import MODES, LaunchResult, LocalCluster, RoleResult, metrics_ports_problem, result_of, script_command
from ..launcher.roles import Role, last_lines, program
from ..launcher.supervisor import Supervisor
from .common import TOKEN_ON_ARGV, exit_at_once, on_signals, read_token_file, run_main
from .local_display import Board, summary_rows

__all__ = ["Board", "Launcher", "build_parser", "main", "parse_args"]

EXIT_USAGE = 2
TAIL_LINES = 10

DESCRIPTION = """\
Run a local aps cluster: N pservers and M trainers on this machine (like Paddle's
`fleetrun --server_num N --worker_num M`).

aps-local picks N free ports on 127.0.0.1, starts N pservers (bin/aps-server --port P
--pservers LIST --trainers M --port-file F), waits until every one listens (failing at once if one
exits), then starts M trainers: bin/aps-trainer --pservers LIST --trainers M --trainer-id i
[--mode MODE] [trainer options]. Children also get the cluster in their environment:
APS_PSERVERS / PADDLE_PSERVERS_IP_PORT_LIST, APS_TRAINERS / PADDLE_TRAINERS_NUM,
APS_TRAINER_ID / PADDLE_TRAINER_ID, APS_ROLE / TRAINING_ROLE (PSERVER or TRAINER), POD_IP,
PADDLE_PORT / APS_PORT / APS_SERVER_INDEX (pservers), APS_TOKEN (with --token-file or --token,
or inherited: the token reaches the children only through their environment, never their argv).

Trainer options: every option aps-local does not know, and everything after `--`, is passed
unchanged to every trainer. Put trainer options whose names clash with aps-local's after `--`.

Your own script in every role: when what follows `--` is a command rather than options
(`aps-local 1x2 -- python train.py ARGS`, or just `-- train.py ARGS`), that command runs as every
pserver and every trainer, with no arguments added (a leading `python` is the interpreter that
runs aps-local, so the script imports the same aps): the role comes from the environment above,
which aps.fleet reads (fleet.init, fleet.is_server, ...). A pserver counts as started once
fleet.run_server listens (it writes its port to APS_PORT_FILE); a trainer's metrics records go to
APS_METRICS_FILE (LOG_DIR/trainer.K.metrics.jsonl) for the summary, and with --tensorboard its
scalars to APS_TENSORBOARD_DIR. --mode, --trainer-cmd and
--server-args do not apply there: the script's DistributedStrategy picks the mode.

Logs: stdout+stderr of each role go to LOG_DIR/pserver.K.log and LOG_DIR/trainer.K.log
(overwritten on each run). On a terminal one status line is rewritten in place (state of each role,
last line of each trainer's log); otherwise a plain status line is printed every
--status-interval seconds, and one line whenever a role exits. The cluster layout is printed at
start and a summary table at the end: role, pid, exit status, duration, and for trainers the
examples/s, loss (and AUC, for models that predict) of their last finished epoch in this run,
read from their metrics files; then the log.

Checkpoints: the pservers take relative --save-dir paths from the directory aps-local runs in;
an absolute --save-dir DIR is made at start and given to every pserver as --checkpoint-root DIR
(unless --server-args name one), so trainer 0 can save there.

Metrics: each aps-trainer gets --metrics LOG_DIR/trainer.K.metrics.jsonl (replaced on each run,
like the logs) unless you pass --metrics yourself; `aps-plot LOG_DIR` draws their curves. With
--metrics-port BASE, pserver K gets --metrics-port BASE+K and trainer K --metrics-port BASE+N+K.
With --tensorboard DIR, trainer K gets --tensorboard DIR/trainer-K: one TensorBoard run per
trainer, so `tensorboard --logdir DIR` shows them side by side.

Ending: once every trainer exited 0, the pservers exit by themselves (every trainer sent
worker_done); aps-local waits --server-grace seconds for that, then SIGTERMs them and fails.
If any role fails (non-zero exit or killed by a signal), aps-local stops the others (SIGTERM to
each role's process group, SIGKILL after 10 s) and prints the failed role, its exit status, its
log path and the last lines of its log. Ctrl-C or SIGTERM to aps-local forwards one SIGTERM to
every role (press Ctrl-C again to SIGKILL at once) and SIGKILLs stragglers after 5 s.

Each role runs in its own process group, so a terminal Ctrl-C reaches only aps-local, which then
signals each role once. On Linux the children also die if aps-local is SIGKILLed
(PR_SET_PDEATHSIG); what they fork themselves is their own responsibility.

exit status: 0 every role exited 0; 1 a role failed; 2 usage error; 124 --timeout expired;
130 / 143 / 129 interrupted by SIGINT / SIGTERM / SIGHUP.
"""

EPILOG = """\
examples:
  aps-local 2x2 --mode geo -- --model word2vec --data data/word2vec/train --epochs 1
  aps-local 1x4 --mode async --model ctr_dnn --data data/ctr/train --log-dir /tmp/ctr-logs
  aps-local 2x2 --token-file ~/.aps-token --server-args "--max-frame 16777216" --timeout 600 -- --epochs 3
  aps-local 2x2 --trainer-cmd "python my_trainer.py" -- --lr 0.1   # custom trainer program
  aps-local 1x2 -- python train.py --epochs 2                     # your fleet script in every role
"""


# ------------------------------------------------------------------------------------ options


def parse_layout(text: str) -> tuple[int, int]:
    """``NxM`` -> (pservers, trainers); both at least 1."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise argparse.ArgumentTypeError(f"layout must be NxM with N, M >= 1 (e.g. 2x2), got {text!r}")
    return int(match[1]), int(match[2])


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an unknown trainer option such as --mo or --time must reach the trainers,
    # not be taken for an abbreviation of --mode or --timeout.
    parser = argparse.ArgumentParser(
        prog="aps-local", description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="aps-local NxM [options] [trainer options] [-- trainer options | -- python script.py ARGS]",
    )
    add = parser.add_argument
    add("layout", type=parse_layout, metavar="NxM", help="N pservers and M trainers, e.g. 2x2")
    add("--log-dir", default="log", help="where pserver.K.log / trainer.K.log go (default: ./log)")
    add("--mode", choices=MODES, help="training mode, passed to every trainer as --mode")
    secret = parser.add_mutually_exclusive_group()
    secret.add_argument("--token-file", metavar="PATH",
                        help="read the shared secret from PATH (trailing newline dropped); given to pservers and "
                             "trainers as APS_TOKEN (never in argv). Or set APS_TOKEN, which they inherit")
    secret.add_argument("--token", metavar="SECRET",
                        help="the shared secret on aps-local's own command line, visible in ps; prefer --token-file")
    add("--server-args", default="", metavar="ARGS",
        help='extra pserver arguments as one shell-quoted string, e.g. "--max-frame 1048576"; '
             "write --server-args=--no-exit-when-done for a single option")
    add("--trainer-cmd", metavar="CMD",
        help='program to run per trainer instead of bin/aps-trainer, e.g. "python prog.py"; '
             "it gets the same arguments and environment")
    add("--timeout", type=_seconds, metavar="SECONDS",
        help="stop everything and fail (exit 124) after this long (default: no limit)")
    add("--status-interval", type=_seconds, default=10.0, metavar="SECONDS",
        help="seconds between status lines when stdout is not a terminal; 0 = only exits (default 10)")
    add("--server-grace", type=_seconds, default=30.0, metavar="SECONDS",
        help="how long pservers may take to exit after the last trainer (default 30)")
    add("--start-timeout", type=_seconds, default=120.0, metavar="SECONDS",
        help="how long pservers may take to start listening (default 120); aps-trainer starts with the "
        "pservers and waits for them this long (--wait-pservers), another --trainer-cmd once they listen")
    add("--metrics-port", type=int, metavar="BASE",
        help="serve live metrics: pserver K on port BASE+K, trainer K on BASE+N+K (default: none)")
    add("--tensorboard", metavar="DIR",
        help="trainer K writes TensorBoard scalars (loss, AUC, examples/s, wait share) into DIR/trainer-K while "
             "it trains (aps-trainer --tensorboard); view with: tensorboard --logdir DIR")
    restart = parser.add_argument_group("restarting failed pservers (async, half_async, geo)")
    restart.add_argument(
        "--restart-failed", type=int, default=0, metavar="N",
        help="start a pserver that dies again, up to N times each, from its own newest checkpoint (default 0: "
             "any failure stops the run)")
    restart.add_argument(
        "--checkpoint-every", type=_seconds, default=60.0, metavar="SECONDS",
        help="with --restart-failed: each pserver writes its shard this often (default 60)")
    restart.add_argument(
        "--checkpoint-dir", metavar="DIR", help="with --restart-failed: where they go (default: LOG_DIR/checkpoints)")
    return parser


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Own options, plus the trainer options: unknown ones first, then everything after ``--``."""
    after: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    opts, unknown = parser.parse_known_args(argv)
    opts.script_argv = None
    if after and not after[0].startswith("-"):  # `-- python train.py ...`: the user's script in every role
        clash = [flag for flag, given in (("--mode", opts.mode), ("--trainer-cmd", opts.trainer_cmd),
                                          ("--server-args", opts.server_args)) if given]
        if clash:
            parser.error(f"{clash[0]} does not apply to a script run in every role (its DistributedStrategy "
                         "picks the mode; pass the script's own options after it)")
        if unknown:
            parser.error(f"unknown option {unknown[0]}: a script run in every role takes its own options after it")
        opts.script_argv, after = script_command(after), []
    opts.server_argv = shlex.split(opts.server_args)
    opts.trainer_argv = shlex.split(opts.trainer_cmd) if opts.trainer_cmd is not None else None
    if opts.trainer_argv == []:
        parser.error("--trainer-cmd is empty")
    if opts.timeout == 0:
        parser.error("--timeout must be > 0")
    if opts.restart_failed < 0:
        parser.error(f"--restart-failed must be >= 0, got {opts.restart_failed}")
    if opts.restart_failed and opts.checkpoint_every <= 0:
        parser.error("--checkpoint-every must be > 0 with --restart-failed")
    if opts.restart_failed and opts.script_argv is not None:
        parser.error("--restart-failed needs aps-server pservers; a script's pserver role takes no checkpoint flags")
    if opts.metrics_port is not None and (problem := metrics_ports_problem(opts.metrics_port, sum(opts.layout))):
        parser.error(f"--metrics-port {opts.metrics_port}: {problem}")
    return opts, unknown + after


def cluster_of(opts: argparse.Namespace, trainer_args: list[str]) -> LocalCluster:
    """The job aps-local's options describe (checked already by :func:`parse_args`)."""
    servers, trainers = opts.layout
    return LocalCluster(
        servers, trainers, trainer_args=trainer_args, mode=opts.mode, script=opts.script_argv,
        trainer_cmd=opts.trainer_argv, server_args=opts.server_argv, log_dir=opts.log_dir, token=opts.token,
        timeout=opts.timeout, server_grace=opts.server_grace, start_timeout=opts.start_timeout,
        metrics_port=opts.metrics_port, tensorboard=opts.tensorboard, label="aps-local",
        restart_failed=opts.restart_failed,
        checkpoint_every=opts.checkpoint_every, checkpoint_dir=opts.checkpoint_dir,
    )


# ------------------------------------------------------------------------------------ launcher


@dataclass
class Launcher:
    """aps-local's run of a :class:`~aps.launcher.LocalCluster`: the layout first, the
    launcher's lines and status on the board, signals forwarded once, the summary and the first
    failure's log tail at the end; ``run()`` returns aps-local's exit code."""

    opts: argparse.Namespace
    trainer_args: list[str]
    board: Board
    servers: list[Role] = field(default_factory=list)
    trainers: list[Role] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cluster = cluster_of(self.opts, self.trainer_args)

    @property
    def roles(self) -> list[Role]:
        return self.servers + self.trainers

    def plan(self, server_cmd: list[str] | None, trainer_cmd: list[str] | None, port_dir: Path) -> None:
        """Ports, argv and environment of every role; the commands default to this installation's."""
        self.servers, self.trainers = self.cluster.plan(port_dir, server_cmd, trainer_cmd)

    def print_layout(self) -> None:
        n, m = self.opts.layout
        mode = f", mode {self.opts.mode}" if self.opts.mode else ""
        self.board.line(f"aps-local: {n} pserver(s), {m} trainer(s){mode}, logs in {self.opts.log_dir}/")

        def metrics(r: Role) -> str:  # both programs serve on 127.0.0.1 by default under aps-local
            return "" if r.metrics_port is None else f"http://127.0.0.1:{r.metrics_port}/metrics  "

        for r in self.servers:
            self.board.line(f"  {r.name:<11} {r.env['APS_HOST']}:{r.env['APS_PORT']:<7} {metrics(r)}{r.log_path}")
        for r in self.trainers:
            self.board.line(f"  {r.name:<11} {'id ' + str(r.index):<17} {metrics(r)}{r.log_path}")
        if self.trainers:
            self.board.line(f"  trainer.0 command: {shlex.join(self.trainers[0].argv)}")

    async def run(self) -> int:
        sup: Supervisor = self.cluster.supervisor(self.servers, self.trainers, self.board)
        try:
            on_signals(sup.interrupt, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not POSIX
            pass
        timeout = self.opts.timeout
        timer = sup.stop_after(timeout, f"--timeout {timeout:g} s expired, stopping the cluster") if timeout else None
        try:
            code = await sup.run()
        finally:
            if timer is not None:
                timer.cancel()
        self._report(result_of(sup, code))
        return code

    # -- the end

    def _report(self, result: LaunchResult) -> None:
        self.board.line("")
        for row in summary_rows(result):
            self.board.line(row)
        if result.ok:
            self.board.line(f"aps-local: ok, every role exited 0 in {result.seconds:.1f} s")
            return
        if result.reason:
            self.board.line(f"aps-local: {result.reason}; stopped every role", error=True)
        if result.failed:
            self._print_failure(result.failed[0])
        for other in result.failed[1:]:
            self.board.line(f"aps-local: also failed: {other.name} {other.failure} (log: {other.log_path})", error=True)

    def _print_failure(self, role: RoleResult) -> None:
        """The first failure, which usually caused the rest: what, where, and its log's tail."""
        def say(text: str) -> None:
            self.board.line(text, error=True)

        say(f"aps-local: FAILED: {role.name} {role.failure} (log: {role.log_path})")
        if role.kind == "pserver" and any("address already in use" in x.lower() for x in last_lines(role.log_path, 50)):
            say(f"aps-local: {role.name} could not bind its port: another process took it after aps-local chose it "
                "(a race) or --server-args gave one in use; run again")
        tail = role.log_tail(TAIL_LINES)
        say(f"--- last {len(tail)} lines of {role.log_path} ---" if tail else f"--- {role.log_path} is empty ---")
        for line in tail:
            say(f"  {line}")


# ------------------------------------------------------------------------------------ entry


async def _amain(opts: argparse.Namespace, trainer_args: list[str]) -> int:
    launcher = Launcher(opts, trainer_args, Board(sys.stdout, sys.stderr, opts.status_interval))
    port_dir = Path(tempfile.mkdtemp(prefix="aps-local-"))
    try:
        launcher.plan(None, None, port_dir)
        launcher.print_layout()
        return await launcher.run()
    finally:
        launcher.board.close()
        shutil.rmtree(port_dir, ignore_errors=True)


class _BadTrainerArgs(Exception):
    pass


def trainer_args_problem(trainer_args: list[str]) -> str | None:
    """What aps-trainer's own parser would refuse in ``trainer_args`` (a missing --model or
    --data, a bad value), found before any process starts; None when they parse."""
    from .trainer import build_parser as trainer_parser

    if "-h" in trainer_args or "--help" in trainer_args:
        return None
    parser = trainer_parser()

    def fail(message: str) -> None:
        raise _BadTrainerArgs(message)

    parser.error = fail  # type: ignore[method-assign,assignment]
    try:
        parser.parse_args(["--pservers", "127.0.0.1:1", *trainer_args])
    except _BadTrainerArgs as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    opts, trainer_args = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.token_file is not None:
        try:
            opts.token = read_token_file(opts.token_file)
        except ConfigError as exc:
            print(f"aps-local: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    elif opts.token is not None:
        print(f"aps-local: warning: {TOKEN_ON_ARGV}", file=sys.stderr)
    script = opts.script_argv is not None
    if not script and opts.trainer_argv is None and (problem := trainer_args_problem(trainer_args)):
        print(f"aps-local: error: trainer options: {problem} (see aps-trainer --help)", file=sys.stderr)
        return EXIT_USAGE
    try:
        program("aps-server", "aps.cli.server")
        if not script and opts.trainer_argv is None:
            program("aps-trainer", "aps.cli.trainer")
    except ConfigError as exc:
        print(f"aps-local: error: {exc}" + (" (use --trainer-cmd)" if "aps-trainer" in str(exc) else ""), file=sys.stderr)
        return EXIT_USAGE
    try:
        Path(opts.log_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"aps-local: error: cannot create log dir {opts.log_dir}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run_main(_amain(opts, trainer_args))
    except ConfigError as exc:  # found while planning (an absolute --save-dir that cannot be made)
        print(f"aps-local: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def cli() -> None:
    """The aps-local program: :func:`main`, then exit without the interpreter's teardown (every
    role has been reaped by then)."""
    exit_at_once(main())


if __name__ == "__main__":
    cli()
