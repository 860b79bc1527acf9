"""A real redis-server for the stream tests, on a free port, gone after the test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port


class RedisServer:
    """One redis-server process on ``port``, which :meth:`kill` (SIGKILL) and :meth:`start`
    stop and bring back on the same port; ``durable`` ones write every change to their
    append-only file first, so a restarted one holds what the killed one had acknowledged."""

    def __init__(self, directory: Path, durable: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
        self.binary, self.directory, self.port = binary, directory, free_port()
        self.persistence = ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *self.persistence,
             "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A durable redis-server (append-only file, fsync'd every write), killed after the test."""
    server = RedisServer(tmp_path, durable=True)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a fresh redis-server (no persistence)."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server.url
    finally:
        server.kill()
