"""Exports from the pass loop: a base after the first pass and at each new day (after shrinking
the hash tables), a delta after the other passes, each complete (done marker) for aps-serve."""

from __future__ import annotations

from pathlib import Path

import pytest

import aps
from aps.cluster import ClusterSpec
from aps.serving.layout import list_exports
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions
from aps.trainer.online_exports import ExportOptions

from .models import CountingLR
from .passdata import write_pass

pytestmark = pytest.mark.timeout(90)


async def test_a_base_on_the_first_pass_and_each_new_day_deltas_between(tmp_path: Path) -> None:
    data = tmp_path / "passes"
    for k, name in enumerate(["20261126/1", "20261126/2", "20261127/1", "20261127/2", "20261127/3"]):
        write_pass(data, name, 16 * k, 16)
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False)
        trainer = Trainer(CountingLR(), Strategy(mode="async", workers=1), ClusterSpec([server.address], 1), 0, options)
        online = OnlineOptions(export=ExportOptions("exports", delta_every=2))
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), online)
    finally:
        await server.aclose()
    kinds = [p.get("export_kind") for p in result.passes]
    assert kinds == ["base", None, "base", None, "delta"]
    assert "evicted" in result.passes[2] and "evicted" not in result.passes[0]  # shrunk at the day boundary only
    exports = list_exports(tmp_path / "exports")
    assert [(e.version, e.kind, e.done) for e in exports] == [(1, "base", True), (2, "base", True), (3, "delta", True)]
    assert [p["export"] for p in result.passes if "export" in p] == [1, 2, 3]


def test_export_intervals_are_checked() -> None:
    with pytest.raises(aps.ConfigError, match="--delta-every and --base-every must be >= 1"):
        ExportOptions("x", delta_every=0)


def test_aps_trainer_export_flags_make_the_export_options() -> None:
    from aps.cli.trainer import build_parser, online_options

    args = build_parser().parse_args(
        ["--model", "m", "--data-passes", "r", "--export-dir", "exp", "--delta-every", "3", "--base-every", "2"]
    )
    assert online_options(args).export == ExportOptions("exp", delta_every=3, base_every=2)
    assert online_options(build_parser().parse_args(["--model", "m", "--data-passes", "r"])).export is None
