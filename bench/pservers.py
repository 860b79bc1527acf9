"""What the pserver benchmarks share: aps-server child processes on free ports, their memory
readings, latency percentiles, and the Markdown table + JSON file every benchmark writes.

Imported as ``bench.pservers`` (the scripts put the repository root on ``sys.path``; tests have it
there already).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aps import PServerProcess

MIB = 1 << 20


def memory(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS), RssAnon and RssFile (mapped file pages, e.g. a checkpoint read
    through mmap: counted in RSS, but the kernel can drop them) of process ``pid``, in bytes,
    from /proc/PID/status."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                found[key] = int(rest.split()[0]) * 1024
    return found


def settled_memory(pid: int, quiet: float = 0.6, timeout: float = 20.0) -> dict[str, int]:
    """:func:`memory` of process ``pid`` once its RSS stopped changing for ``quiet`` seconds (at
    most ``timeout`` seconds of waiting): a pserver loads its kernels in a thread as it starts
    (aps/server/warmup.py), and a baseline read while that runs would count it as growth."""
    last = memory(pid)
    still_since = time.monotonic()
    deadline = still_since + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = memory(pid)
        if now["VmRSS"] != last["VmRSS"]:
            still_since = time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return now
        last = now
    return last


def rss_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of process ``pid`` in bytes."""
    found = memory(pid)
    return found["VmRSS"], found["VmHWM"]


@dataclass
class ServerProcess:
    """One ``aps-server`` child process on a free port (``aps.PServerProcess``: ``--port 0
    --port-file``, its own process group, dies with this process), plus its memory readings."""

    server: PServerProcess

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.server.proc

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def log_path(self) -> Path:
        return self.server.log_path

    @classmethod
    def start(cls, workdir: Path, *args: str, name: str = "pserver", env: dict[str, str] | None = None,
              timeout: float = 60.0) -> ServerProcess:
        """``aps-server ARGS`` running in ``workdir``, its output in ``workdir/NAME.log``, once it listens."""
        return cls(PServerProcess.start(*args, log_path=workdir / f"{name}.log", cwd=workdir, env=env, timeout=timeout))

    def rss(self) -> tuple[int, int]:
        return rss_bytes(self.proc.pid)

    def memory(self) -> dict[str, int]:
        return memory(self.proc.pid)

    def alive(self) -> bool:
        return self.server.alive()

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit within 20 s; its exit status."""
        return self.server.stop(grace=20.0)


def percentiles_ms(samples: list[float], qs: tuple[float, ...] = (50, 99)) -> dict[str, float]:
    """``{"p50": ms, "p99": ms, "max": ms, "n": count}`` of latencies in seconds."""
    if not samples:
        return {"n": 0}
    arr = np.asarray(samples) * 1e3
    out = {f"p{q:g}": round(float(np.percentile(arr, q)), 3) for q in qs}
    out["max"] = round(float(arr.max()), 3)
    out["n"] = len(samples)
    return out


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; numbers as given (format them before)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        mem = 0
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "cpu_model": cpu, "memory_bytes": mem, "python": platform.python_version(),
        "numpy": np.__version__, "platform": platform.platform(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],  # > cpus: the numbers were shared
    }


def write_results(path: Path, results: dict[str, Any]) -> None:
    """The benchmark's numbers plus machine info, as indented JSON at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine_info(), **results}, indent=2, default=float) + "\n")
    print(f"\nwrote {path}")


# ----------------------------------------------------------------------------- ping probe


def _ping_child(address: str, token: str | None, interval: float, stop: Any, ready: Any, out: Any) -> None:
    """Body of the probe process: ping ``address`` every ``interval`` seconds until ``stop``."""
    import asyncio

    import aps

    async def run() -> list[tuple[float, float]]:
        samples: list[tuple[float, float]] = []
        async with aps.connect([address], token=token, timeout=None) as ps:
            await ps.ping()
            ready.set()
            while not stop.is_set():
                sent = time.monotonic()
                await ps.ping()
                samples.append((sent, time.monotonic() - sent))
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - sent)))
        return samples

    out.send(asyncio.run(run()))
    out.close()


class PingProbe:
    """Pings a pserver from a process of its own (so the benchmark's own work cannot delay it),
    every ``interval`` seconds, on one connection; ``stop()`` returns ``(sent_at, seconds)`` pairs,
    ``sent_at`` on the system-wide monotonic clock (``time.monotonic()`` of any process). A ping
    the server answers late is one sample with its whole wait."""

    def __init__(self, address: str, token: str | None = None, interval: float = 0.01) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._stop, ready = ctx.Event(), ctx.Event()
        self._out, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_ping_child, args=(address, token, interval, self._stop, ready, child_end), daemon=True)
        self._proc.start()
        child_end.close()
        if not ready.wait(60):
            self._proc.kill()
            raise TimeoutError(f"the ping probe could not reach {address} within 60 s")

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        samples: list[tuple[float, float]] = self._out.recv()
        self._proc.join(30)
        return samples


def window(samples: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """Latencies of the pings sent in [start, end) (monotonic clock)."""
    return [dt for sent, dt in samples if start <= sent < end]
