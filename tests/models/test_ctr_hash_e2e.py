"""CTR-DNN on hash tables (``--model-arg table=hash``) end to end: ``make_data.py`` ->
``aps-local 2x2`` (two pservers, two trainers of two workers each, the model's hybrid mode) ->
``infer.py`` on the test files, beside the fixed table on the same data and settings, one
worker per trainer.

Data: ``make_data.py --scale small`` (slots of at most 3,000 values, so the fixed table's
1,000,001 buckets barely collide and both kinds should learn the same), 100,000 training and
20,000 test lines, seed 7, one epoch, Adam as the reference. The hash table's test AUC must be no
lower than the fixed table's minus ``AUC_TOLERANCE`` (hybrid training is asynchronous across
trainers, so two runs of the same kind differ by a few thousandths). Measured: 0.7919 fixed,
0.7912 hash (0.7685 and 0.7672 with ``--dense-lag 1``, the one-step delayed dense update); in sync mode 1x1, 1x2 and 2x1 the two are within 0.001. With two workers per
trainer hash tables ended 0.003 lower in three runs (0.7750 fixed, 0.7727 hash): a fixed table's replica
is shared, so a worker may compute with rows another worker's later pull refreshed, while a hash
table's rows are the worker's own pull.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

import aps
from aps.client.info import TableInfo
from aps.storage.hash.disk_store import hot_keys
from tests.conftest import ROOT
from tests.models.test_ctr_e2e import _run, infer, train

pytestmark = pytest.mark.timeout(300)

TRAIN_LINES = 100_000
TEST_LINES = 20_000
AUC_TOLERANCE = 0.005
#: the least test AUC of the asynchronous modes on disk tables: async's two workers run ahead
#: of each other, and five runs on 2026-11-29 (this code and the code of a day before alike)
#: made 0.7596-0.7675 (0.7750 once, earlier), half_async 0.7834; the hybrid runs above 0.791
MODE_AUC = 0.75
ARGS = ["lr=0.001", "init_range=0.05"]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ctr_hash") / "data"
    _run(
        [sys.executable, str(ROOT / "examples/ctr_dnn/make_data.py"), "--out", str(out), "--scale", "small",
         "--train-lines", str(TRAIN_LINES), "--test-lines", str(TEST_LINES), "--train-files", "4", "--seed", "7"],
        cwd=out.parent,
    )
    return out


async def _table_info(checkpoint: Path, servers: int) -> TableInfo:
    """The table as the pservers held it: the checkpoint loaded into as many pservers."""
    started = [await aps.serve(server_index=k, num_servers=servers, init_model=str(checkpoint)) for k in range(servers)]
    try:
        async with aps.connect([s.address for s in started]) as ps:
            return await ps.table_info("SparseFeatFactors")
    finally:
        for s in started:
            await s.aclose()


@pytest.mark.slow
def test_ctr_dnn_on_hash_tables_through_aps_local_2x2(tmp_path: Path, small_data: Path) -> None:
    one = ["--workers", "1"]
    fixed_epochs = train(tmp_path, small_data, "2x2", "hybrid", ARGS, epochs=1, save="fixed", trainer_extra=one)
    hash_epochs = train(tmp_path, small_data, "2x2", "hybrid", [*ARGS, "table=hash"], epochs=1, save="hash", trainer_extra=one)
    assert fixed_epochs[0]["examples"] == hash_epochs[0]["examples"] > 0
    fixed = infer(tmp_path, small_data, tmp_path / "fixed" / "epoch_0", ARGS)
    hashed = infer(tmp_path, small_data, tmp_path / "hash" / "epoch_0", [*ARGS, "table=hash"])
    assert fixed["examples"] == hashed["examples"] == TEST_LINES
    print(f"test AUC: fixed {fixed['auc']:.4f}, hash {hashed['auc']:.4f}")
    assert hashed["auc"] >= fixed["auc"] - AUC_TOLERANCE, (fixed, hashed)
    info = asyncio.run(_table_info(tmp_path / "hash" / "epoch_0", 2))
    meta = json.loads((small_data / "meta.json").read_text())
    # every feature value seen in training was admitted (admit_probability 1), and no more
    assert isinstance(info.spec, aps.HashTable)
    assert info.keys == info.admitted > 1000 and info.evicted == 0, info
    assert info.keys <= meta["slots"] * 3001  # at most 3,000 values and the empty one per slot


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "half_async"])
def test_ctr_dnn_on_disk_tables_in_the_asynchronous_modes(mode: str, tmp_path: Path, small_data: Path) -> None:
    """async and half_async end to end on disk tables (``table_disk_ram``: 4 MiB, room in RAM for
    18,421 rows of the ~24,000 keys): the communicator's merged pushes and the pulls meet rows on disk,
    the model learns, and the checkpoint holds every key."""
    args = [*ARGS, "table=hash", f"table_disk_ram={4 << 20}"]
    epochs = train(tmp_path, small_data, "1x1", mode, args, epochs=1, save="disk",
                   extra=["--server-args", f"--data-dir {tmp_path / 'data-dir'}"])
    assert epochs[0]["examples"] == TRAIN_LINES
    scored = infer(tmp_path, small_data, tmp_path / "disk" / "epoch_0", args)
    print(f"{mode} on disk tables: test AUC {scored['auc']:.4f}")
    assert scored["examples"] == TEST_LINES and scored["auc"] >= MODE_AUC, scored
    info = asyncio.run(_table_info(tmp_path / "disk" / "epoch_0", 1))
    assert isinstance(info.spec, aps.HashTable) and info.spec.disk is not None
    assert info.keys == info.admitted > hot_keys(info.spec) and info.evicted == 0, info
    assert info.disk_bytes > 0 and info.ram_bytes <= 4 << 20, info
