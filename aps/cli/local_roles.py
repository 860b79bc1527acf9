"""aps-local's children: one process per role, started in its own process group, made to die
with aps-local on Linux, signalled as a group, and their logs read back for status lines.
See :mod:`aps.cli.local` for the process model this serves."""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
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
    sent: str | None = None  # the last signal aps-local sent it
    failure: str | None = None  # why it counts as failed; None while it has not
    failed_at: float = 0.0
    listening: bool = False

    @property
    def name(self) -> str:
        return f"{self.kind}.{self.index}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure, self.failed_at = reason, time.monotonic()

    def state(self) -> str:
        if self.proc is None:
            return "failed to start" if self.failure else "not started"
        if self.returncode is None:
            return "running"
        return describe_exit(self.returncode) + (f" (aps-local sent {self.sent})" if self.sent else "")

    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.monotonic()) - self.started


def child_setup() -> Callable[[], None] | None:
    """A preexec_fn that makes the child die with aps-local (Linux PR_SET_PDEATHSIG), or None.

    prctl is resolved here, in the parent, so the child only makes one C call between fork and
    exec. If aps-local died before the call, the child kills itself (the classic race)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    args = (ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), *[ctypes.c_ulong(0)] * 3)

    def setup() -> None:
        prctl(*args)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


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
