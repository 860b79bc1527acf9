"""What a Ray actor does for aps-ray: run one aps role (aps-server or aps-trainer) as a child
process on the node Ray placed the actor on, and answer the driver's questions about it.

The class is plain Python (no ``import ray`` here); :mod:`aps.launcher.ray_driver` turns it into an
actor with ``ray.remote``. The child runs in its own process group and dies with the actor
(Linux ``PR_SET_PDEATHSIG``), so killing the actor, or Ray losing the node, leaves no orphan.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ApsError, ConfigError
from .roles import child_options, describe_exit, last_lines
from ..records import last_epoch_record

#: how a role's program is run: ``python -c`` keeps the working directory on sys.path, so a model
#: named ``package.module:Class`` is found there as it is for ``python -m``
SERVER_MODULE, TRAINER_MODULE = "aps.cli.server", "aps.cli.trainer"
RUN_MAIN = "import sys; from {module} import main; sys.exit(main(sys.argv[1:]))"


class RoleProcess:
    """One role's child process, its log file and its exit, on the actor's node."""

    def __init__(self, name: str, log_dir: str, workdir: str, env: dict[str, str],
                 node_address: Callable[[], str] | None = None) -> None:
        if not os.path.isdir(workdir):
            raise ConfigError(f"{name}: working directory {workdir} does not exist on this node")
        self.name = name
        self.workdir = workdir
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.log_path = Path(log_dir) / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.ended: float | None = None
        self._node_address = node_address

    def host(self) -> str:
        """This node's address as Ray knows it (what other nodes reach it by)."""
        if self._node_address is None:
            import ray.util  # present: this runs inside a Ray actor

            return str(ray.util.get_node_ip_address())
        return self._node_address()

    def _spawn(self, module: str, args: list[str]) -> None:
        if self.proc is not None:
            raise ApsError(f"{self.name} was already started")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", RUN_MAIN.format(module=module), *args], stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, env=self.env, **child_options())
        self.started = time.monotonic()

    def start_server(self, args: list[str], timeout: float = 120.0) -> str:
        """Start aps-server on this node's address and a free port; return ``host:port`` once it
        listens. ApsError naming the role and its log's tail when it exits first or never listens."""
        host = self.host()
        port_file = self.log_path.with_suffix(".port")
        port_file.unlink(missing_ok=True)
        self._spawn(SERVER_MODULE, [*args, "--host", host, "--port", "0", "--port-file", str(port_file)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_file.exists():
                return f"{host}:{int(port_file.read_text())}"
            code = self.poll()
            if code is not None:
                raise ApsError(f"{self.name} {describe_exit(code)} before listening: {self.tail_text()}")
            time.sleep(0.05)
        raise ApsError(f"{self.name} did not listen within {timeout:.0f} s: {self.tail_text()}")

    def start_trainer(self, args: list[str]) -> int:
        """Start aps-trainer; return its pid."""
        self._spawn(TRAINER_MODULE, args)
        assert self.proc is not None
        return self.proc.pid

    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def poll(self) -> int | None:
        """The exit status once the role has exited, else None."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def seconds(self) -> float:
        end = self.ended if self.ended is not None else time.monotonic()
        return end - self.started if self.started else 0.0

    def tail(self, lines: int = 15) -> list[str]:
        return last_lines(self.log_path, lines)

    def tail_text(self, lines: int = 15) -> str:
        return "\n".join(self.tail(lines)) or "(empty log)"

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the role's process group, SIGKILL it after ``grace`` seconds; the exit status."""
        if self.proc is None:
            return None
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            if self.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return self.poll()

    def last_epoch(self, metrics_path: str, trainer: int, since: float) -> dict[str, object] | None:
        """The trainer's last "epoch" record (for the summary), read on the node that has it."""
        record = last_epoch_record(Path(self.workdir) / metrics_path, trainer=trainer, since=since)
        return None if record is None else dict(record)
