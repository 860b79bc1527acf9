"""aps-serve is a read-only store: started (a real ``aps-serve`` process) in the checkpoint root
of a real one-pserver job while that pserver is writing a save, it deletes nothing: the save's
temporary directory (``.shard-00000-of-00001.tmp-*``, which a pserver's start-up clean-up would
take for the leftover of a killed save) stays, and the save completes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aps
from aps.checkpoints import kinds as checkpoint_kinds
from tests.conftest import Processes, wait_port_file

pytestmark = pytest.mark.timeout(120)

EMB = aps.HashTable("emb", dim=4, optimizer=aps.SGD(lr=0.5), base_threshold=0.0)
FC = aps.DenseTable("fc", shape=(2, 3), optimizer=aps.SGD(lr=0.5))


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative, sorted: what a start may not change."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_aps_serve_started_in_a_pservers_checkpoint_root_deletes_nothing_of_a_save_in_progress(
    processes: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "job"  # the pserver's checkpoint root, and aps-serve's working directory
    job.mkdir()
    release, writing = threading.Event(), threading.Event()
    write_array = checkpoint_kinds.write_array

    def held_write(*args: Any, **kwargs: Any) -> Any:
        """The save's thread stops after making its temporary, until the test releases it."""
        writing.set()
        assert release.wait(60)
        return write_array(*args, **kwargs)

    server = await aps.serve(checkpoint_root=str(job))
    try:
        async with aps.connect([server.address]) as ps:
            await ps.create_table(EMB)
            await ps.create_table(FC)
            await ps.push_sparse_grad("emb", np.array([1, 2], np.int64), np.ones((2, 4), np.float32))
            await ps.export("ex", kind="base")
            monkeypatch.setattr(checkpoint_kinds, "write_array", held_write)
            save = asyncio.create_task(ps.save("ckpt"))
            try:
                assert await asyncio.to_thread(writing.wait, 60)
                in_progress = list((job / "ckpt").glob(".shard-00000-of-00001.tmp-*"))
                assert len(in_progress) == 1 and not (in_progress[0] / "manifest.json").exists()
                before = tree(job)
                port_file = tmp_path / "serve.port"
                proc = processes.start("aps-serve", str(job / "ex"), "--port-file", str(port_file), cwd=str(job))
                port = await asyncio.to_thread(wait_port_file, port_file, proc)
                async with aps.connect([f"127.0.0.1:{port}"]) as client:  # started and serving
                    assert (await client.pull_sparse("emb", np.array([1], np.int64), with_version=True))[1] == 1
                assert tree(job) == before
                assert in_progress[0].is_dir()
            finally:
                release.set()
            await save
        assert (job / "ckpt" / "shard-00000-of-00001" / "manifest.json").is_file()
        assert list((job / "ckpt").glob(".shard-*")) == []
    finally:
        await server.aclose()
