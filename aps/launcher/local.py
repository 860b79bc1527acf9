"""Run aps processes on this machine from Python: a whole job, or pservers alone.

:class:`LocalCluster` (or :func:`launch`) is what ``aps-local NxM`` does, as an API: pick free
ports, start N pservers, wait until each listens, start M trainers (``aps-trainer`` with the
given options, another program, or a user's own script in every role), wait for the end, stop
everything when one role fails, leave no process behind, and return every role's exit status and
its last epoch's numbers. Each role's output goes to ``LOG_DIR/pserver.K.log`` /
``LOG_DIR/trainer.K.log``; the supervision rules are in :mod:`aps.launcher.supervisor`.

:class:`PServerProcess` starts one ``aps-server`` process on a port it picks itself, for
programs (benchmarks, tests) that drive the pservers with their own clients.

Children get the cluster in their environment, in aps's and Paddle's names: APS_PSERVERS /
PADDLE_PSERVERS_IP_PORT_LIST, APS_TRAINERS / PADDLE_TRAINERS_NUM, APS_TRAINER_ID /
PADDLE_TRAINER_ID, APS_ROLE / TRAINING_ROLE, POD_IP, and for pservers PADDLE_PORT / APS_PORT /
APS_SERVER_INDEX; the token only ever as APS_TOKEN, never on a command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cluster import METRICS_FILE_ENV, METRICS_PORT_ENV, PORT_FILE_ENV, TENSORBOARD_ENV
from ..errors import ConfigError, RequestTimeout
from .restart import Restarts
from .roles import Role, child_options, describe_exit, free_ports, last_lines, program
from .supervisor import Quiet, Reporter, Supervisor
from ..records import last_epoch_record
from ..trainer.strategy import MODES


# ------------------------------------------------------------------------------------ helpers


def script_command(argv: Sequence[str]) -> list[str]:
    """A script run in every role. ``train.py ARGS`` and ``python train.py ARGS`` (or
    ``python3``) run with this interpreter, so the script imports the same aps whatever
    ``python`` is first on PATH; any other command runs as given."""
    if not argv:
        raise ConfigError("the script to run in every role is empty")
    if argv[0].endswith(".py"):
        return [sys.executable, *argv]
    if argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)


def given_option(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args``, as ``FLAG VALUE`` or ``FLAG=VALUE`` (the last one
    wins, as in argparse); None when it is not there."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def given_metrics(trainer_args: Sequence[str]) -> str | None:
    """The --metrics PATH the user passed to the trainers."""
    return given_option(trainer_args, "--metrics")


def save_root_args(trainer_args: Sequence[str], server_args: Sequence[str]) -> list[str]:
    """``--checkpoint-root DIR`` for every aps-server when the trainers save to an absolute
    ``--save-dir DIR``: the pservers' own default root, their working directory, would refuse
    it at the first save, after a whole epoch. DIR is made now (a root must exist). Nothing for
    a relative save dir (taken from that working directory, as the trainers expect), for
    ``--no-save``, or when ``server_args`` choose a root."""
    save_dir = given_option(trainer_args, "--save-dir")
    if (save_dir is None or not os.path.isabs(save_dir) or "--no-save" in trainer_args
            or given_option(server_args, "--checkpoint-root") is not None):
        return []
    try:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--save-dir {save_dir}: cannot create it ({exc.strerror or exc})") from None
    return ["--checkpoint-root", save_dir]


def metrics_ports_problem(base: int, roles: int) -> str | None:
    """Why ports BASE .. BASE+roles-1 cannot all be used (one per role); None when they can."""
    last = base + roles - 1
    if base < 1 or last > 65535:
        return f"the ports of all {roles} roles must lie in 1..65535 (the last would be {last})"
    return None


def script_env(file_var: str, path: Path, metrics_port: int | None) -> dict[str, str]:
    """What a user's script learns beyond the cluster (read by aps.fleet): where to write its
    port (pserver) or its metrics records (trainer), and its metrics port."""
    env = {file_var: str(path)}
    if metrics_port is not None:
        env[METRICS_PORT_ENV] = str(metrics_port)
    return env


# ------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class RoleResult:
    """What became of one role: exit status, duration, and (trainers) its last epoch's record."""

    name: str
    kind: str  # "pserver" or "trainer"
    index: int
    pid: int | None  # None: never started
    returncode: int | None
    state: str  # "exit 0", "killed by SIGKILL (aps-local sent SIGKILL)", "not started", ...
    failure: str | None  # why it counts as failed; None when it did not fail
    seconds: float | None
    log_path: Path
    last_epoch: dict[str, Any] | None = None  # the "epoch" metrics record of this run, if any

    def log_tail(self, lines: int = 10) -> list[str]:
        """The last lines of this role's log (colour codes dropped)."""
        return last_lines(self.log_path, lines)


@dataclass(frozen=True)
class LaunchResult:
    """The end of a :class:`LocalCluster` run. ``code`` is aps-local's exit status: 0 every role
    exited 0, 1 a role failed, 124 the timeout expired, 128+N stopped by signal N."""

    code: int
    reason: str  # why it was stopped early ("timed out after 5 s"); "" when nobody stopped it
    seconds: float
    roles: list[RoleResult] = field(default_factory=list)  # pservers, then trainers
    failed: list[RoleResult] = field(default_factory=list)  # in the order they failed: the first is the cause

    @property
    def ok(self) -> bool:
        return self.code == 0

    def role(self, name: str) -> RoleResult:
        """The result of ``"pserver.K"`` or ``"trainer.K"``."""
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)


# ------------------------------------------------------------------------------------ the job


@dataclass(frozen=True)
class LocalCluster:
    """A whole job on this machine: ``servers`` pservers and ``trainers`` trainers.

    Trainers run ``aps-trainer`` with ``trainer_args`` (and ``--mode`` when ``mode`` is set), or
    ``trainer_cmd`` instead, which gets the same arguments; ``script`` is a command run as every
    pserver *and* every trainer with nothing added (its role is in its environment, which
    aps.fleet reads). ``server_args`` go to every ``aps-server``. ``env`` replaces
    ``os.environ`` as the base of every child's environment; ``cwd`` is where they run.
    ``log_dir`` is relative to this process's directory, like ``--metrics`` paths in
    ``trainer_args``. An absolute ``--save-dir`` in ``trainer_args`` is made and becomes every
    aps-server's ``--checkpoint-root`` (unless ``server_args`` name one), so the pservers save there.

    Start the children from a thread that lives as long as this process (the death signal of
    each child follows the thread that forked it; see :mod:`aps.procs`)."""

    servers: int
    trainers: int
    trainer_args: Sequence[str] = ()
    mode: str | None = None
    script: Sequence[str] | None = None
    trainer_cmd: Sequence[str] | None = None
    server_args: Sequence[str] = ()
    log_dir: str | os.PathLike[str] = "log"
    token: str | None = None
    timeout: float | None = None
    server_grace: float = 30.0
    start_timeout: float = 120.0
    metrics_port: int | None = None
    #: TensorBoard: trainer K writes its scalars into tensorboard/trainer-K (one run each)
    tensorboard: str | os.PathLike[str] | None = None
    env: Mapping[str, str] | None = None
    cwd: str | os.PathLike[str] | None = None
    label: str = "aps.launch"  # how its lines and the roles' states name it
    restart_failed: int = 0  # restart a pserver that dies, up to this many times each (aps.launcher.restart)
    checkpoint_every: float = 60.0  # with restart_failed: seconds between each pserver's own checkpoints
    checkpoint_dir: str | os.PathLike[str] | None = None  # with restart_failed: where (default log_dir/checkpoints)

    def __post_init__(self) -> None:
        if self.servers < 1 or self.trainers < 1:
            raise ConfigError(f"need at least 1 pserver and 1 trainer, got {self.servers}x{self.trainers}")
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.script is not None:
            clash = [name for name, given in (("mode", self.mode), ("trainer_cmd", self.trainer_cmd),
                                              ("server_args", self.server_args), ("trainer_args", self.trainer_args))
                     if given]
            if clash:
                raise ConfigError(f"{clash[0]} does not apply to a script run in every role (its DistributedStrategy "
                                  "picks the mode; give the script its own options)")
        if self.trainer_cmd is not None and not self.trainer_cmd:
            raise ConfigError("trainer_cmd is empty")
        if self.restart_failed and self.script is not None:
            raise ConfigError("restart_failed needs aps-server pservers: a script's pserver role takes no "
                              "checkpoint flags")
        self.restarts()  # its settings are checked when it is made
        for name in ("timeout", "start_timeout", "server_grace"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"{name} must be >= 0 seconds, got {value}")
        if self.timeout == 0:
            raise ConfigError("timeout must be > 0 seconds (None: no limit)")
        if self.metrics_port is not None and (problem := metrics_ports_problem(self.metrics_port, self.size)):
            raise ConfigError(f"metrics_port {self.metrics_port}: {problem}")

    @property
    def size(self) -> int:
        return self.servers + self.trainers

    @property
    def keep_serving(self) -> bool:
        """The pservers were told to outlive the trainers (they are stopped, not waited for)."""
        return "--no-exit-when-done" in self.server_args

    def restarts(self) -> Restarts:
        """Fresh restart rules for one run (they count the restarts they grant)."""
        directory = self.checkpoint_dir if self.checkpoint_dir is not None else Path(self.log_dir) / "checkpoints"
        return Restarts(self.restart_failed, self.checkpoint_every, directory, self.mode, self.servers)

    def _metrics_port(self, position: int) -> int | None:
        """Role ``position`` (pservers first, then trainers) serves metrics on BASE+position."""
        return None if self.metrics_port is None else self.metrics_port + position

    def plan(self, port_dir: Path, server_cmd: Sequence[str] | None = None,
             trainer_cmd: Sequence[str] | None = None) -> tuple[list[Role], list[Role]]:
        """The roles to start (pservers, trainers): argv, environment, log and port files.

        ``server_cmd`` / ``trainer_cmd`` default to this installation's aps-server and
        aps-trainer (or ``trainer_cmd`` / ``script`` as configured). Trainers' metrics files
        that aps names are removed here, so the summary shows this run's numbers only."""
        script = None if self.script is None else script_command(self.script)
        server = list(script or server_cmd or program("aps-server", "aps.cli.server"))
        trainer = list(script or trainer_cmd or self.trainer_cmd or program("aps-trainer", "aps.cli.trainer"))
        ports = free_ports(self.servers)
        pservers = ",".join(f"127.0.0.1:{p}" for p in ports)
        log_dir = Path(self.log_dir)
        cwd = None if self.cwd is None else Path(self.cwd)
        common = dict(os.environ if self.env is None else self.env)
        common.setdefault("PYTHONUNBUFFERED", "1")  # logs stream, so a status shows fresh lines
        common.update(APS_PSERVERS=pservers, PADDLE_PSERVERS_IP_PORT_LIST=pservers, POD_IP="127.0.0.1",
                      APS_TRAINERS=str(self.trainers), PADDLE_TRAINERS_NUM=str(self.trainers))
        if self.token is not None:
            common["APS_TOKEN"] = self.token
        save_root = [] if script is not None else save_root_args(self.trainer_args, self.server_args)
        servers: list[Role] = []
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
                argv = [*server, "--host", "127.0.0.1", "--port", str(port), "--pservers", pservers,
                        "--trainers", str(self.trainers), "--port-file", str(port_file),
                        *_metrics_port_flag(metrics_port), *self.restarts().server_args(), *save_root,
                        *self.server_args]
            servers.append(Role("pserver", k, argv, env, log_dir / f"pserver.{k}.log", port_file,
                                metrics_port=metrics_port, launcher=self.label, cwd=cwd))
        mode = ["--mode", self.mode] if self.mode else []
        # aps-trainer waits for its pservers itself, so it starts with them and both start-ups
        # overlap; a user's script or another trainer program may not: those start once every
        # pserver listens
        waits = trainer_cmd is None and self.trainer_cmd is None
        wait_flag = ["--wait-pservers", f"{self.start_timeout:g}"]
        user_metrics = given_metrics(self.trainer_args)
        trainers: list[Role] = []
        for i in range(self.trainers):
            env = {n: v for n, v in common.items() if n not in ("APS_HOST", "APS_PORT", "PADDLE_PORT", "APS_SERVER_INDEX")}
            env.update(APS_ROLE="trainer", TRAINING_ROLE="TRAINER", APS_TRAINER_ID=str(i), PADDLE_TRAINER_ID=str(i))
            metrics_port = self._metrics_port(self.servers + i)
            # aps-trainer's own default (log/ under its cwd) would miss a log_dir elsewhere, so the
            # file is named here; another trainer program may not know the flag, so it gets none.
            ours = user_metrics is None and self.trainer_cmd is None
            metrics = Path(user_metrics) if user_metrics is not None else log_dir / f"trainer.{i}.metrics.jsonl"
            board = None if self.tensorboard is None else str(Path(self.tensorboard) / f"trainer-{i}")
            if script is not None:  # fleet.init_worker reads these from the environment
                env.update(script_env(METRICS_FILE_ENV, metrics, metrics_port))
                if board is not None:
                    env[TENSORBOARD_ENV] = board
                argv = list(script)
            else:
                argv = [*trainer, "--pservers", pservers, "--trainers", str(self.trainers), *(wait_flag if waits else []),
                        "--trainer-id", str(i), *mode, *(["--metrics", str(metrics)] if ours else []),
                        *_metrics_port_flag(metrics_port), *(["--tensorboard", board] if board else []),
                        *self.trainer_args]
            if ours:  # trainers append: this run's numbers only, like the logs
                with contextlib.suppress(OSError):  # unremovable: the trainer will say why it cannot write
                    metrics.unlink(missing_ok=True)
            trainers.append(Role("trainer", i, argv, env, log_dir / f"trainer.{i}.log", metrics_path=metrics,
                                 metrics_port=metrics_port, launcher=self.label, cwd=cwd,
                                 waits_for_pservers=waits and script is None))
        return servers, trainers

    def supervisor(self, servers: list[Role], trainers: list[Role], reporter: Reporter | None = None) -> Supervisor:
        """The supervisor that runs planned roles under this job's rules (timeouts, grace)."""
        return Supervisor(servers, trainers, reporter or Quiet(), label=self.label, start_timeout=self.start_timeout,
                          server_grace=self.server_grace, keep_serving=self.keep_serving,
                          script=self.script is not None, restarts=self.restarts())

    async def arun(self, reporter: Reporter | None = None) -> LaunchResult:
        """Run the job to its end (in this event loop) and say how it ended."""
        port_dir = Path(tempfile.mkdtemp(prefix="aps-local-"))
        try:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
            sup = self.supervisor(*self.plan(port_dir), reporter)
            timer = None if self.timeout is None else sup.stop_after(
                self.timeout, f"timeout of {self.timeout:g} s expired, stopping the cluster")
            try:
                code = await sup.run()
            finally:
                if timer is not None:
                    timer.cancel()
            return result_of(sup, code)
        finally:
            shutil.rmtree(port_dir, ignore_errors=True)

    def run(self, reporter: Reporter | None = None) -> LaunchResult:
        """:meth:`arun` in an event loop of its own (for programs that are not async)."""
        return asyncio.run(self.arun(reporter))


def _metrics_port_flag(port: int | None) -> list[str]:
    return [] if port is None else ["--metrics-port", str(port)]


def last_epoch(role: Role, since: float) -> dict[str, Any] | None:
    """A trainer's last "epoch" record written since ``since`` (unix seconds), from its metrics
    file; None for a pserver or a trainer without one. Read leniently (a trainer killed mid-write
    leaves a partial last line)."""
    if role.kind != "trainer" or role.metrics_path is None:
        return None
    return last_epoch_record(role.metrics_path, trainer=role.index, since=since)


def result_of(sup: Supervisor, code: int) -> LaunchResult:
    """A finished supervisor's roles as a :class:`LaunchResult`."""
    results = {
        r.name: RoleResult(name=r.name, kind=r.kind, index=r.index, pid=None if r.proc is None else r.proc.pid,
                           returncode=r.returncode, state=r.state(), failure=r.failure, seconds=r.duration(),
                           log_path=r.log_path, last_epoch=last_epoch(r, sup.began_wall))
        for r in sup.roles
    }
    failed = sorted((r for r in sup.roles if r.failure is not None), key=lambda r: r.failed_at)
    return LaunchResult(code=code, reason=sup.stop_reason, seconds=time.monotonic() - sup.began,
                        roles=list(results.values()), failed=[results[r.name] for r in failed])


def launch(servers: int, trainers: int, trainer_args: Sequence[str] = (), **options: Any) -> LaunchResult:
    """Run a whole job and wait for it: ``launch(1, 2, ["--model", "ctr_dnn", "--data", D], mode="async")``.
    The keyword options are :class:`LocalCluster`'s. Returns the :class:`LaunchResult`."""
    return LocalCluster(servers, trainers, trainer_args, **options).run()


# ------------------------------------------------------------------------------------ one pserver


@dataclass
class PServerProcess:
    """One ``aps-server`` child process on a port it picked itself (``--port 0 --port-file``).

    Like every launcher child it has its own process group and dies with this process on Linux;
    start it from a thread that lives as long as this process."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    host: str = "127.0.0.1"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, *args: str, log_path: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None,
              env: Mapping[str, str] | None = None, timeout: float = 60.0) -> PServerProcess:
        """Start ``aps-server --port 0 --port-file LOG_PATH.port ARGS`` (output to ``log_path``)
        and wait until it listens: a ConfigError (with its log's tail) if it exits first, a
        RequestTimeout (after killing it) if it does not listen within ``timeout`` seconds.
        ``env`` adds to this process's environment."""
        log = Path(log_path)
        port_file = log.with_suffix(".port")
        port_file.unlink(missing_ok=True)
        argv = [*program("aps-server", "aps.cli.server"), "--port", "0", "--port-file", str(port_file), *args]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, **child_options())
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if proc.poll() is not None:
                tail = " | ".join(last_lines(log, 3))
                raise ConfigError(f"aps-server {describe_exit(proc.returncode)} before listening; see {log}: {tail}")
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RequestTimeout(f"aps-server did not listen within {timeout:g} s; see {log}")
            time.sleep(0.05)
        return cls(proc, int(port_file.read_text().strip()), log)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status once it exits by itself (after every trainer's worker_done); a
        RequestTimeout, after killing it, if it does not within ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RequestTimeout(f"pserver {self.address} still ran {timeout:g} s later; killed it") from None

    def stop(self, grace: float = 20.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit within ``grace`` seconds; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
