"""The CTR models' batch in online passes: 32 lines a step unless ``batch_size`` is given (a pass
of a few thousand lines at the offline 1000 is a handful of steps; docs/concepts.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import aps
from aps.cluster import ClusterSpec
from aps.models.ctr_dnn.model import CtrDnn
from aps.models.wide_deep.model import WideDeep
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions
from tests.models.test_ctr_step_equality import make_lines, write_meta

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("cls", [WideDeep, CtrDnn])
def test_the_default_batch_is_1000_offline_and_32_online_and_a_given_one_holds_in_both(cls, tmp_path: Path) -> None:
    meta = write_meta(tmp_path / "meta.json")
    default, given = cls(meta=meta), cls(meta=meta, batch_size=256)
    assert (default.batch_size, given.batch_size) == (1000, 256)
    default.begin_online()
    given.begin_online()
    assert (default.batch_size, given.batch_size) == (32, 256)
    assert default.describe()["batch_size"] == 32


@pytest.mark.parametrize("batch_size, steps", [(None, 5), (40, 4)])
async def test_an_online_pass_of_160_lines_takes_the_steps_of_its_batch(batch_size: int | None, steps: int,
                                                                        tmp_path: Path) -> None:
    data = tmp_path / "passes"
    (data / "20261127" / "0001").mkdir(parents=True)
    (data / "20261127" / "0001" / "part-00000").write_text("\n".join(make_lines(4)) + "\n")
    (data / "20261127" / "0001" / "_SUCCESS").write_text("")
    (data / "_SUCCESS").write_text("")
    metrics = tmp_path / "metrics.jsonl"
    args = {} if batch_size is None else {"batch_size": batch_size}
    model = WideDeep(meta=write_meta(tmp_path / "meta.json"), table="hash", **args)
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False, metrics_path=str(metrics))
        trainer = Trainer(model, Strategy(mode="async", workers=1), ClusterSpec([server.address], 1), 0, options)
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), OnlineOptions())
    finally:
        await server.aclose()
    assert [p["examples"] for p in result.passes] == [160]
    epochs = [json.loads(line) for line in metrics.read_text().splitlines() if json.loads(line)["event"] == "epoch"]
    assert [e["steps"] for e in epochs] == [steps]
