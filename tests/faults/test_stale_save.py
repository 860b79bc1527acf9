"""A pserver SIGKILLed in the middle of a save leaves its hidden temporary shard directory (as big
as the shard) behind; it is removed when the pserver starts again, and a leftover in another
save's directory is removed at the next save."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from pathlib import Path

import pytest

import aps
from tests.conftest import Processes
from tests.faults.cluster import Cluster, wait_for

SHARD = "shard-00000-of-00001"
#: 128 MiB of values: a save long enough to be killed in the middle of
BIG = aps.SparseTable("big", rows=1 << 21, dim=16, init=aps.Uniform(-1, 1), optimizer=aps.SGD(lr=0.1))


def leftovers(directory: Path) -> list[Path]:
    return sorted(directory.glob(f".{SHARD}.tmp-*")) if directory.exists() else []


def written(directory: Path) -> int:
    """Bytes in the save temporaries of ``directory``."""
    return sum(f.stat().st_size for tmp in leftovers(directory) for f in tmp.rglob("*") if f.is_file())


async def create(address: str) -> None:
    async with aps.connect([address], timeout=120) as ps:
        await ps.create_table(BIG)


async def save(address: str, path: str, deadline: float = 120.0) -> None:
    async with aps.connect([address], timeout=120, deadline=deadline) as ps:
        await ps.save(path)


@pytest.mark.slow
def test_a_save_killed_midway_leaves_nothing_behind_after_a_restart_or_the_next_save(processes: Processes, tmp_path: Path) -> None:
    cluster = Cluster(processes, tmp_path, 1, 1, "--no-exit-when-done")
    address = cluster.addresses[0]
    asyncio.run(create(address))
    epoch0 = tmp_path / "model" / "epoch_0"
    saving = save_in_a_thread(address, "model/epoch_0")
    wait_for(lambda: written(epoch0) >= 8 << 20, 60, "8 MiB in the save's temporary directory", step=0.002)
    cluster.servers[0].send_signal(signal.SIGKILL)
    cluster.servers[0].wait()
    saving.join()
    (stale,) = leftovers(epoch0)
    size = written(epoch0)
    assert not (epoch0 / SHARD).exists()
    cluster.restart_server(0)  # the same checkpoint root (its working directory)
    assert leftovers(epoch0) == [], f"{stale} ({size} bytes) is still there after the restart"
    assert "removed a stale temporary" in cluster.server_log(0, 1).read_text()

    # a leftover in one save's directory goes at the next save, into another directory
    asyncio.run(create(address))
    stale.mkdir()
    (stale / "t0000-big.values.npy").write_bytes(bytes(1 << 20))
    asyncio.run(save(address, "model/epoch_1"))
    assert (tmp_path / "model" / "epoch_1" / SHARD / "manifest.json").is_file()
    assert leftovers(epoch0) == [], "the leftover survived the next save"
    print(f"a killed save left {size / (1 << 20):.1f} MiB; removed at the restart and at the next save")


def save_in_a_thread(address: str, path: str) -> threading.Thread:
    """A client's save, which the pserver's death ends (its deadline is short)."""

    def run() -> None:
        with contextlib.suppress(aps.ApsError):
            asyncio.run(save(address, path, deadline=1.0))

    thread = threading.Thread(target=run)
    thread.start()
    return thread
