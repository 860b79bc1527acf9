"""Process hygiene for children of aps programs: die with the parent, leave Ctrl-C to it."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies (no orphans even after
    the parent is SIGKILLed). Returns False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except OSError:
        return False


def child_signals() -> None:
    """Ctrl-C reaches the whole foreground process group; the parent decides how children stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
