"""Restarting a pserver that dies (``aps-local --restart-failed N``, ``LocalCluster(restart_failed=N)``).

Without it, the launcher stops the whole cluster when any role fails. With it, every pserver also
writes its own shard every ``checkpoint_every`` seconds (aps-server --checkpoint-dir), and a
pserver that exits with an error or is killed, while the launcher did not ask it to stop, is
started again at the same address with ``--resume DIR``, at most N times per pserver. The trainers
ride through on their reconnect deadline (120 s); the restarted shard rolls back to its last
checkpoint (docs/operations.md, "Restarting a pserver"). A pserver is not restarted, and fails
the run as before, when it died before listening, before its first checkpoint, after N restarts,
or in sync mode (whose pservers refuse to go on from one shard's rollback).

:class:`~aps.launcher.LocalCluster` puts :meth:`Restarts.server_args` before the pservers' own
``server_args``; the supervisor (supervisor.py) asks :meth:`Restarts.take` when a role exits,
and when that gives a line to show, spawns the role again.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoints.latest import latest_checkpoint
from ..errors import ConfigError
from ..trainer.modes import mode_class
from .roles import Role, describe_exit

#: the pservers' --trainer-timeout under --restart-failed (aps-local's --server-grace is 30 s)
RESTARTED_TRAINER_TIMEOUT = 10.0


class Restarts:
    """Which dead pservers to start again, and with which arguments."""

    def __init__(self, limit: int, every: float, directory: str | os.PathLike[str], mode: str | None,
                 num_servers: int) -> None:
        if limit < 0:
            raise ConfigError(f"--restart-failed must be >= 0, got {limit}")
        if limit and not every > 0:
            raise ConfigError(f"--checkpoint-every must be > 0 with --restart-failed, got {every}")
        self.limit, self.every = limit, every
        self.directory = Path(directory)
        self.mode = mode
        self.num_servers = num_servers
        self.counts: dict[int, int] = {}

    def server_args(self) -> list[str]:
        """Arguments every pserver gets so that it can be restarted (none without the option)."""
        if not self.limit:
            return []
        # a restarted pserver does not know which trainers finished while it was down: it stops
        # waiting for them after the trainer timeout, which must end well within --server-grace
        return ["--checkpoint-dir", str(self.directory), "--checkpoint-every", f"{self.every:g}",
                "--trainer-timeout", f"{RESTARTED_TRAINER_TIMEOUT:g}"]

    def refusal(self, role: Role) -> str | None:
        """Why ``role``, which has just exited, is not to be restarted; None to restart it."""
        if not self.limit or role.kind != "pserver" or role.returncode in (None, 0) or role.sent is not None:
            return "not a pserver that died by itself" if self.limit else "--restart-failed is off"
        if not mode_class(self.mode).resumes_one_shard:
            return f"{self.mode} mode cannot resume one shard alone"
        if not role.listening:
            return "it died before listening"
        if self.counts.get(role.index, 0) >= self.limit:
            return f"restarted {self.limit} time(s) already (--restart-failed {self.limit})"
        if not self.directory.is_dir() or latest_checkpoint(self.directory, role.index, self.num_servers) is None:
            return f"it died before its first checkpoint in {self.directory}"
        return None

    def take(self, role: Role) -> str | None:
        """If ``role`` is to be restarted: count it, make its next start ``--resume`` from the
        checkpoints, reset its process state, and return the line to show; else None."""
        if self.refusal(role) is not None:
            return None
        self.counts[role.index] = self.counts.get(role.index, 0) + 1
        how = describe_exit(role.returncode) if role.returncode is not None else "exited"
        if "--resume" not in role.argv:
            role.argv = [*role.argv, "--resume", str(self.directory)]
        role.proc = None
        role.returncode = None
        role.started = role.ended = None
        return (  # the launcher puts its own name in front
            f"{role.name} {how}; restarting it from its last checkpoint in {self.directory} "
            f"({self.counts[role.index]} of {self.limit})"
        )
