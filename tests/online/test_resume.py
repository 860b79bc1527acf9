"""Pass checkpoints carry the position; resume loads the newest complete one and continues at
the next pass, so what was trained after it (a crash mid-pass) is rolled back and trained once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions

from .models import CountingLR
from .passdata import write_pass

pytestmark = pytest.mark.timeout(90)


def trainer(address: str, save_dir: str) -> Trainer:
    options = TrainOptions(save_dir=save_dir, print_period=0, live_line=False)
    return Trainer(CountingLR(), Strategy(mode="async", workers=1), ClusterSpec([address], 1), 0, options)


async def test_resume_continues_after_the_newest_complete_pass_checkpoint(tmp_path: Path) -> None:
    data, root = tmp_path / "passes", tmp_path / "ckpt"
    root.mkdir()
    write_pass(data, "d1/p1", 0, 16)
    write_pass(data, "d1/p2", 16, 16)
    server = await aps.serve(port=0, checkpoint_root=str(root))
    try:
        first = await trainer(server.address, "online").atrain_passes(PassDir(str(data), wait=0), OnlineOptions())
        assert [p["saved"] for p in first.passes] == ["online/pass-000000", "online/pass-000001"]
        manifest = json.loads((root / "online/pass-000001/shard-00000-of-00001/manifest.json").read_text())
        assert manifest["extra"]["online"] == {"source": "passes", "pass": "d1/p2", "seq": 1}
        # a crash in the middle of pass 3: some of its records reached the pservers, and a later
        # save began but never finished (no manifest)
        async with aps.connect(server.address) as ps:
            await ps.push_sparse_grad("seen", np.arange(32, 40), -np.ones((8, 1), np.float32))
        (root / "online/pass-000002/shard-00000-of-00001").mkdir(parents=True)
        write_pass(data, "d1/p3", 32, 16)
        (data / "_SUCCESS").write_text("")
        again = await trainer(server.address, "online").atrain_passes(PassDir(str(data), wait=0), OnlineOptions(resume=True))
        async with aps.connect(server.address) as ps:
            counts = (await ps.pull_sparse("seen", np.arange(64)))[:, 0]
    finally:
        await server.aclose()
    assert again.resumed_from == "online/pass-000001"
    assert [(p["pass"], p["epoch"]) for p in again.passes] == [("d1/p3", 2)]
    assert counts[:48].tolist() == [1.0] * 48 and not counts[48:].any()  # none lost, none twice


async def test_resume_without_a_checkpoint_starts_at_the_first_pass(tmp_path: Path) -> None:
    write_pass(tmp_path / "passes", "d1/p1", 0, 8)
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        result = await trainer(server.address, "fresh").atrain_passes(
            PassDir(str(tmp_path / "passes"), wait=0), OnlineOptions(resume=True, save_every=0)
        )
    finally:
        await server.aclose()
    assert result.resumed_from is None and [p["pass"] for p in result.passes] == ["d1/p1"]
    assert "saved" not in result.passes[0] and not (tmp_path / "fresh").exists()


async def test_pass_checkpoints_older_than_the_newest_k_are_deleted_and_resume_still_works(tmp_path: Path) -> None:
    data, root = tmp_path / "passes", tmp_path / "ckpt"
    (root / "online" / "pass-000000" / "shard-00000-of-00001").mkdir(parents=True)  # a killed save's leftover
    for k in range(5):
        write_pass(data, f"d1/p{k + 1}", 8 * k, 8)
    server = await aps.serve(port=0, checkpoint_root=str(root))
    try:
        first = await trainer(server.address, "online").atrain_passes(PassDir(str(data), wait=0), OnlineOptions(keep_passes=2))
        assert [p["saved"] for p in first.passes] == [f"online/pass-{k:06d}" for k in range(5)]
        assert sorted(p.name for p in (root / "online").iterdir()) == ["pass-000003", "pass-000004"]
        write_pass(data, "d1/p6", 40, 8)
        (data / "_SUCCESS").write_text("")
        again = await trainer(server.address, "online").atrain_passes(
            PassDir(str(data), wait=0), OnlineOptions(resume=True, keep_passes=0)
        )
        async with aps.connect(server.address) as ps:
            counts = (await ps.pull_sparse("seen", np.arange(64)))[:, 0]
    finally:
        await server.aclose()
    assert again.resumed_from == "online/pass-000004" and [p["pass"] for p in again.passes] == ["d1/p6"]
    assert sorted(p.name for p in (root / "online").iterdir()) == ["pass-000003", "pass-000004", "pass-000005"]  # 0: keep all
    assert counts[:48].tolist() == [1.0] * 48 and not counts[48:].any()


def test_keep_passes_is_a_flag_and_checked() -> None:
    from aps.cli.trainer import build_parser, online_options
    from aps.trainer.online_checkpoints import prune_checkpoints

    args = build_parser().parse_args(["--model", "m", "--data-passes", "r", "--keep-passes", "5"])
    assert online_options(args).keep_passes == 5
    assert online_options(build_parser().parse_args(["--model", "m", "--data-passes", "r"])).keep_passes == 3
    with pytest.raises(aps.ConfigError, match="keep must be >= 1"):
        prune_checkpoints("/nonexistent", 0)
