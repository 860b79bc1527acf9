"""CPU readings the benchmarks share (Linux /proc): how busy the whole machine was during a run,
and how much CPU one process used, so a row measured while something else competed for the
cores can be marked instead of trusted."""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has used since boot (/proc/stat), None if unknown."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        return (user + nice + system + irq + softirq + steal) / CLK_TCK
    except (OSError, ValueError):
        return None


def process_cpu_seconds(pid: int | None) -> float | None:
    """user+system CPU seconds of process ``pid`` (/proc/PID/stat), None when unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None
