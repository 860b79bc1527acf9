"""The launcher's children: one process per role, started in its own process group, made to die
with the launcher on Linux (:mod:`aps.procs`), signalled as a group, and their logs read back
for status lines. See :mod:`aps.launcher.local` for the process model this serves."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..procs import die_with_parent_preexec

#: where the repository's program shims live (bin/aps-server, bin/aps-trainer), when run from a checkout
BIN = Path(__file__).resolve().parents[2] / "bin"  # the checkout's bin/ (aps/launcher/roles.py)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


# ------------------------------------------------------------------------------------ children


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


@dataclass
class Role:
    """One child process (a pserver or a trainer) and what became of it."""

    kind: str
    index: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port_file: Path | None = None
    metrics_path: Path | None = None  # a trainer's metrics file, for the summary
    metrics_port: int | None = None
    proc: asyncio.subprocess.Process | None = None
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    sent: str | None = None  # the last signal the launcher sent it
    stopped_for: str = ""  # why the launcher stopped it ("trainer.1 failed"); "" when it did not
    failure: str | None = None  # why it counts as failed; None while it has not
    failed_at: float = 0.0
    listening: bool = False
    launcher: str = "aps-local"  # who signals it, as its state says
    cwd: Path | None = None  # where it runs (None: the launcher's own directory)
    #: a trainer that waits for the pservers itself (aps-trainer --wait-pservers): it may start
    #: with them rather than after they listen
    waits_for_pservers: bool = False

    @property
    def name(self) -> str:
        return f"{self.kind}.{self.index}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure, self.failed_at = reason, time.monotonic()

    def saw_listening(self) -> bool:
        """Whether this pserver listens: it wrote its port file (remembered once seen)."""
        if not self.listening and self.port_file is not None and self.port_file.exists():
            self.listening = True
        return self.listening

    def state(self) -> str:
        if self.proc is None:
            return "failed to start" if self.failure else "not started"
        if self.returncode is None:
            return "running"
        if not self.sent:
            return describe_exit(self.returncode)
        # a pserver stopped before it listened looks like one that could not start: say why it was
        early = self.port_file is not None and not self.listening and self.failure is None and self.stopped_for
        why = f" before it listened: {self.stopped_for}" if early else ""
        return describe_exit(self.returncode) + f" ({self.launcher} sent {self.sent}{why})"

    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.monotonic()) - self.started


def program(name: str, module: str) -> list[str]:
    """How to run an aps program with this interpreter: the bin/ shim if present, else ``-m``.
    A ConfigError when neither exists (an installation without the program)."""
    shim = BIN / name
    if shim.is_file():
        return [sys.executable, str(shim)]
    if importlib.util.find_spec(module) is not None:
        return [sys.executable, "-m", module]
    raise ConfigError(f"{name} is not available in this installation")


def child_options() -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen`` / ``asyncio.create_subprocess_exec`` that make
    a child a role: no stdin, its own session and process group (a terminal's Ctrl-C reaches only
    the launcher, which signals each group once), and death with the launcher on Linux."""
    return {"stdin": subprocess.DEVNULL, "start_new_session": True, "preexec_fn": die_with_parent_preexec()}


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


def signal_group(role: Role, sig: signal.Signals) -> None:
    """Signal the role's process group: the role and whatever it forked (e.g. worker pools)."""
    if role.proc is None:
        return
    try:
        if hasattr(os, "killpg"):
            os.killpg(role.proc.pid, sig)
        else:  # pragma: no cover - non-POSIX
            role.proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(role: Role) -> bool:
    """Does anything of the role's process group still run (after the role itself exited)?

    Zombies do not count: what the role forked is re-parented to init, and init in a container
    may reap late or never; a zombie holds no port, memory or CPU."""
    if role.proc is None or not hasattr(os, "killpg"):
        return False
    if os.path.isdir("/proc/self"):
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == role.proc.pid and fields[0] not in ("Z", "X"):
                    return True
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        return False
    try:
        os.killpg(role.proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def last_lines(path: Path, n: int, max_bytes: int = 32768) -> list[str]:
    """The last n non-empty lines of a log, without colour codes; ``\\r`` progress counts as a break."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = _ANSI.sub("", data.decode("utf-8", "replace")).replace("\t", " ")
    lines = [line.rstrip() for line in re.split(r"\r\n|\r|\n", text)]
    if size > max_bytes:
        lines = lines[1:]  # probably cut in the middle
    lines = ["".join(c for c in line if c >= " ") for line in lines]
    return [line for line in lines if line.strip()][-n:]
