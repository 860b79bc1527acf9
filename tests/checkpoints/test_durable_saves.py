"""A save makes its files durable in one step, not one fsync per file: a hash table is 1024
files (one per logical shard) and an fsync each took seconds for a table of a few thousand keys."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import aps
from aps import durable
from tests.checkpoints.test_hash_checkpoint import DIM, cluster, spec


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


async def test_a_hash_table_save_does_not_fsync_each_logical_shard_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = np.random.default_rng(3).integers(-(2**62), 2**62, 3000, dtype=np.int64)
    async with cluster(1, tmp_path) as (_, ps):
        await ps.create_table(spec(admit_count=1))
        await ps.push_sparse_grad("emb", keys, np.ones((keys.size, DIM), np.float32))
        before = await ps.pull_sparse("emb", keys)
        calls = _count_fsyncs(monkeypatch)
        await ps.save(str(tmp_path / "ckpt"))
        monkeypatch.undo()
        files = list((tmp_path / "ckpt").rglob("*.npz"))
        assert len(files) > 1000  # one per logical shard (3000 keys leave few of 1024 empty)
        assert len(calls) < 10, len(calls)  # the manifest and the directories, not each file
        await ps.load(str(tmp_path / "ckpt"))
        np.testing.assert_array_equal(await ps.pull_sparse("emb", keys), before)


def test_without_syncfs_every_file_under_the_directory_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    for name in ("x.npy", "a/y.npz", "a/z.npz"):
        (tmp_path / name).write_bytes(b"data")
    monkeypatch.setattr(durable, "_libc_syncfs", lambda: None)
    calls = _count_fsyncs(monkeypatch)
    durable.sync_tree(tmp_path)
    assert len(calls) == 3


@pytest.mark.skipif(durable._libc_syncfs() is None, reason="syncfs(2) is Linux's")
def test_syncfs_is_one_call_for_any_number_of_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in range(50):
        (tmp_path / f"f{k}").write_bytes(b"data")
    calls = _count_fsyncs(monkeypatch)
    durable.sync_tree(tmp_path)
    assert calls == []
