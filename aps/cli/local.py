"""aps-local: run a whole cluster (N pservers, M trainers) on this machine.

The local equivalent of Paddle's ``fleetrun --server_num N --worker_num M``: pick free ports,
start the pservers, wait until each one listens, start the trainers, show a live status, and
make sure that when anything fails everything stops, loudly, with the failing log's tail.

Process model (the two choices that make "no orphans, no double signals" hold):

* Every child runs in its **own session / process group** (``start_new_session=True``). A
  terminal Ctrl-C then reaches only aps-local, which forwards exactly one SIGTERM; without this the
  terminal would SIGINT every child *and* aps-local would SIGTERM them again. Owning a group per
  role also lets aps-local signal what a role forked (a trainer's worker pool) with ``killpg``.
* On Linux each child asks for ``PR_SET_PDEATHSIG = SIGKILL`` (``prctl`` through ctypes, in a
  ``preexec_fn``), so even if aps-local is SIGKILLed its direct children die with it instead of
  holding ports forever. SIGKILL, not SIGTERM, because a hung child must not survive either.
  Elsewhere (macOS, ...) the call is skipped: there, only a SIGKILL of aps-local can leak children.
  The death signal follows the *thread* that forked; aps-local forks from its only thread, the
  event loop's.
* Stopping sends SIGTERM to each role's whole group (as a terminal or systemd would), SIGKILL to
  the group after a grace period; a second Ctrl-C skips the grace. At the end, anything still
  running in a role's group (a leaked grandchild) is SIGKILLed and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..cluster import METRICS_FILE_ENV, METRICS_PORT_ENV, PORT_FILE_ENV
from .common import TOKEN_ON_ARGV, read_token_file, run_main
from .local_display import Board, epoch_cells
from .local_roles import Role, child_setup, describe_exit, group_alive, last_lines, signal_group
from .plot import last_epoch_record

MODES = ("sync", "async", "half_async", "geo")
EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 124
STOP_GRACE = 10.0  # SIGTERM -> SIGKILL when a role failed or --timeout expired
INTERRUPT_GRACE = 5.0  # the same after Ctrl-C / SIGTERM: the user is waiting
TTY_REFRESH = 0.5
TAIL_LINES = 10
BIN = Path(__file__).resolve().parents[2] / "bin"

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
APS_METRICS_FILE (LOG_DIR/trainer.K.metrics.jsonl) for the summary. --mode, --trainer-cmd and
--server-args do not apply there: the script's DistributedStrategy picks the mode.

Logs: stdout+stderr of each role go to LOG_DIR/pserver.K.log and LOG_DIR/trainer.K.log
(overwritten on each run). On a terminal one status line is rewritten in place (state of each role,
last line of each trainer's log); otherwise a plain status line is printed every
--status-interval seconds, and one line whenever a role exits. The cluster layout is printed at
start and a summary table at the end: role, pid, exit status, duration, and for trainers the
examples/s, loss (and AUC, for models that predict) of their last finished epoch in this run,
read from their metrics files; then the log.

Metrics: each aps-trainer gets --metrics LOG_DIR/trainer.K.metrics.jsonl (replaced on each run,
like the logs) unless you pass --metrics yourself; `aps-plot LOG_DIR` draws their curves. With
--metrics-port BASE, pserver K gets --metrics-port BASE+K and trainer K --metrics-port BASE+N+K.

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
        help="how long pservers may take to start listening (default 120)")
    add("--metrics-port", type=int, metavar="BASE",
        help="serve live metrics: pserver K on port BASE+K, trainer K on BASE+N+K (default: none)")
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
    if opts.metrics_port is not None:
        last = opts.metrics_port + sum(opts.layout) - 1
        if opts.metrics_port < 1 or last > 65535:
            parser.error(f"--metrics-port {opts.metrics_port}: the ports of all {sum(opts.layout)} roles "
                         f"must lie in 1..65535 (the last would be {last})")
    return opts, unknown + after


def given_metrics(trainer_args: list[str]) -> str | None:
    """The --metrics PATH the user passed to the trainers (the last one wins, as in argparse)."""
    path = None
    for i, arg in enumerate(trainer_args):
        if arg == "--metrics" and i + 1 < len(trainer_args):
            path = trainer_args[i + 1]
        elif arg.startswith("--metrics="):
            path = arg.split("=", 1)[1]
    return path


def program(name: str, module: str) -> list[str] | None:
    """How to run an aps program with this interpreter: the bin/ shim if present, else ``-m``."""
    shim = BIN / name
    if shim.is_file():
        return [sys.executable, str(shim)]
    if importlib.util.find_spec(module) is not None:
        return [sys.executable, "-m", module]
    return None


def script_env(file_var: str, path: Path, metrics_port: int | None) -> dict[str, str]:
    """What a user's script learns from aps-local beyond the cluster (read by aps.fleet): where
    to write its port (pserver) or its metrics records (trainer), and its metrics port."""
    env = {file_var: str(path)}
    if metrics_port is not None:
        env[METRICS_PORT_ENV] = str(metrics_port)
    return env


def script_command(argv: list[str]) -> list[str]:
    """A script run in every role. ``train.py ARGS`` and ``python train.py ARGS`` (or
    ``python3``) run with the interpreter running aps-local, so the script imports the same aps
    whatever ``python`` is first on PATH; any other command runs as given."""
    if argv[0].endswith(".py"):
        return [sys.executable, *argv]
    if argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return argv


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports. All sockets stay open until every port is chosen, so none repeats;
    another process may still take one before the pserver binds it (reported as such)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


# ------------------------------------------------------------------------------------ launcher


@dataclass
class Launcher:
    """Starts the roles, watches them, and stops them; ``run()`` returns aps-local's exit code."""

    opts: argparse.Namespace
    trainer_args: list[str]
    board: Board
    servers: list[Role] = field(default_factory=list)
    trainers: list[Role] = field(default_factory=list)
    stop_code: int | None = None  # set by a signal to aps-local or by --timeout
    stop_reason: str = ""

    def __post_init__(self) -> None:
        self.changed = asyncio.Event()  # set whenever a child exits or a stop is requested
        self.hurry = asyncio.Event()  # a second Ctrl-C: SIGKILL without waiting
        self.began = time.monotonic()
        self.began_wall = time.time()  # metrics records carry unix time
        self.watchers: list[asyncio.Task[None]] = []
        self.stopping = False  # in _stop_all: a signal now only means "hurry"

    @property
    def roles(self) -> list[Role]:
        return self.servers + self.trainers

    # -- building the roles

    def plan(self, server_cmd: list[str], trainer_cmd: list[str], port_dir: Path) -> None:
        num_servers, num_trainers = self.opts.layout
        ports = free_ports(num_servers)
        pservers = ",".join(f"127.0.0.1:{p}" for p in ports)
        log_dir = Path(self.opts.log_dir)
        common = dict(os.environ)
        common.setdefault("PYTHONUNBUFFERED", "1")  # logs stream, so the status shows fresh lines
        common.update(APS_PSERVERS=pservers, PADDLE_PSERVERS_IP_PORT_LIST=pservers, POD_IP="127.0.0.1",
                      APS_TRAINERS=str(num_trainers), PADDLE_TRAINERS_NUM=str(num_trainers))
        if self.opts.token is not None:
            common["APS_TOKEN"] = self.opts.token
        script = self.opts.script_argv
        for k, port in enumerate(ports):
            env = {n: v for n, v in common.items() if n not in ("APS_TRAINER_ID", "PADDLE_TRAINER_ID")}
            env.update(APS_ROLE="pserver", TRAINING_ROLE="PSERVER", APS_HOST="127.0.0.1", APS_PORT=str(port),
                       PADDLE_PORT=str(port), APS_SERVER_INDEX=str(k))
            port_file = port_dir / f"pserver.{k}.port"
            metrics_port = self._metrics_port(k)
            if script is not None:  # the user's script in the pserver role: everything by environment
                env.update(script_env(PORT_FILE_ENV, port_file, metrics_port))
                argv = list(script)
            else:
                argv = [*server_cmd, "--host", "127.0.0.1", "--port", str(port), "--pservers", pservers,
                        "--trainers", str(num_trainers), "--port-file", str(port_file),
                        *self._metrics_port_flag(metrics_port), *self.opts.server_argv]
            self.servers.append(Role("pserver", k, argv, env, log_dir / f"pserver.{k}.log", port_file,
                                     metrics_port=metrics_port))
        mode = ["--mode", self.opts.mode] if self.opts.mode else []
        user_metrics = given_metrics(self.trainer_args)
        for i in range(num_trainers):
            env = {n: v for n, v in common.items() if n not in ("APS_HOST", "APS_PORT", "PADDLE_PORT", "APS_SERVER_INDEX")}
            env.update(APS_ROLE="trainer", TRAINING_ROLE="TRAINER", APS_TRAINER_ID=str(i), PADDLE_TRAINER_ID=str(i))
            metrics_port = self._metrics_port(num_servers + i)
            # aps-trainer's own default (log/ under the cwd) would miss a --log-dir elsewhere, so the
            # file is named here; a --trainer-cmd program may not know the flag, so it is not given one.
            ours = user_metrics is None and self.opts.trainer_argv is None
            metrics = Path(user_metrics) if user_metrics is not None else log_dir / f"trainer.{i}.metrics.jsonl"
            if script is not None:  # fleet.init_worker reads both from the environment
                env.update(script_env(METRICS_FILE_ENV, metrics, metrics_port))
                argv = list(script)
            else:
                argv = [*trainer_cmd, "--pservers", pservers, "--trainers", str(num_trainers), "--trainer-id", str(i),
                        *mode, *(["--metrics", str(metrics)] if ours else []), *self._metrics_port_flag(metrics_port),
                        *self.trainer_args]
            if ours:  # trainers append: this run's numbers only, like the logs
                with contextlib.suppress(OSError):  # unremovable: the trainer will say why it cannot write
                    metrics.unlink(missing_ok=True)
            self.trainers.append(Role("trainer", i, argv, env, log_dir / f"trainer.{i}.log",
                                      metrics_path=metrics, metrics_port=metrics_port))

    def _metrics_port(self, position: int) -> int | None:
        """Role ``position`` (pservers first, then trainers) serves metrics on BASE+position."""
        return None if self.opts.metrics_port is None else self.opts.metrics_port + position

    @staticmethod
    def _metrics_port_flag(port: int | None) -> list[str]:
        return [] if port is None else ["--metrics-port", str(port)]

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

    # -- running

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not POSIX
                pass
        timer = loop.call_later(self.opts.timeout, self._on_timeout) if self.opts.timeout else None
        ticker = asyncio.create_task(self._status_loop())
        try:
            code = await self._supervise()
        finally:
            ticker.cancel()
            if timer is not None:
                timer.cancel()
            await self._stop_all(INTERRUPT_GRACE if self.stop_code in (130, 143, 129) else STOP_GRACE)
            await self._sweep_groups()
        self._report(code)
        return code

    async def _supervise(self) -> int:
        for role in self.servers:
            await self._spawn(role)
        await self._wait_until(self._all_listening, self.opts.start_timeout, poll=0.05)
        hint = " (does the script call fleet.run_server()?)" if self.opts.script_argv is not None else ""
        for role in self.servers:
            if not role.listening and role.failure is None and self.stop_code is None:
                role.fail(f"did not start listening within {self.opts.start_timeout:g} s{hint}")
        if (code := self._verdict()) is not None:
            return code
        for role in self.trainers:
            if self._verdict() is not None:
                break  # a stop request or a failure while starting: start no more
            await self._spawn(role)
        await self._wait_until(lambda: not any(r.running for r in self.trainers), None)
        if (code := self._verdict()) is not None:
            return code
        keep_serving = "--no-exit-when-done" in self.opts.server_argv
        grace = 0.0 if keep_serving else self.opts.server_grace
        await self._wait_until(lambda: not any(r.running for r in self.servers), grace)
        if (code := self._verdict()) is not None:
            return code
        for role in self.servers:
            if role.running and not keep_serving:
                role.fail(f"still running {grace:g} s after every trainer finished (did each trainer call worker_done?)")
        return EXIT_FAILED if any(r.failure for r in self.servers) else 0

    def _verdict(self) -> int | None:
        """Why to stop now, as an exit code: a stop request, or a failed role; None to go on."""
        if self.stop_code is not None:
            return self.stop_code
        return EXIT_FAILED if any(r.failure for r in self.roles) else None

    def _all_listening(self) -> bool:
        for role in self.servers:
            if not role.listening and role.port_file is not None and role.port_file.exists():
                role.listening = True
            if not role.listening and role.returncode is not None:
                role.fail(f"{describe_exit(role.returncode)} before listening")
        return all(r.listening for r in self.servers)

    async def _wait_until(self, done: Callable[[], bool], timeout: float | None, poll: float | None = None,
                          stopping: bool = False) -> bool:
        """Sleep until ``done()``, waking on every child exit (and every ``poll`` s); give up at the
        timeout, or (unless ``stopping``) as soon as a role failed or a stop was requested."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if done():
                return True
            if (not stopping and self._verdict() is not None) or (stopping and self.hurry.is_set()):
                return False
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            nap = poll if remaining is None else (remaining if poll is None else min(poll, remaining))
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), nap)
            except TimeoutError:
                pass

    async def _spawn(self, role: Role) -> None:
        role.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(role.log_path, "wb") as log:
                role.proc = await asyncio.create_subprocess_exec(
                    *role.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                    env=role.env, start_new_session=True, preexec_fn=child_setup(),
                )
        except OSError as exc:
            role.fail(f"could not start {shlex.join(role.argv[:1])}: {exc}")
            self.changed.set()
            return
        role.started = time.monotonic()
        self.watchers.append(asyncio.create_task(self._watch(role)))

    async def _watch(self, role: Role) -> None:
        assert role.proc is not None
        role.returncode = await role.proc.wait()
        role.ended = time.monotonic()
        if role.returncode != 0 and role.sent is None:
            early = role.port_file is not None and not role.listening and not role.port_file.exists()
            role.fail(describe_exit(role.returncode) + (" before listening" if early else ""))
        mark = "" if role.returncode == 0 or role.sent else "  <- FAILED"
        self.board.line(f"aps-local: {role.name} exited: {role.state()} after {role.duration():.1f} s{mark}")
        self.changed.set()

    async def _status_loop(self) -> None:
        period = TTY_REFRESH if self.board.tty else self.opts.status_interval
        if period <= 0:
            return
        while True:
            await asyncio.sleep(period)
            self.board.status(self.roles, time.monotonic() - self.began)

    # -- stopping

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stop_code is not None or self.stopping:
            self.hurry.set()
            self.board.line(f"aps-local: {sig.name} again, killing everything", error=True)
        else:
            self.stop_code, self.stop_reason = 128 + sig.value, f"interrupted by {sig.name}"
            self.board.line(f"aps-local: {sig.name}, stopping the cluster ({sig.name} again kills at once)", error=True)
        self.changed.set()

    def _on_timeout(self) -> None:
        if self.stop_code is None:
            self.stop_code, self.stop_reason = EXIT_TIMEOUT, f"timed out after {self.opts.timeout:g} s"
            self.board.line(f"aps-local: --timeout {self.opts.timeout:g} s expired, stopping the cluster", error=True)
            self.changed.set()

    async def _stop_all(self, grace: float) -> None:
        """SIGTERM every running role's group, SIGKILL what is left after ``grace``, reap all."""
        self.stopping = True
        for role in self.roles:
            if role.running:
                role.sent = "SIGTERM"
                signal_group(role, signal.SIGTERM)
        await self._wait_until(lambda: not any(r.running for r in self.roles), grace, stopping=True)
        for role in self.roles:
            if role.running:
                role.sent = "SIGKILL"
                signal_group(role, signal.SIGKILL)
        if self.watchers:
            await asyncio.gather(*self.watchers)

    async def _sweep_groups(self, grace: float = 3.0) -> None:
        """Kill anything a role forked and left behind after the role itself exited.

        Helpers of a role (e.g. multiprocessing's resource tracker) exit a moment after the role
        does, so they get ``grace`` seconds before they count as left behind."""
        deadline = time.monotonic() + grace
        while any(group_alive(r) for r in self.roles) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for role in self.roles:
            if group_alive(role):
                signal_group(role, signal.SIGKILL)
                self.board.line(f"aps-local: {role.name} left processes behind in its group; killed them", error=True)

    # -- the end

    def _report(self, code: int) -> None:
        self._print_summary()
        if code == 0:
            self.board.line(f"aps-local: ok, every role exited 0 in {time.monotonic() - self.began:.1f} s")
            return
        if self.stop_code is not None:
            self.board.line(f"aps-local: {self.stop_reason}; stopped every role", error=True)
        failed = sorted((r for r in self.roles if r.failure), key=lambda r: r.failed_at)
        if failed:
            self._print_failure(failed[0])
        for other in failed[1:]:
            self.board.line(f"aps-local: also failed: {other.name} {other.failure} (log: {other.log_path})", error=True)

    def _print_summary(self) -> None:
        """One row per role; trainers also show their last epoch's numbers (blank without one)."""
        results = {r.name: self._last_epoch(r) for r in self.trainers}
        with_auc = any(e is not None and e.get("auc") is not None for e in results.values())
        head = ("role", "pid", "exit status", "duration", "examples/s", "loss") + (("auc",) if with_auc else ())
        rows = [(*head, "log")]
        for r in self.roles:
            d = r.duration()
            pid = str(r.proc.pid) if r.proc else "-"
            numbers = epoch_cells(results.get(r.name), with_auc)
            rows.append((r.name, pid, r.state(), "-" if d is None else f"{d:.1f} s", *numbers, str(r.log_path)))
        widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
        self.board.line("")
        for row in rows:
            self.board.line("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])

    def _last_epoch(self, role: Role) -> dict[str, Any] | None:
        """The role's last "epoch" record written during this run (wall clock, as the records)."""
        if role.metrics_path is None:
            return None
        return last_epoch_record(role.metrics_path, trainer=role.index, since=self.began_wall)

    def _print_failure(self, role: Role) -> None:
        """The first failure, which usually caused the rest: what, where, and its log's tail."""
        def say(text: str) -> None:
            self.board.line(text, error=True)

        say(f"aps-local: FAILED: {role.name} {role.failure} (log: {role.log_path})")
        if role.kind == "pserver" and any("address already in use" in x.lower() for x in last_lines(role.log_path, 50)):
            say(f"aps-local: {role.name} could not bind its port: another process took it after aps-local chose it "
                "(a race) or --server-args gave one in use; run again")
        tail = last_lines(role.log_path, TAIL_LINES)
        say(f"--- last {len(tail)} lines of {role.log_path} ---" if tail else f"--- {role.log_path} is empty ---")
        for line in tail:
            say(f"  {line}")


# ------------------------------------------------------------------------------------ entry


async def _amain(opts: argparse.Namespace, trainer_args: list[str], server_cmd: list[str], trainer_cmd: list[str]) -> int:
    launcher = Launcher(opts, trainer_args, Board(sys.stdout, sys.stderr))
    port_dir = Path(tempfile.mkdtemp(prefix="aps-local-"))
    try:
        launcher.plan(server_cmd, trainer_cmd, port_dir)
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
    server_cmd = opts.script_argv if script else program("aps-server", "aps.cli.server")
    trainer_cmd = opts.script_argv if script else (opts.trainer_argv or program("aps-trainer", "aps.cli.trainer"))
    if server_cmd is None or trainer_cmd is None:
        missing = "aps-server" if server_cmd is None else "aps-trainer (use --trainer-cmd)"
        print(f"aps-local: error: {missing} is not available in this installation", file=sys.stderr)
        return EXIT_USAGE
    try:
        Path(opts.log_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"aps-local: error: cannot create log dir {opts.log_dir}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run_main(_amain(opts, trainer_args, server_cmd, trainer_cmd))


if __name__ == "__main__":
    sys.exit(main())
