"""Every save carries one id on all shards; a checkpoint whose shards come from two saves (a save
killed after some pservers had replaced their shard of an older checkpoint) is refused by name,
both by the loader and by ``aps-server --init-model``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.checkpoints.shards import load_shards
from tests.conftest import BIN


async def _two_saves(tmp_path: Path) -> tuple[Path, Path]:
    servers = [await aps.serve(num_trainers=1, server_index=k, num_servers=2, checkpoint_root=str(tmp_path)) for k in range(2)]
    try:
        async with aps.connect([s.address for s in servers]) as ps:
            await ps.create_table(aps.SparseTable("emb", rows=100, dim=4, optimizer=aps.SGD(lr=1.0)))
            await ps.save(str(tmp_path / "a"))
            await ps.push_sparse_grad("emb", np.arange(100), np.ones((100, 4), np.float32))
            await ps.save(str(tmp_path / "b"))
    finally:
        for s in servers:
            await s.aclose()
    return tmp_path / "a", tmp_path / "b"


async def test_shards_of_one_save_share_an_id_and_a_mix_is_refused(tmp_path: Path) -> None:
    a, b = await _two_saves(tmp_path)
    ids = {d: {json.loads((d / f"shard-0000{k}-of-00002" / "manifest.json").read_text())["save_id"] for k in range(2)} for d in (a, b)}
    assert len(ids[a]) == 1 and len(ids[b]) == 1 and ids[a] != ids[b] and "" not in ids[a] | ids[b]
    tables, _ = load_shards(a, 0, 1)  # complete checkpoints load
    assert tables["emb"].values.shape == (100, 4)
    # the second save got as far as replacing shard 0 of the first, then died
    shutil.rmtree(a / "shard-00000-of-00002")
    shutil.copytree(b / "shard-00000-of-00002", a / "shard-00000-of-00002")
    with pytest.raises(aps.ConfigError, match="shard 1 comes from save .* shard 0 from save .*a save was interrupted"):
        load_shards(a, 0, 1)
    run = subprocess.run(
        [sys.executable, str(BIN / "aps-server"), "--port", "0", "--init-model", str(a)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "a save was interrupted or two saves were mixed" in run.stderr
