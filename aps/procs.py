"""Die with the parent: the one ``prctl(PR_SET_PDEATHSIG)`` helper of aps.

Every process aps starts (pservers and trainers under the launcher, compute workers under a
trainer) asks Linux to kill it when its parent dies, so no SIGKILL of a parent leaves children
holding ports, memory or shared-memory files. Kept in a module of its own, with no numba and no
asyncio, so that both the launcher and a worker process can use it cheaply.

The death signal follows the *thread* that forked the child: start children from a thread that
lives as long as the parent (the main thread or the event loop's). Elsewhere than Linux the
request is skipped and reported as such (False / None), never faked.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1

Prctl = Callable[..., int]


def _prctl() -> Prctl | None:
    """libc's prctl, or None where there is none (not Linux, or no C library to load)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn: Prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


def _death_signal_args(sig: int) -> tuple[object, ...]:
    return (ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(int(sig)), *[ctypes.c_ulong(0)] * 3)


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask for ``sig`` when this process's parent dies (call it first thing in a child).
    True when the kernel took the request, False where unsupported."""
    prctl = _prctl()
    return prctl is not None and prctl(*_death_signal_args(sig)) == 0


def die_with_parent_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """The same as a ``preexec_fn`` for ``subprocess`` / ``asyncio.create_subprocess_exec``:
    runs in the child between fork and exec. None where unsupported.

    prctl is looked up here, in the parent, so that the child only makes one C call before exec.
    If the parent died before the call took effect, the child kills itself (the classic race:
    the request is only honoured for a parent still alive when it is made)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    args = _death_signal_args(sig)

    def setup() -> None:
        prctl(*args)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return setup
