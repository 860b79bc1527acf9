"""A client's save can carry a JSON ``extra`` (an online trainer's position) into every shard's
manifest, for that save only; loading the checkpoint gives it back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.checkpoints.shards import load_shards


def _extras(root: Path) -> list[dict]:
    return [json.loads((root / f"shard-0000{k}-of-00002" / "manifest.json").read_text())["extra"] for k in range(2)]


async def test_save_carries_the_clients_extra_into_every_manifest_for_that_save_only(tmp_path: Path) -> None:
    servers = [await aps.serve(num_trainers=1, server_index=k, num_servers=2, checkpoint_root=str(tmp_path)) for k in range(2)]
    try:
        async with aps.connect([s.address for s in servers]) as ps:
            await ps.create_table(aps.SparseTable("emb", rows=10, dim=2, optimizer=aps.SGD(lr=1.0)))
            await ps.push_sparse_grad("emb", np.arange(10), np.ones((10, 2), np.float32))
            position = {"online": {"source": "passes", "pass": "20261126/0007", "seq": 7}}
            await ps.save("with", extra=position)
            await ps.save("without")
            with pytest.raises(aps.ConfigError, match="JSON"):
                await ps.save("bad", extra={"x": object()})
    finally:
        for s in servers:
            await s.aclose()
    assert _extras(tmp_path / "with") == [position, position]
    assert all("online" not in e for e in _extras(tmp_path / "without"))
    _, extra = load_shards(tmp_path / "with", 0, 1)
    assert extra["online"] == {"source": "passes", "pass": "20261126/0007", "seq": 7}
