"""aps-serve never dies of what an export holds: an export whose manifest is malformed (a key
missing, a wrong type, a count of 10^12 keys, a broken version chain) but carries a valid done
marker is refused with its reason (STATS ``refused``), the version served stays, a newer intact
base is loaded after it, a fresh aps-serve whose newest export is such a delta starts and serves
the base, and an ``aps-serve`` process still exits 0 on SIGTERM. A delta that does not follow
the version served (one before it was refused) is listed in STATS ``waiting`` and logged once.
Real pservers export over TCP on port 0; bad exports are real ones copied, edited and re-signed
(layout.write_done)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

import aps
from aps.digests import file_sha256
from aps.serving.layout import MANIFEST, MARKER, export_dir_name, read_manifest, write_done
from aps.serving.server import serve_exports
from tests.conftest import Processes, wait_port_file

pytestmark = pytest.mark.timeout(120)

DIM = 4
TABLES = (
    aps.HashTable("emb", dim=DIM, optimizer=aps.SGD(lr=0.5), base_threshold=0.0, delta_threshold=0.05),
    aps.SparseTable("fixed", rows=20, dim=DIM, optimizer=aps.SGD(lr=0.5)),
    aps.DenseTable("fc", shape=(2, 3), optimizer=aps.SGD(lr=0.5)),
)
KEYS = np.array([1, 2, 3, 77], np.int64)
#: every key an export manifest holds (aps/client/export.py)
MANIFEST_KEYS = (
    "format", "format_version", "version", "kind", "base_version", "previous_version", "save_id", "num_shards",
    "tables", "files", "written_at", "written_at_iso",
)
#: a change to an export's manifest (and the export's directory), returning the manifest to write
Mutation = Callable[[dict[str, Any], Path], Any]


@contextlib.asynccontextmanager
async def trained(root: Path) -> AsyncIterator[aps.PSClient]:
    server = await aps.serve(checkpoint_root=str(root))
    try:
        async with aps.connect([server.address]) as ps:
            for spec in TABLES:
                await ps.create_table(spec)
            yield ps
    finally:
        await server.aclose()


async def push(ps: aps.PSClient, keys: list[int]) -> None:
    ids = np.array(keys, np.int64)
    await ps.push_sparse_grad("emb", ids, np.ones((len(ids), DIM), np.float32))
    await ps.push_sparse_grad("fixed", ids % 20, np.ones((len(ids), DIM), np.float32))
    await ps.push_dense_grad("fc", np.ones((2, 3), np.float32))


async def base_and_delta(ps: aps.PSClient) -> None:
    """Exports 1 (base) and 2 (delta) in ``tmp/ex``."""
    await push(ps, [1, 2])
    await ps.export("ex", kind="base")
    await push(ps, [2, 3])
    await ps.export("ex", kind="delta")


def forge(root: Path, source: int, version: int, kind: str, mutate: Mutation | None = None) -> Path:
    """A copy of export ``source`` as ``version`` of ``kind`` (a base its own base, a delta
    following export 2), its manifest changed by ``mutate`` (which returns the manifest to
    write) and signed again: a valid done marker over what ``mutate`` made."""
    src = next(root.glob(f"{source:08d}-*"))
    target = root / export_dir_name(version, kind)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns(MARKER, MANIFEST))
    manifest = read_manifest(src)
    manifest.update(version=version, kind=kind)
    if kind == "base":
        manifest.update(base_version=version, previous_version=None)
    else:
        manifest.update(base_version=1, previous_version=2)
    write_done(target, manifest if mutate is None else mutate(copy.deepcopy(manifest), target))
    return target


def without(key: str) -> Mutation:
    def mutate(m: dict[str, Any], _: Path) -> Any:
        del m[key]
        return m
    return mutate


def setting(value: Any, *path: str) -> Mutation:
    """``m[path[0]][path[1]]... = value``."""
    def mutate(m: dict[str, Any], _: Path) -> Any:
        node = m
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        return m
    return mutate


def first_file(value: Any) -> Mutation:
    def mutate(m: dict[str, Any], _: Path) -> Any:
        m["files"][sorted(m["files"])[0]] = value
        return m
    return mutate


def shard_manifest(edit: Callable[[dict[str, Any]], None]) -> Mutation:
    """A change to the shard manifest the export holds (with its SHA-256 in ``files`` updated,
    so that only its content is wrong): the shard level's content errors."""
    def mutate(m: dict[str, Any], target: Path) -> Any:
        name = "shard-00000-of-00001/manifest.json"
        path = target / name
        shard = json.loads(path.read_text())
        edit(shard)
        path.write_text(json.dumps(shard))
        m["files"][name] = file_sha256(path)
        return m
    return mutate


def _drop_counts(shard: dict[str, Any]) -> None:
    del shard["tables"]["emb"]["keys"]


def _huge_count(shard: dict[str, Any]) -> None:
    counts = shard["tables"]["emb"]["keys"]
    counts[next(k for k, n in counts.items() if n)] = 10**12


#: (kind, what is wrong, the change, a piece of the reason it is refused with)
CASES: list[tuple[str, str, Mutation, str]] = [
    *((kind, f"no {key}", without(key), f"lacks {key}") for kind in ("base", "delta") for key in MANIFEST_KEYS),
    *(
        (kind, what, mutate, reason)
        for kind in ("base", "delta")
        for what, mutate, reason in (
            ("a list", lambda m, _: [m], "not an object"),
            ("version a string", setting("7", "version"), "version is '7'"),
            ("format_version true", setting(True, "format_version"), "not supported"),
            ("kind unknown", setting("full", "kind"), "kind is 'full'"),
            ("num_shards a string", setting("1", "num_shards"), "num_shards is '1'"),
            ("num_shards 10^12", setting(10**12, "num_shards"), "num_shards is 1000000000000"),
            ("tables a list", setting([], "tables"), "tables is a list"),
            ("files a list", setting(["x"], "files"), "files is ['x']"),
            ("a digest a number", first_file(7), "not 64 hex digits"),
            ("a table a string", setting("x", "tables", "emb"), "table 'emb' is 'x'"),
            ("a spec a list", setting([], "tables", "emb", "spec"), "not an object with a spec"),
            ("keys a string", setting("5", "tables", "emb", "keys"), "keys is '5'"),
            ("keys negative", setting(-1, "tables", "emb", "keys"), "keys is -1"),
            ("10^12 keys", setting(10**12, "tables", "emb", "keys"), "claims 1000000000000 keys, its files hold 2"),
            ("written_at a string", setting("now", "written_at"), "written_at is 'now'"),
            ("another version than its directory", setting(99, "version"), "its directory"),
            ("a shard manifest without counts", shard_manifest(_drop_counts), "malformed (KeyError"),
            ("a shard file claiming 10^12 keys", shard_manifest(_huge_count), "more than its bytes hold"),
        )
    ),
    ("base", "10^12 fixed rows", setting(10**12, "tables", "fixed", "spec", "rows"), "claims 16000000000000 bytes"),
    ("base", "a huge dense shape", setting([10**6, 10**6], "tables", "fc", "spec", "shape"), "claims 4000000000000 bytes"),
    ("base", "a base following a version", setting(1, "previous_version"), "a base is its own base"),
    ("base", "a base of another base", setting(1, "base_version"), "a base is its own base"),
    ("delta", "a delta its own base", lambda m, _: {**m, "base_version": m["version"]}, "cannot be its own base"),
    ("delta", "a delta following itself", lambda m, _: {**m, "previous_version": m["version"]}, "previous_version is"),
    ("delta", "a delta following nothing", setting(None, "previous_version"), "previous_version is None"),
    ("delta", "a delta before its base", setting(0, "previous_version"), "previous_version is 0"),
    ("delta", "a table with another spec", setting(7, "tables", "fixed", "spec", "dim"), "another spec"),
]


async def stats_of(client: aps.PSClient) -> dict[str, Any]:
    return next(iter((await client.stats()).values()))["serving"]  # type: ignore[no-any-return]


async def test_every_malformed_export_is_refused_with_its_reason_and_a_newer_base_loads(tmp_path: Path) -> None:
    root = tmp_path / "ex"
    async with trained(tmp_path) as ps:
        await base_and_delta(ps)
        held = await ps.pull_sparse("emb", KEYS)
        server = await serve_exports(root, poll=60.0)  # looks only when the test says: advance()
        try:
            async with aps.connect([server.address]) as client:
                assert server.version == 2
                version = 2
                for kind, what, mutate, reason in CASES:
                    version += 1
                    forge(root, 1 if kind == "base" else 2, version, kind, mutate)
                    assert not await server.advance(), what
                    assert server.version == 2, what
                    assert reason in server.core.refused.get(version, ""), (what, server.core.refused.get(version))
                rows, served = await client.pull_sparse("emb", KEYS, with_version=True)
                assert served == 2 and np.array_equal(rows, held)
                stats = await stats_of(client)
                assert stats["version"] == 2 and stats["waiting"] == {}
                assert stats["refused"] == {str(v): why for v, why in server.core.refused.items()}
                assert sorted(map(int, stats["refused"])) == list(range(3, version + 1))
                # the same copy, signed unchanged, is applied: what refused each was its change
                version += 1
                forge(root, 2, version, "delta")
                assert await server.advance() and server.version == version
                # a newer intact base, from the pserver, is loaded
                await push(ps, [3, 77])
                info = await ps.export("ex", kind="base")
                assert info.version == version + 1
                assert await server.advance() and server.version == info.version
                rows, served = await client.pull_sparse("emb", KEYS, with_version=True)
                assert served == info.version and np.array_equal(rows, await ps.pull_sparse("emb", KEYS))
                assert np.array_equal(await client.pull_dense("fc"), await ps.pull_dense("fc"))
        finally:
            await server.aclose()


async def test_a_fresh_aps_serve_whose_newest_export_is_a_bad_delta_serves_the_base_before_it(tmp_path: Path) -> None:
    root = tmp_path / "ex"
    async with trained(tmp_path) as ps:
        await base_and_delta(ps)
        held = await ps.pull_sparse("emb", KEYS)
    forge(root, 2, 3, "delta", without("files"))
    server = await serve_exports(root, poll=60.0)
    try:
        assert server.version == 2
        assert "lacks files" in server.core.refused[3]
        async with aps.connect([server.address]) as client:
            rows, served = await client.pull_sparse("emb", KEYS, with_version=True)
            assert served == 2 and np.array_equal(rows, held)
            assert list((await stats_of(client))["refused"]) == ["3"]
    finally:
        await server.aclose()


async def test_a_delta_after_a_refused_one_is_listed_as_waiting_and_logged_once(tmp_path: Path) -> None:
    root = tmp_path / "ex"
    async with trained(tmp_path) as ps:
        await push(ps, [1, 2])
        await ps.export("ex", kind="base")
        at_base = await ps.pull_sparse("emb", KEYS)
        for pushed in ([2, 3], [77]):
            await push(ps, pushed)
            await ps.export("ex", kind="delta")
        # delta 2's rows are not what its manifest says: it is refused, and delta 3 follows it
        victim = next(p for p in (root / export_dir_name(2, "delta")).rglob("*.npz") if np.load(p)["keys"].size)
        good = victim.read_bytes()
        victim.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
        with structlog.testing.capture_logs() as logs:
            server = await serve_exports(root, poll=60.0)
        try:
            async with aps.connect([server.address]) as client:
                with structlog.testing.capture_logs() as later:
                    assert not await server.advance() and not await server.advance()
                assert server.version == 1
                rows, served = await client.pull_sparse("emb", KEYS, with_version=True)
                assert served == 1 and np.array_equal(rows, at_base)
                stats = await stats_of(client)
                assert list(stats["refused"]) == ["2"] and "does not match its SHA-256" in stats["refused"]["2"]
                assert list(stats["waiting"]) == ["3"]
                assert "delta 3 follows version 2, and the model served is version 1" in stats["waiting"]["3"]
                broken = [r for r in logs + later if r["event"] == "export not applied: the version chain is broken"]
                assert [(r["log_level"], r["version"], r["follows"], r["served"]) for r in broken] == [("warning", 3, 2, 1)]
                # a newer base gets the store past it
                info = await ps.export("ex", kind="base")
                assert await server.advance() and server.version == info.version == 4
                stats = await stats_of(client)
                assert stats["waiting"] == {} and list(stats["refused"]) == ["2"]
                assert np.array_equal(await client.pull_sparse("emb", KEYS), await ps.pull_sparse("emb", KEYS))
        finally:
            await server.aclose()


async def test_an_aps_serve_process_goes_on_after_a_bad_export_and_exits_0_on_sigterm(
    processes: Processes, tmp_path: Path
) -> None:
    root = tmp_path / "ex"
    async with trained(tmp_path) as ps:
        await push(ps, [1, 2])
        await ps.export("ex", kind="base")
        held = await ps.pull_sparse("emb", KEYS)
    port_file = tmp_path / "serve.port"
    proc = processes.start("aps-serve", str(root), "--port-file", str(port_file), "--poll", "0.05", "--log-json")
    port = await asyncio.to_thread(wait_port_file, port_file, proc)
    async with aps.connect([f"127.0.0.1:{port}"]) as client:
        assert (await client.pull_sparse("emb", KEYS, with_version=True))[1] == 1
        forge(root, 1, 2, "base", without("files"))
        deadline = time.monotonic() + 20
        while "2" not in (refused := (await stats_of(client))["refused"]):
            assert time.monotonic() < deadline, "the bad export is not refused within 20 s"
            await asyncio.sleep(0.05)
        assert "lacks files" in refused["2"]
        rows, served = await client.pull_sparse("emb", KEYS, with_version=True)
        assert served == 1 and np.array_equal(rows, held)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    records = [json.loads(line) for line in (tmp_path / "aps-serve.0.log").read_text().splitlines() if line.startswith("{")]
    refusals = [r for r in records if r.get("event") == "export refused: not loaded"]
    assert [(r["version"], "lacks files" in r["reason"]) for r in refusals] == [(2, True)]
    assert [r["reason"] for r in records if r.get("event") == "pserver stopped"] == ["signal SIGTERM"]


def test_a_done_marker_is_never_visible_before_it_is_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker is renamed into place whole: an exporter that fails (here: its fsync) while
    writing it leaves no DONE, so no aps-serve polling the root reads an empty or partial marker
    and refuses the export for good (a clean-clone run saw one aps-serve of two do that)."""
    import os

    directory = tmp_path / export_dir_name(1, "base")
    directory.mkdir()
    real_fsync = os.fsync

    def failing_on_the_marker(fd: int) -> None:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name in (MARKER, f".{MARKER}.tmp"):
            raise OSError("disk full")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_on_the_marker)
    with pytest.raises(OSError, match="disk full"):
        write_done(directory, {"version": 1})
    assert (directory / MANIFEST).exists() and not (directory / MARKER).exists()
