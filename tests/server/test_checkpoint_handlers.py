"""The checkpoint handlers are an object over a narrow view of the tables, not a part of the
server's core: a save and a load work with any holder of tables (core_checkpoints.Tables), and
the periodic checkpoints are handed one save operation, never the core."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

import aps
from aps import wire
from aps.server.config import ServerConfig
from aps.server.core import ServerCore
from aps.server.core_checkpoints import CheckpointHandlers
from aps.server.gate import WriteGate
from aps.server.stats import ServerStats
from aps.storage.tables import Shard, make_shard

EMB = aps.SparseTable("emb", rows=6, dim=2, init=aps.Constant(0.5), optimizer=aps.SGD(lr=1.0))


class Held:
    """A holder of tables that is not a server: what a checkpoint may read and replace."""

    def __init__(self, tables: dict[str, Shard]) -> None:
        self.tables = tables
        self.installs = 0

    def quiet_locks(self) -> list[asyncio.Lock]:
        return []  # no shard here runs its requests in threads

    def install(self, shards: dict[str, Shard]) -> None:
        self.tables = shards
        self.installs += 1


async def test_save_and_load_through_the_narrow_view_of_the_tables(tmp_path: Path) -> None:
    config = ServerConfig(checkpoint_root=str(tmp_path))
    shard = make_shard(EMB, 0, 1)
    shard.values[:] = np.arange(12, dtype=np.float32).reshape(6, 2)
    source = CheckpointHandlers(config, Held({"emb": shard}), WriteGate(), ServerStats())
    reply = await source.save(wire.Save(path="ck", save_id="s1", mode="base"))
    assert reply == wire.Ok(op=wire.Op.SAVE) and source.base_save_id == "s1"
    assert source.root == str(tmp_path.resolve()) and source.stats.saves == 1

    target_held = Held({})
    target = CheckpointHandlers(config, target_held, WriteGate(), ServerStats())
    assert await target.load(wire.Load(path="ck")) == wire.Ok(op=wire.Op.LOAD)
    assert target_held.installs == 1 and sorted(target_held.tables) == ["emb"]
    np.testing.assert_array_equal(target_held.tables["emb"].values, shard.values)  # type: ignore[union-attr]
    assert target.base_save_id is None and target.resumed is None


def test_the_core_holds_its_checkpoints_and_autosave_names_no_core() -> None:
    assert not issubclass(ServerCore, CheckpointHandlers)
    text = (Path(aps.__file__).parent / "server" / "autosave.py").read_text(encoding="utf-8")
    assert "ServerCore" not in text
