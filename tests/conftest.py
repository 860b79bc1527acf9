"""Shared fixtures: paths, free ports, and starting real aps processes."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from tests.machine_share import MachineShare, run_directory

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "bin"


def free_port() -> int:
    """A port that a process started next may listen on: one nothing holds now, drawn below the
    kernel's ephemeral range. A port the kernel handed out for port 0 came from that range, where
    a connection or a port-0 listener of the other xdist worker's test could take it before our
    process binds it (a pserver once failed with "address already in use" that way)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10_000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port found in 10000..{low - 1}")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports from :func:`free_port` (two draws may meet: ~20,000 ports to draw from)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return max(low, 10_001)


def wait_port_file(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return int(path.read_text().strip())
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        time.sleep(0.05)
    raise TimeoutError(f"{path} not written within {timeout}s")


async def eventually(check: Callable[[], bool], timeout: float = 30.0, step: float = 0.001) -> None:
    """Wait, polling every ``step`` seconds, until ``check()`` holds (what the event loop serves
    meanwhile makes it true). Waiting on the condition instead of sleeping a fixed time keeps a
    test fast on an idle machine and right on a loaded one; the generous timeout only costs
    time when the test fails. The step is short so a brief state (a save holding the write
    gate) is seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"condition not reached within {timeout} s"
        await asyncio.sleep(step)


class Processes:
    """Starts bin/ programs as real child processes and makes sure none outlives the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, program: str, *args: str, log_name: str | None = None, **kwargs) -> subprocess.Popen:
        log = open(self.tmp / (log_name or f"{program}.{len(self.procs)}.log"), "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.update(kwargs.pop("env", {}))
        proc = subprocess.Popen(
            [sys.executable, str(BIN / program), *args], stdout=log, stderr=subprocess.STDOUT, env=env, **kwargs
        )
        self.procs.append(proc)
        return proc

    def start_servers(self, n: int, trainers: int, *extra: str) -> list[str]:
        """n pservers on free ports; returns their addresses in index order."""
        ports = free_ports(n)
        addresses = [f"127.0.0.1:{p}" for p in ports]
        files = []
        for k, port in enumerate(ports):
            pf = self.tmp / f"port.{k}.{time.monotonic_ns()}"
            files.append(pf)
            self.start(
                "aps-server", "--port", str(port), "--pservers", ",".join(addresses), "--trainers", str(trainers),
                "--port-file", str(pf), *extra, log_name=f"pserver.{k}.{len(self.procs)}.log",
            )
        for pf, proc in zip(files, self.procs[-n:]):
            wait_port_file(pf, proc)
        return addresses

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.cleanup()


_SHARE = pytest.StashKey[MachineShare]()


def pytest_configure(config: pytest.Config) -> None:
    directory = run_directory(config)
    if directory is not None:
        config.stash[_SHARE] = MachineShare(directory)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SHARE in config.stash:
        config.stash[_SHARE].close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under pytest-xdist, a test marked ``alone`` runs with no other worker's test beside it
    (tests/machine_share.py); its setup and teardown count, a module's fixture included."""
    if _SHARE not in item.config.stash:
        yield
        return
    with item.config.stash[_SHARE].hold(alone=item.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """A CLI's main() called in-process configures structlog for its own stderr, which pytest
    closes after the test; later library log lines must not go to that closed stream."""
    yield
    structlog.reset_defaults()
