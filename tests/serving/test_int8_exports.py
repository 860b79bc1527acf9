"""Exports written with int8 rows (``ps.export(root, kind, rows="int8")``): each hash table's
logical shard file holds its keys, int8 codes and a float32 scale a row, nothing else.

aps-serve serves such an export's rows within half their row's scale of the pserver's rows,
alike with ``--rows exported`` and ``--rows int8`` (the codes are held as written, not quantized
again); a delta's new rows and deleted keys are honoured; fixed and dense tables are exported as
they are; the files are a fraction of an export with the rows as stored; and a pserver refuses to
load such an export (it holds no optimizer state). RAM (float32, float16, bfloat16 values) and disk
hash tables alike, over real TCP."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.checkpoints.shards import check_save_rows
from aps.npyio import load
from aps.serving.server import serve_exports

from .test_int8_rows import DIM, FC, assert_within_half_scale, spread_grads

pytestmark = pytest.mark.timeout(120)

SPECS = {
    "emb": aps.HashTable("emb", dim=DIM, optimizer=aps.Adagrad(lr=0.5), base_threshold=0.0, delta_threshold=0.05),
    "emb16": aps.HashTable("emb16", dim=DIM, optimizer=aps.SGD(lr=1.0), base_threshold=0.0, delta_threshold=0.05, dtype="float16"),
    "embbf": aps.HashTable("embbf", dim=DIM, optimizer=aps.SGD(lr=1.0), base_threshold=0.0, delta_threshold=0.05,
                           dtype="bfloat16"),
    "disk": aps.HashTable("disk", dim=DIM, optimizer=aps.SGD(lr=1.0), base_threshold=0.0, delta_threshold=0.05,
                          disk=aps.Disk(ram_bytes=4 << 20)),
}
FIXED = aps.SparseTable("fixed", rows=50, dim=4, optimizer=aps.SGD(lr=1.0))


def hash_files(export: Path, table: str) -> list[Path]:
    """The logical shard files of ``table`` in an export (one pserver: one shard directory)."""
    (shard,) = export.glob("shard-*")
    entry = json.loads((shard / "manifest.json").read_text())["tables"][table]
    return [shard / name for name in entry["files"].values()]


async def served(root: Path, rows: str, keys: np.ndarray) -> tuple[int, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(version, each hash table's rows of ``keys``, the fixed table, the dense table) as an
    aps-serve with ``--rows rows`` serves the newest export under ``root``."""
    server = await serve_exports(root, poll=60.0, rows=rows)
    try:
        async with aps.connect([server.address]) as client:
            got = {}
            for name in SPECS:
                got[name], version = await client.pull_sparse(name, keys, with_version=True)
            return version, got, await client.pull_sparse("fixed", np.arange(50)), await client.pull_dense("fc")
    finally:
        await server.aclose()


async def test_int8_exports_serve_rows_within_half_a_scale_and_a_delta_drops_its_deleted_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    keys = np.arange(1, 1201, dtype=np.int64)
    first, go, new = keys[:800], keys[600:800], keys[800:1100]  # keys[1100:]: never pushed
    server = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([server.address]) as ps:
            for spec in (*SPECS.values(), FIXED, FC):
                await ps.create_table(spec)
            for name in SPECS:
                await ps.push_sparse_grad(name, first[:600], spread_grads(rng, 600))
                await ps.push_sparse_grad(name, first, spread_grads(rng, len(first)))
            await ps.push_sparse_grad("fixed", np.arange(50), rng.standard_normal((50, 4)).astype(np.float32))
            await ps.push_dense_grad("fc", rng.standard_normal((3, 4)).astype(np.float32))
            base = await ps.export("ex8", kind="base", rows="int8")
            at_base = {name: await ps.pull_sparse(name, keys) for name in SPECS}
            for name in SPECS:  # the keys pushed once score under the threshold
                assert await ps.shrink(name, threshold=0.15) == len(go)
                await ps.push_sparse_grad(name, np.concatenate([first[:100], new]), spread_grads(rng, 100 + len(new)))
            await ps.push_dense_grad("fc", rng.standard_normal((3, 4)).astype(np.float32))
            delta = await ps.export("ex8", kind="delta", rows="int8")
            now = {name: await ps.pull_sparse(name, keys) for name in SPECS}
            fixed, fc = await ps.pull_sparse("fixed", np.arange(50)), await ps.pull_dense("fc")
            stored = await ps.export("ex32", kind="base")
            with pytest.raises(aps.ServerError, match="exported with int8 rows, values only, for aps-serve"):
                await ps.load(str(tmp_path / "ex8" / "00000001-base"))
            assert np.array_equal(await ps.pull_sparse("emb", keys), now["emb"])  # the refused load changed nothing
    finally:
        await server.aclose()

    assert (base.keys["emb"], delta.keys["emb"], stored.keys["emb"]) == (800, 400, 900)
    for name in SPECS:
        files = hash_files(Path(base.path), name)
        for file in files[:8]:
            with load(file) as part:
                assert sorted(part.files) == ["keys", "scales", "values"]
                assert part["values"].dtype == np.int8 and part["scales"].dtype == np.float32
        int8_bytes = sum(f.stat().st_size for f in files)
        stored_bytes = sum(f.stat().st_size for f in hash_files(Path(stored.path), name))
        # 8 + DIM + 4 bytes a key (28) and 3 arrays a file, against the values, the statistics
        # (and Adagrad's state) and 9 or more arrays a file
        assert int8_bytes < 0.5 * stored_bytes * 800 / 900, (name, int8_bytes, stored_bytes)
    manifest = json.loads((Path(base.path) / "export.json").read_text())
    assert {name: manifest["tables"][name]["rows_as"] for name in SPECS} == dict.fromkeys(SPECS, "int8")

    first_base = tmp_path / "base-only"
    first_base.mkdir()
    (first_base / Path(base.path).name).symlink_to(Path(base.path), target_is_directory=True)
    version, rows, _, _ = await served(first_base, "exported", keys)
    assert version == 1
    for name in SPECS:
        assert_within_half_scale(rows[name][:800], at_base[name][:800])
        assert np.array_equal(rows[name][800:], at_base[name][800:])  # not held: the initial rows, exactly

    for rows_option in ("exported", "int8"):
        version, rows, got_fixed, got_fc = await served(tmp_path / "ex8", rows_option, keys)
        assert version == delta.version
        assert np.array_equal(got_fixed, fixed) and np.array_equal(got_fc, fc)  # exported as they are
        for name in SPECS:
            held = np.isin(keys, np.concatenate([first[:600], new]))
            assert_within_half_scale(rows[name][held], now[name][held])
            assert np.array_equal(rows[name][~held], now[name][~held])  # deleted or never pushed: initial rows
        if rows_option == "exported":
            as_exported = rows
        else:  # the codes held as written: both read code x scale
            assert all(np.array_equal(rows[name], as_exported[name]) for name in SPECS)


async def test_int8_rows_are_refused_for_a_full_save_and_an_unknown_rows_value(tmp_path: Path) -> None:
    with pytest.raises(aps.ConfigError, match="int8 rows are for exports .* not a full save"):
        check_save_rows("full", "int8")
    server = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([server.address]) as ps:
            await ps.create_table(SPECS["emb"])
            with pytest.raises(aps.ConfigError, match="export rows must be one of stored, int8, got 'int4'"):
                await ps.export("ex", kind="base", rows="int4")
            with pytest.raises(aps.ServerError, match="int8 rows are for exports"):
                await ps._all(aps.wire.Save(path="full", save_id="x", mode="full", extra="{}", rows_as="int8"), None)
            with pytest.raises(aps.ServerError, match="export rows must be one of stored, int8, got 'int4'"):
                await ps._all(aps.wire.Save(path="b", save_id="x", mode="base", extra="{}", rows_as="int4"), None)
    finally:
        await server.aclose()
    assert not (tmp_path / "full").exists() and not (tmp_path / "b").exists()
