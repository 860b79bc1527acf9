"""Exports from the pass loop: a base after the first pass and at each new day (after shrinking
the hash tables), a delta after the other passes, each complete (done marker) for aps-serve; a
key the day tick's shrink evicted is in no later base and no longer served."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.serving.layout import list_exports
from aps.serving.server import serve_exports
from aps.trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions
from aps.trainer.online_exports import ExportOptions

from .models import CountingLR, HashCountingLR
from .passdata import write_pass

pytestmark = pytest.mark.timeout(90)


async def test_a_base_on_the_first_pass_and_each_new_day_deltas_between(tmp_path: Path) -> None:
    data = tmp_path / "passes"
    for k, name in enumerate(["20261126/1", "20261126/2", "20261127/1", "20261127/2", "20261127/3"]):
        write_pass(data, name, 16 * k, 16)
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        metrics = tmp_path / "metrics.jsonl"
        options = TrainOptions(save_dir=None, print_period=0, live_line=False, metrics_path=str(metrics))
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
    records = [r for line in metrics.read_text().splitlines() if (r := json.loads(line))["event"] == "epoch"]
    assert [(r.get("export"), r.get("export_kind")) for r in records] == [(1, "base"), (None, None), (2, "base"), (None, None), (3, "delta")]
    assert records[2]["evicted"] == {} == result.passes[2]["evicted"]  # the metrics file says what the pass did


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
    int8 = build_parser().parse_args(["--model", "m", "--data-passes", "r", "--export-dir", "exp", "--export-rows", "int8"])
    assert online_options(int8).export == ExportOptions("exp", rows="int8")
    with pytest.raises(aps.ConfigError, match="--export-rows int8 says what --export-dir's exports hold: pass --export-dir too"):
        online_options(build_parser().parse_args(["--model", "m", "--data-passes", "r", "--export-rows", "int8"]))
    with pytest.raises(aps.ConfigError, match="--export-rows must be one of stored, int8, got 'int4'"):
        ExportOptions("exp", rows="int4")


def write_lines(root: Path, name: str, lines: list[tuple[int, int, int]]) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "part-00000").write_text("".join(f"{r} {label} {feature}\n" for r, label, feature in lines))
    (folder / "_SUCCESS").write_text("")


async def served_keys(root: Path, keys: np.ndarray) -> tuple[int, int, np.ndarray]:
    """(version, keys held, rows of ``keys``) of the newest base and deltas under ``root``."""
    server = await serve_exports(root, poll=60.0)
    try:
        async with aps.connect([server.address]) as client:
            rows, version = await client.pull_sparse("w", keys, with_version=True)
            return version, (await client.table_info("w")).keys, rows
    finally:
        await server.aclose()


@pytest.mark.slow  # worker processes and two exports of a hash table: ~10 s on a loaded machine
async def test_the_day_ticks_shrink_leaves_evicted_keys_out_of_the_base_and_out_of_serving(tmp_path: Path) -> None:
    data = tmp_path / "passes"
    # day 1: 40 features shown once, never clicked; day 2: 4 features shown 10 times, all clicked
    write_lines(data, "20261126/1", [(i, 0, 100 + i) for i in range(40)])
    write_lines(data, "20261127/1", [(40 + i, 1, 200 + i % 4) for i in range(40)])
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False)
        trainer = Trainer(HashCountingLR(batch_size=40), Strategy(mode="async", workers=1), ClusterSpec([server.address], 1), 0, options)
        # int8 rows: the served rows below hold as they do for rows as stored (dim 1: the code is
        # +-127 and the scale |row| / 127, so a row trained away from 0 is served nonzero)
        export = ExportOptions("exports", rows="int8")
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), OnlineOptions(export=export))
        async with aps.connect([server.address]) as ps:
            held = (await ps.table_info("w")).keys
    finally:
        await server.aclose()
    assert [(p["export"], p["export_kind"]) for p in result.passes] == [(1, "base"), (2, "base")]
    # the tick came before day 2's pass: score 0.1 x 0.98 < 0.8 went, then the day's 4 keys came
    assert [p["keys"]["w"] for p in result.passes] == [40, 4]
    assert result.passes[1]["evicted"] == {"w": 40} and held == 4
    evicted, kept = np.arange(100, 140), np.arange(200, 204)
    first = tmp_path / "first-base-only"
    shutil.copytree(tmp_path / "exports" / "00000001-base", first / "00000001-base")
    version, count, before = await served_keys(first, evicted)
    assert (version, count) == (1, 40) and (before != 0).all()  # trained away from their 0 init
    version, count, after = await served_keys(tmp_path / "exports", np.concatenate([evicted, kept]))
    assert (version, count) == (2, 4)  # the day's base holds the kept keys only
    assert not after[:40].any() and (after[40:] != 0).all()  # evicted keys read their init row again
    manifest = json.loads((tmp_path / "exports" / "00000002-base" / "export.json").read_text())
    assert manifest["tables"]["w"]["rows_as"] == "int8"


@pytest.mark.slow  # worker processes and four exports: ~10 s on a loaded machine
async def test_each_new_day_ticks_the_hash_tables_day_before_its_pass_so_ttl_days_ages_keys(tmp_path: Path) -> None:
    data = tmp_path / "passes"
    for d in range(4):  # one key a day, clicked 10 times: no score rule would ever take it
        write_lines(data, f"2026112{6 + d}/1", [(10 * d + i, 1, 300 + d) for i in range(10)])
    server = await aps.serve(port=0, checkpoint_root=str(tmp_path))
    try:
        options = TrainOptions(save_dir=None, print_period=0, live_line=False)
        model = HashCountingLR(ttl_days=1, batch_size=10)
        trainer = Trainer(model, Strategy(mode="async", workers=1), ClusterSpec([server.address], 1), 0, options)
        # int8 rows: the served rows below hold as they do for rows as stored (dim 1: the code is
        # +-127 and the scale |row| / 127, so a row trained away from 0 is served nonzero)
        export = ExportOptions("exports", rows="int8")
        result = await trainer.atrain_passes(PassDir(str(data), wait=0), OnlineOptions(export=export))
        async with aps.connect([server.address]) as ps:
            held = (await ps.table_info("w")).keys
            rows = (await ps.pull_sparse("w", np.arange(300, 304)))[:, 0]
    finally:
        await server.aclose()
    # day d's key is seen on day d; at the tick to day d + 2 it was unseen for 2 days > ttl_days 1
    assert [p.get("evicted") for p in result.passes] == [None, {"w": 0}, {"w": 1}, {"w": 1}]
    assert [p["keys"]["w"] for p in result.passes] == [1, 2, 2, 2] and held == 2
    assert rows[:2].tolist() == [0.0, 0.0] and (rows[2:] != 0).all()  # 300 and 301 gone, 302 and 303 held
