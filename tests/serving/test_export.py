"""Exports (aps/client/export.py): ``ps.export(root, kind)`` writes versioned base and delta
directories with a manifest and a done marker last; versions go on across clients; a delta is
refused when the chain before it is broken. Real pservers over TCP on port 0."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.digests import file_sha256
from aps.errors import ConfigError
from aps.serving.layout import list_exports, read_manifest

pytestmark = pytest.mark.timeout(60)

DIM = 4
TABLES = (
    aps.HashTable("emb", dim=DIM, optimizer=aps.SGD(lr=0.5), base_threshold=0.0, delta_threshold=0.05),
    aps.SparseTable("fixed", rows=50, dim=DIM, optimizer=aps.SGD(lr=0.5)),
    aps.DenseTable("fc", shape=(3, 5), optimizer=aps.SGD(lr=0.5)),
)


@contextlib.asynccontextmanager
async def cluster(n: int, root: Path) -> AsyncIterator[aps.PSClient]:
    servers = []
    try:
        for k in range(n):
            servers.append(await aps.serve(server_index=k, num_servers=n, checkpoint_root=str(root)))
        async with aps.connect([s.address for s in servers]) as ps:
            for spec in TABLES:
                await ps.create_table(spec)
            yield ps
    finally:
        for s in servers:
            await s.aclose()


async def train(ps: aps.PSClient, keys: list[int]) -> None:
    ids = np.array(keys, np.int64)
    await ps.push_sparse_grad("emb", ids, np.ones((len(ids), DIM), np.float32))
    await ps.push_sparse_grad("fixed", ids % 50, np.ones((len(ids), DIM), np.float32))
    await ps.push_dense_grad("fc", np.ones((3, 5), np.float32))


async def test_base_then_deltas_are_versioned_with_manifest_and_marker(tmp_path: Path) -> None:
    async with cluster(2, tmp_path) as ps:
        await train(ps, [1, 2, 3, -7])
        base = await ps.export("exports", kind="base")
        await train(ps, [3, 99])
        delta = await ps.export("exports", kind="delta")
    assert (base.version, base.kind, base.base_version) == (1, "base", 1)
    assert (delta.version, delta.kind, delta.base_version) == (2, "delta", 1)
    assert base.path == str(tmp_path / "exports" / "00000001-base")
    assert base.keys == {"emb": 4, "fixed": 50, "fc": 15}
    assert delta.keys["emb"] == 2  # only the keys pushed since the base
    found = list_exports(tmp_path / "exports")
    assert [(e.version, e.kind, e.done) for e in found] == [(1, "base", True), (2, "delta", True)]
    manifest = read_manifest(Path(delta.path))
    assert (manifest["version"], manifest["base_version"], manifest["previous_version"]) == (2, 1, 1)
    assert manifest["tables"]["fc"]["shape"] == [3, 5] and manifest["tables"]["emb"]["shape"] == [2, DIM]
    # every file of both shards is listed with its SHA-256, manifests included
    files = sorted(str(p.relative_to(delta.path)) for p in Path(delta.path).rglob("*") if p.is_file())
    assert sorted(manifest["files"]) == [f for f in files if f not in ("export.json", "DONE")]
    for name, digest in manifest["files"].items():
        assert file_sha256(Path(delta.path) / name) == digest


async def test_versions_go_on_across_clients_and_a_delta_needs_a_complete_export_before_it(tmp_path: Path) -> None:
    async with cluster(1, tmp_path) as ps:
        with pytest.raises(ConfigError, match="export kind='base' first"):
            await ps.export(str(tmp_path / "ex"), kind="delta")
        await train(ps, [5])
        assert (await ps.export(str(tmp_path / "ex"), kind="base")).version == 1
    async with cluster(1, tmp_path) as ps:  # new pservers and client: the root says where versions are
        await train(ps, [6])
        assert (await ps.export(str(tmp_path / "ex"), kind="base")).version == 2
        (tmp_path / "ex" / "00000003-delta").mkdir()  # an export that never finished
        with pytest.raises(ConfigError, match="was not completed"):
            await ps.export(str(tmp_path / "ex"), kind="delta")
        info = await ps.export(str(tmp_path / "ex"), kind="base")
        assert (info.version, info.base_version) == (4, 4)


async def test_a_delta_is_refused_when_another_save_reset_keys_since_the_last_export(tmp_path: Path) -> None:
    async with cluster(2, tmp_path) as ps:
        await train(ps, [1, 2])
        await ps.export("ex", kind="base")
        await train(ps, [3])
        await ps.save("elsewhere", mode="delta")  # resets key 3's delta score: an export would miss it
        with pytest.raises(ConfigError, match="wrote another base or delta save"):
            await ps.export("ex", kind="delta")
        assert [e.done for e in list_exports(tmp_path / "ex")] == [True, False]
        info = await ps.export("ex", kind="base")
        assert info.version == 3 and json.loads((Path(info.path) / "export.json").read_text())["kind"] == "base"


def test_the_client_alone_does_not_import_the_server_for_exports() -> None:
    """aps.client must stay light (aps/__init__.py): export.py takes the server's checkpoint
    code only when an export runs."""
    code = "import sys, aps.client; print(sorted(m for m in sys.modules if m.startswith('aps.server')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
