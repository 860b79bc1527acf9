"""Sharing the machine between pytest-xdist workers: a test marked ``alone`` runs with no test of
another worker beside it.

A few tests bound a latency (a ping's p99 while a pserver rebuilds a table) that holds on an idle
2-core machine but not while the other worker trains a cluster next to it. A group
(``xdist_group``) would only keep such tests from each other, not from the rest, so every test
holds a shared lock on one file while it runs (setup, call and teardown, so a module's fixture
built for it counts too) and an ``alone`` test holds it exclusively: it waits for the other
workers' current tests to end and they wait for it. A turnstile lock taken before either keeps a
stream of shared holders from starving the exclusive one.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class MachineShare:
    """One worker's side of the lock files under ``directory`` (the same for every worker of one
    run); each instance opens its own descriptors, so two instances in one process exclude each
    other as two processes would."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._turnstile = os.open(directory / "turnstile.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._share = os.open(directory / "share.lock", os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def hold(self, alone: bool) -> Iterator[None]:
        """The machine for one test: exclusively when ``alone``, else beside other shared holders."""
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._share, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._share, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._turnstile)
        os.close(self._share)


def run_directory(config: pytest.Config) -> Path | None:
    """The lock directory of this xdist run, or None outside xdist (one process: nothing to share).
    A worker's base temporary directory is a child of the run's, which pytest removes with its
    old runs."""
    if not hasattr(config, "workerinput"):
        return None
    return Path(config.option.basetemp).parent / "machine-share"
