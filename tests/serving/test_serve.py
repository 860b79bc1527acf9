"""aps-serve's store in process (aps/serving/): it serves what the exports hold, tags replies
with the model version, never loads an export without its marker or with a bad SHA-256, and
refuses every write with READ_ONLY. Real pservers and a real serving server over TCP on port 0;
the follower is driven by ``advance()`` (one look at the root) instead of waiting on its poll."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import aps
from aps import wire
from aps.digests import file_sha256
from aps.errors import ErrorCode, ServerError
from aps.serving.layout import MARKER, read_manifest, write_done
from aps.serving.server import ServingServer, serve_exports
from tests.checkpoints.test_hash_deltas import as_written_before_deletions

pytestmark = pytest.mark.timeout(60)

DIM = 4
EMB = aps.HashTable("emb", dim=DIM, optimizer=aps.SGD(lr=0.5), base_threshold=0.0, delta_threshold=0.05)
FC = aps.DenseTable("fc", shape=(2, 3), optimizer=aps.SGD(lr=0.5))


@contextlib.asynccontextmanager
async def trained(root: Path) -> AsyncIterator[aps.PSClient]:
    server = await aps.serve(checkpoint_root=str(root))
    try:
        async with aps.connect([server.address]) as ps:
            await ps.create_table(EMB)
            await ps.create_table(FC)
            yield ps
    finally:
        await server.aclose()


async def push(ps: aps.PSClient, keys: list[int]) -> None:
    await ps.push_sparse_grad("emb", np.array(keys, np.int64), np.ones((len(keys), DIM), np.float32))
    await ps.push_dense_grad("fc", np.ones((2, 3), np.float32))


@contextlib.asynccontextmanager
async def serving(root: Path) -> AsyncIterator[tuple[ServingServer, aps.PSClient]]:
    server = await serve_exports(root, poll=60.0)  # looks only when the test says: advance()
    try:
        async with aps.connect([server.address]) as client:
            yield server, client
    finally:
        await server.aclose()


async def test_a_half_written_export_is_never_loaded(tmp_path: Path) -> None:
    keys = np.array([1, 2, 3], np.int64)
    async with trained(tmp_path) as ps:
        await push(ps, [1, 2])
        await ps.export("ex", kind="base")
        at_base = await ps.pull_sparse("emb", keys)
        await push(ps, [2, 3])
        delta = await ps.export("ex", kind="delta")
        at_delta = await ps.pull_sparse("emb", keys)
        marker = Path(delta.path) / MARKER
        saved_marker = marker.read_bytes()
        marker.unlink()  # as if still being written: shards and manifest there, no marker
        async with serving(tmp_path / "ex") as (server, client):
            rows, version = await client.pull_sparse("emb", keys, with_version=True)
            assert version == 1 and np.array_equal(rows, at_base)
            assert not await server.advance() and server.version == 1
            # the marker is back, but one of its files is not what the manifest says
            victim = next(p for p in Path(delta.path).rglob("*.npz") if np.load(p)["keys"].size)
            good = victim.read_bytes()
            victim.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
            marker.write_bytes(saved_marker)
            assert not await server.advance() and server.version == 1
            assert "does not match its SHA-256" in server.core.refused[2]
            assert np.array_equal(await client.pull_sparse("emb", keys), at_base)
            stats = (await client.stats())[server.address]["serving"]
            assert stats["version"] == 1 and "2" in stats["refused"]
            # a later base is loaded; the refused delta stays refused
            victim.write_bytes(good)
            await ps.export("ex", kind="base")
            assert await server.advance() and server.version == 3
            assert np.array_equal(await client.pull_sparse("emb", keys), at_delta)


async def test_served_rows_and_versions_follow_base_and_deltas(tmp_path: Path) -> None:
    keys = np.array([5, -9, 1 << 62, 123456], np.int64)  # 123456 is never pushed: its initial row
    async with trained(tmp_path) as ps:
        async with serving(tmp_path / "ex") as (server, client):
            with pytest.raises(ServerError) as none_yet:
                await client.pull_sparse("emb", keys)
            assert none_yet.value.code == ErrorCode.UNKNOWN_TABLE and "no export" in none_yet.value.message
            for kind, pushed in (("base", [5, -9]), ("delta", [1 << 62]), ("delta", [5])):
                await push(ps, pushed)
                info = await ps.export("ex", kind=kind)
                assert await server.advance()
                rows, version = await client.pull_sparse("emb", keys, with_version=True)
                dense, dense_version = await client.pull_dense("fc", with_version=True)
                assert version == dense_version == info.version == client.model_version
                assert np.array_equal(rows, await ps.pull_sparse("emb", keys))
                assert np.array_equal(dense, await ps.pull_dense("fc"))
            assert (await client.table_info("emb")).keys == 3
            # a client that does not ask (one from before the flag) gets the reply of before
            reply = await client._call(0, wire.PullSparse(table="emb", ids=keys))
            assert isinstance(reply, wire.ArrayReply) and reply.model_version is None and reply.version == 3


async def test_every_write_is_refused_as_read_only(tmp_path: Path) -> None:
    async with trained(tmp_path) as ps:
        await push(ps, [1])
        await ps.export("ex", kind="base")
    async with serving(tmp_path / "ex") as (server, client):
        ids = np.array([1], np.int64)
        writes = [
            client.push_sparse_grad("emb", ids, np.ones((1, DIM), np.float32)),
            client.push_sparse_delta("emb", ids, np.ones((1, DIM), np.float32)),
            client.push_dense_grad("fc", np.ones((2, 3), np.float32)),
            client.push_dense_delta("fc", np.ones((2, 3), np.float32)),
            client.create_table(aps.HashTable("other", dim=2)),
            client.save("somewhere"),
            client.load("somewhere"),
            client.shrink("emb"),
            client.barrier("b", count=1),
            client.pull_sparse_changed("emb"),
        ]
        for write in writes:
            with pytest.raises(ServerError) as refused:
                await write
            assert refused.value.code == ErrorCode.READ_ONLY, refused.value
        assert not any(p.name.startswith("somewhere") for p in (tmp_path / "ex").iterdir())
        await client.ping()
        assert (await client.pull_sparse("emb", ids, with_version=True))[1] == 1


async def test_a_token_is_asked_for_as_by_aps_server(tmp_path: Path) -> None:
    async with trained(tmp_path) as ps:
        await push(ps, [1])
        await ps.export("ex", kind="base")
    server = await serve_exports(tmp_path / "ex", token="s3cret")
    try:
        with pytest.raises(aps.TokenMissing):
            async with aps.connect([server.address]) as client:
                await client.ping()
        async with aps.connect([server.address], token="s3cret") as client:
            assert (await client.pull_sparse("emb", np.array([1], np.int64), with_version=True))[1] == 1
    finally:
        await server.aclose()


def as_exported_before_deletions(export: Path) -> None:
    """Make a delta export look like one written before deltas listed deleted keys (no
    ``deleted_keys``, no ``deleted`` counts) and sign it again."""
    as_written_before_deletions(export)
    manifest = read_manifest(export)
    manifest["files"] = {relative: file_sha256(export / relative) for relative in manifest["files"]}
    write_done(export, manifest)


@pytest.mark.parametrize("old_delta", [False, True], ids=["delta", "delta-without-deleted-keys"])
async def test_a_delta_drops_the_keys_deleted_since_the_export_before_it(old_delta: bool, tmp_path: Path) -> None:
    """A key a shrink deleted after the base reads its initial row from the next delta on, as on
    the pserver; one deleted and admitted again reads its new row; the others keep theirs. A delta
    from before deltas listed deletions is applied as before: the deleted key keeps its row."""
    keys = np.array([1, 2, 3, 4, 5], np.int64)  # 5 is never pushed
    async with trained(tmp_path) as ps:
        await push(ps, [1, 2, 3, 4])
        await push(ps, [1, 2])  # scores 0.2 for 1 and 2, 0.1 for 3 and 4
        await ps.export("ex", kind="base")
        at_base = await ps.pull_sparse("emb", keys)
        async with serving(tmp_path / "ex") as (server, client):
            assert np.array_equal(await client.pull_sparse("emb", keys), at_base)
            assert await ps.shrink("emb", threshold=0.15) == 2  # 3 and 4 go (score 0.098 after the decay)
            await push(ps, [4])  # admitted again: its new row is in the delta
            delta = await ps.export("ex", kind="delta")
            now = await ps.pull_sparse("emb", keys)
            assert not np.array_equal(now[2:4], at_base[2:4])
            if old_delta:
                as_exported_before_deletions(Path(delta.path))
                now[2] = at_base[2]  # 3 keeps its row until the next base
            assert await server.advance() and server.version == delta.version
            assert np.array_equal(await client.pull_sparse("emb", keys), now)
            assert (await client.table_info("emb")).keys == (4 if old_delta else 3)
