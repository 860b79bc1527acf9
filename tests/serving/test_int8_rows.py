"""aps-serve --rows int8: hash tables' rows held as int8 codes with one float32 scale a row.

Served rows are within half their row's scale of the rows exported in every coordinate, a zero
row reads exact zeros, keys not held read their initial row exactly, a delta's new rows and
deleted keys are honoured, and the table's bytes in STATS are dim + 4 a row plus the index (the
float32 table's index). Real pservers and aps-serve over TCP (in process, and as a process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError, ErrorCode
from aps.server.config import ServerConfig
from aps.serving.model import SERVED_TABLES
from aps.serving.server import ServingServer, serve_exports
from aps.storage.int8_kernels import dequantize_rows, quantize_rows
from tests.conftest import BIN, Processes, wait_port_file

pytestmark = pytest.mark.timeout(120)

DIM = 16
EMB = aps.HashTable("emb", dim=DIM, optimizer=aps.SGD(lr=1.0), base_threshold=0.0, delta_threshold=0.05)
EMB16 = aps.HashTable("emb16", dim=DIM, optimizer=aps.SGD(lr=1.0), base_threshold=0.0, delta_threshold=0.05, dtype="float16")
FC = aps.DenseTable("fc", shape=(3, 4), optimizer=aps.SGD(lr=0.5))


def assert_within_half_scale(served: np.ndarray, exact: np.ndarray) -> None:
    """Every coordinate within scale / 2 of the exact row (scale = max|row| / 127), allowing the
    float32 rounding of code x scale (under 1e-5 x scale); and quantized: not all exact."""
    scale = np.abs(exact).max(axis=1, keepdims=True) / np.float32(127)
    err = np.abs(served - exact)
    worst = np.unravel_index(np.argmax(err - scale * 0.5), err.shape)
    assert (err <= scale * (0.5 + 1e-5)).all(), (worst, err[worst], scale[worst[0]])
    assert (err > 0).any()


def spread_grads(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gradients whose rows differ in size by orders of magnitude (as a model's rows do)."""
    return (rng.standard_normal((n, DIM)) * rng.lognormal(0.0, 3.0, (n, 1))).astype(np.float32)


async def table_stats(client: aps.PSClient) -> dict[str, dict[str, object]]:
    (body,) = (await client.stats()).values()
    return body["tables"]  # type: ignore[no-any-return]


async def test_int8_rows_are_within_half_a_scale_of_the_exported_rows_in_a_quarter_of_the_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-(1 << 62), 1 << 62, 2000, dtype=np.int64))
    zero_key, unknown = keys[:1], np.array([7, -7, 1 << 40], np.int64)  # unknown: never pushed
    server = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([server.address]) as ps:
            for spec in (EMB, EMB16, FC):
                await ps.create_table(spec)
            for name in ("emb", "emb16"):
                await ps.push_sparse_grad(name, keys[1:], spread_grads(rng, len(keys) - 1))
                initial = await ps.pull_sparse(name, zero_key)
                await ps.push_sparse_grad(name, zero_key, initial)  # SGD at lr 1: the row becomes exact zeros
            await ps.push_dense_grad("fc", rng.standard_normal((3, 4)).astype(np.float32))
            await ps.export("ex", kind="base")
            held = {name: await ps.pull_sparse(name, np.concatenate([keys, unknown])) for name in ("emb", "emb16")}
            fc = await ps.pull_dense("fc")
    finally:
        await server.aclose()
    assert not held["emb"][0].any()
    exported = await serve_exports(tmp_path / "ex", poll=60.0)
    int8 = await serve_exports(tmp_path / "ex", poll=60.0, rows="int8")
    try:
        async with aps.connect([exported.address]) as plain, aps.connect([int8.address]) as small:
            for name, rows in held.items():
                assert np.array_equal(await plain.pull_sparse(name, np.concatenate([keys, unknown])), rows)
                served = await small.pull_sparse(name, keys)
                assert_within_half_scale(served[1:], rows[1 : len(keys)])
                assert np.array_equal(served[0], np.zeros(DIM, np.float32)) and not np.signbit(served[0]).any()
                assert np.array_equal(await small.pull_sparse(name, unknown), rows[len(keys) :])  # initial rows, exactly
            assert np.array_equal(await small.pull_dense("fc"), fc)
            plain_tables, small_tables = await table_stats(plain), await table_stats(small)
    finally:
        await exported.aclose()
        await int8.aclose()
    n = len(keys)
    for name in ("emb", "emb16"):
        assert small_tables[name]["keys"] == plain_tables[name]["keys"] == n
        assert (small_tables[name]["rows"], plain_tables[name]["rows"]) == ("int8", "float32")
        # a base's rows fill the slab it is loaded into: the float32 table is n rows of 4 x DIM
        # bytes and its index, which the int8 table has too
        index = plain_tables[name]["bytes"] - n * 4 * DIM
        assert 0 < index <= 80 * n
        assert small_tables[name]["bytes"] == n * (DIM + 4) + index
    assert small_tables["fc"] == plain_tables["fc"] and small_tables["fc"]["rows"] == "float32"


async def served_version(client: aps.PSClient, version: int, keys: np.ndarray) -> np.ndarray:
    """The rows of ``keys`` once ``client`` serves ``version`` (waits 30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            rows, got = await client.pull_sparse("emb", keys, with_version=True)
        except aps.ServerError as exc:  # nothing loaded yet
            assert exc.code == ErrorCode.UNKNOWN_TABLE, exc
            rows, got = None, None
        if got == version:
            return rows
        assert time.monotonic() < deadline, f"version {version} not served within 30 s (serving {got})"
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_an_aps_serve_process_with_int8_rows_applies_a_deltas_rows_and_deleted_keys(
    processes: Processes, tmp_path: Path
) -> None:
    """A delta's new and changed rows replace the held ones (quantized on arrival) and the keys
    it lists as deleted read their initial row again, as on the pserver."""
    rng = np.random.default_rng(8)
    keys = np.arange(1, 301, dtype=np.int64)
    stay, go, new = keys[:150], keys[150:200], keys[200:]
    root = tmp_path / "ex"
    root.mkdir()
    port_file = tmp_path / "serve.port"
    proc = processes.start("aps-serve", str(root), "--rows", "int8", "--poll", "0.05", "--port-file", str(port_file))
    address = f"127.0.0.1:{wait_port_file(port_file, proc)}"
    server = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([server.address]) as ps, aps.connect([address]) as serving:
            await ps.create_table(EMB)
            await ps.push_sparse_grad("emb", stay, spread_grads(rng, len(stay)))
            await ps.push_sparse_grad("emb", np.concatenate([stay, go]), spread_grads(rng, len(stay) + len(go)))
            await ps.export("ex", kind="base")
            assert_within_half_scale(await served_version(serving, 1, keys[:200]), await ps.pull_sparse("emb", keys[:200]))
            assert await ps.shrink("emb", threshold=0.15) == len(go)  # pushed once: score under the threshold
            await ps.push_sparse_grad("emb", np.concatenate([stay[:50], new]), spread_grads(rng, 50 + len(new)))
            delta = await ps.export("ex", kind="delta")
            now = await ps.pull_sparse("emb", keys)
            served = await served_version(serving, delta.version, keys)
            held = np.isin(keys, go, invert=True)
            assert_within_half_scale(served[held], now[held])
            assert np.array_equal(served[~held], now[~held])  # deleted: their initial rows, exactly
            info = await serving.table_info("emb")
            assert info.keys == (await ps.table_info("emb")).keys == len(stay) + len(new)
            assert (await table_stats(serving))["emb"]["rows"] == "int8"
    finally:
        await server.aclose()


def test_rows_misuse_exits_2_with_one_line_and_help_explains_it(tmp_path: Path) -> None:
    serve = [sys.executable, str(BIN / "aps-serve")]
    run = subprocess.run([*serve, str(tmp_path), "--rows", "int4"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["aps-serve: error: --rows int4: not one of exported, int8"]
    text = subprocess.run([*serve, "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--rows {exported,int8}" in text and "max|row| / 127" in text and "scale / 2" in text


def test_the_library_refuses_an_unknown_rows_value_and_rows_with_its_own_served_classes() -> None:
    config = ServerConfig(port=0, exit_when_done=False, trainer_timeout=0.0)
    with pytest.raises(ConfigError, match="rows 'int4': not one of exported, int8"):
        ServingServer("/nonexistent", config, rows="int4")
    with pytest.raises(ConfigError, match="pass one"):
        ServingServer("/nonexistent", config, served=SERVED_TABLES, rows="int8")


def test_kernels_zero_tiny_negated_and_non_finite_rows() -> None:
    """A zero row: scale 0, exact zeros. A row too small for max/127 in float32: still within
    half a scale. A row and its negation: negated codes. A NaN or infinity: a NaN row, counted."""
    values = np.array([np.zeros(4), [1e-44, -1e-44, 0, 5e-45], [0.3, -1.0, 0.5, 1e-3], [-0.3, 1.0, -0.5, -1e-3],
                       [1.0, np.nan, 0, 0], [np.inf, 1, 0, 0]], np.float32)
    codes, scales = np.full((8, 4), 9, np.int8), np.full(8, 9, np.float32)
    rows = np.array([5, 4, 3, 2, 1, 0], np.int64)
    assert quantize_rows(values, rows, codes, scales) == 2
    out = np.full((7, 4), 7, np.float32)
    assert dequantize_rows(codes, scales, np.append(rows, -1), out) == 1
    assert np.array_equal(out[0], np.zeros(4, np.float32)) and scales[5] == 0
    assert_within_half_scale(out[1:4], values[1:4])
    assert np.array_equal(codes[3], -codes[2]) and np.abs(codes[:4]).max() == 127
    assert np.isnan(out[4:6]).all() and np.isnan(scales[[1, 0]]).all()
    assert (out[6] == 7).all()  # a key not held: left for its initial row
