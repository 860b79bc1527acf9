"""Process hygiene for a trainer's compute workers: die with the trainer, leave Ctrl-C to it."""

from __future__ import annotations

import signal

from ..procs import die_with_parent


def child_signals() -> None:
    """Ctrl-C reaches the whole foreground process group; the parent decides how children stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
