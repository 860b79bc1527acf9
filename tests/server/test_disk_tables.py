"""Disk tables (``HashTable(disk=aps.Disk(ram_bytes))``) through real pservers over TCP on port 0:
rows bitwise equal to an all-RAM hash table's after the same pushes while most rows live on disk,
TABLE_INFO's RAM and disk bytes, pings answered while disk requests run, a full save loaded onto
another cluster size, shrinks and base/delta exports equal to an all-RAM table's, the metrics,
and what a disk table refuses."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.storage.hash.disk_store import DiskHashStore

pytestmark = pytest.mark.timeout(180)

DIM = 8
RAM = 4 << 20  # the least a disk table takes: about 36k hot rows of this spec


def spec(disk: bool = True, name: str = "emb") -> aps.HashTable:
    return aps.HashTable(name, dim=DIM, init=aps.Uniform(-0.01, 0.01), optimizer=aps.Adagrad(lr=0.05, rowwise=True),
                         dtype="float16", disk=aps.Disk(ram_bytes=RAM) if disk else None)


@contextlib.asynccontextmanager
async def cluster(n: int, tmp: Path, tag: str) -> AsyncIterator[tuple[list[aps.PServer], aps.PSClient]]:
    servers = []
    try:
        for k in range(n):
            servers.append(await aps.serve(server_index=k, num_servers=n, checkpoint_root=str(tmp),
                                           data_dir=str(tmp / f"data-{tag}-{k}")))
        async with aps.connect([s.address for s in servers]) as ps:
            yield servers, ps
    finally:
        for s in servers:
            await s.aclose()


KEYS = 100_000  # pushes draw from this many keys, about three times one server's hot rows


def traffic(rounds: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pushes of 40k keys and a pull of 5k after each (keys the table lacks among them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rounds):
        keys = rng.integers(0, KEYS, 10_000).astype(np.int64)
        out.append((keys, rng.standard_normal((keys.size, DIM)).astype(np.float32), rng.integers(0, KEYS + 12_500, 1250).astype(np.int64)))
    return out


async def test_rows_equal_an_all_ram_table_and_info_counts_ram_and_disk(tmp_path: Path) -> None:
    # the same table name on two clusters: a key's initial row comes from (table seed, key)
    async with cluster(1, tmp_path, "a") as (servers, ps), cluster(1, tmp_path, "r") as (_, ram_ps):
        await ps.create_table(spec())
        await ram_ps.create_table(spec(disk=False))
        for keys, grads, pulls in traffic(12):
            await ps.push_sparse_grad("emb", keys, grads)
            await ram_ps.push_sparse_grad("emb", keys, grads)
            assert np.array_equal(await ps.pull_sparse("emb", pulls), await ram_ps.pull_sparse("emb", pulls))
        disk, ram = await ps.table_info("emb"), await ram_ps.table_info("emb")
        assert disk.keys == ram.keys > 60_000
        assert disk.disk_bytes > 0 and ram.disk_bytes == 0
        assert disk.ram_bytes <= 2 * RAM
        stores = [s.core.tables["emb"] for s in servers]
        assert all(isinstance(st, DiskHashStore) for st in stores)
        assert disk.keys - sum(len(st.hot) for st in stores) > 15_000  # rows only on disk
        every = np.arange(KEYS, dtype=np.int64)
        assert np.array_equal(await ps.pull_sparse("emb", every), await ram_ps.pull_sparse("emb", every))


async def test_pings_answered_while_disk_requests_run(tmp_path: Path) -> None:
    async with cluster(1, tmp_path, "p") as (_, ps):
        await ps.create_table(spec())
        pushes = traffic(10, seed=1)

        async def work() -> None:
            for keys, grads, pulls in pushes:
                await asyncio.gather(ps.push_sparse_grad("emb", keys, grads), ps.pull_sparse("emb", pulls))

        task = asyncio.create_task(work())
        waits = []
        while not task.done():
            start = time.perf_counter()
            await ps.ping()
            waits.append(time.perf_counter() - start)
            await asyncio.sleep(0.005)
        await task
        assert len(waits) >= 5
        assert float(np.percentile(waits, 99)) < 0.25  # the loop is not held by disk reads


async def test_full_save_loads_onto_another_cluster_size_bitwise(tmp_path: Path) -> None:
    pushes = traffic(8, seed=2)
    async with cluster(1, tmp_path, "s") as (_, ps):
        await ps.create_table(spec())
        for keys, grads, _ in pushes:
            await ps.push_sparse_grad("emb", keys, grads)
        every = np.arange(KEYS, dtype=np.int64)
        before = await ps.pull_sparse("emb", every)
        keys_before = (await ps.table_info("emb")).keys
        await ps.save("ckpt")
    async with cluster(3, tmp_path, "l") as (servers, ps):
        await ps.load("ckpt")
        assert (await ps.table_info("emb")).keys == keys_before
        assert all(isinstance(s.core.tables["emb"], DiskHashStore) for s in servers)
        assert np.array_equal(await ps.pull_sparse("emb", every), before)
    # read offline (infer.py's way): the snapshot opens in a temporary directory, gone with the reader
    earlier = set(Path(tempfile.gettempdir()).glob("emb.*"))
    saved = aps.read_checkpoint(tmp_path / "ckpt")
    assert saved.keys("emb").size == keys_before
    assert np.array_equal(saved.pull("emb", every), before)
    made = set(Path(tempfile.gettempdir()).glob("emb.*")) - earlier
    assert made
    del saved
    gc.collect()
    assert not any(path.exists() for path in made)


def test_spec_checks_the_disk_part() -> None:
    with pytest.raises(ConfigError, match="disk must be a Disk"):
        aps.HashTable("emb", dim=4, disk=1 << 30)
    with pytest.raises(ConfigError, match="ram_bytes"):
        aps.Disk(ram_bytes=1000)
    round_trip = aps.specs.spec_from_dict(aps.specs.spec_to_dict(spec()))
    assert round_trip == spec() and round_trip.tier == "disk"


async def test_disk_metrics_exported(tmp_path: Path) -> None:
    from prometheus_client import generate_latest

    from aps.server.collector import server_registry

    async with cluster(1, tmp_path, "m") as (servers, ps):
        await ps.create_table(spec())
        for keys, grads, pulls in traffic(6, seed=3):
            await ps.push_sparse_grad("emb", keys, grads)
            await ps.pull_sparse("emb", pulls)
        text = generate_latest(server_registry(servers[0].core)).decode()
        samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith("aps_server_table")}
        store = servers[0].core.tables["emb"]
        assert samples['aps_server_table_disk_bytes{table="emb"}'] == store.disk_nbytes  # 0 until RocksDB flushes
        assert samples['aps_server_table_hot_keys{table="emb"}'] == len(store.hot)
        requested = samples['aps_server_table_disk_events_total{event="requested_keys",table="emb"}']
        assert requested == 6 * (10_000 + 1250)
        read = samples['aps_server_table_disk_events_total{event="disk_read_rows",table="emb"}']
        assert 0 < read == store.cold.found_keys < requested
        assert samples['aps_server_table_disk_events_total{event="paged_in",table="emb"}'] == store.paged_in
        assert samples['aps_server_table_disk_events_total{event="staged_hits",table="emb"}'] == store.staged_hits
        assert samples['aps_server_table_disk_events_total{event="disk_reads",table="emb"}'] > 0
        assert samples['aps_server_table_disk_events_total{event="paged_out",table="emb"}'] == store.paged_out > 0


async def test_geo_reads_of_changed_rows_equal_an_all_ram_tables(tmp_path: Path) -> None:
    """A GEO reader's changed rows, while another client's pushes send rows to disk: the same
    keys and rows as from an all-RAM table."""
    (tmp_path / "d").mkdir()
    (tmp_path / "r").mkdir()
    async with cluster(1, tmp_path / "d", "d") as (servers, writer), cluster(1, tmp_path / "r", "r") as (ram_servers, ram_writer):
        await writer.create_table(spec())
        await ram_writer.create_table(spec(disk=False))
        async with aps.connect([servers[0].address]) as reader, aps.connect([ram_servers[0].address]) as ram_reader:
            for client in (reader, ram_reader):
                assert (await client.pull_sparse_changed("emb"))[0].size == 0  # registers the reader
            reads = 0
            for number, (keys, grads, _) in enumerate(traffic(8, seed=5)):
                await writer.push_sparse_grad("emb", keys, grads)
                await ram_writer.push_sparse_grad("emb", keys, grads)
                if number % 3 != 2:
                    continue
                (ids, rows), (ram_ids, ram_rows) = [await c.pull_sparse_changed("emb") for c in (reader, ram_reader)]
                order, ram_order = np.argsort(ids), np.argsort(ram_ids)
                assert np.array_equal(ids[order], ram_ids[ram_order]) and ids.size > 10_000
                assert np.array_equal(rows[order], ram_rows[ram_order])
                reads += 1
            assert reads == 2
        assert servers[0].core.tables["emb"].paged_out > 0


def export_files(root: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every logical shard file of a save, by file name, its arrays by name."""
    out = {}
    for path in sorted(root.glob("shard-*/*.npz")):
        with np.load(path) as saved:
            out[path.name] = {name: saved[name] for name in saved.files}
    return out


@pytest.mark.parametrize("stats", ["full", "compact"])
async def test_shrink_and_base_delta_exports_equal_an_all_ram_tables(tmp_path: Path, stats: str) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "r").mkdir()
    ttl_spec = {"ttl_days": 1, "stats": stats}
    disk_spec = aps.HashTable(**{**spec().__dict__, **ttl_spec})
    ram_spec = aps.HashTable(**{**spec(disk=False).__dict__, **ttl_spec})
    async with cluster(1, tmp_path / "d", "d") as (_, ps), cluster(1, tmp_path / "r", "r") as (_, ram_ps):
        for client, table in ((ps, disk_spec), (ram_ps, ram_spec)):
            await client.create_table(table)
        pushes = traffic(8, seed=4)
        for number, (keys, grads, _) in enumerate(pushes):
            shows = np.full(keys.size, 1.0 + number % 3, np.float32)
            for client in (ps, ram_ps):
                await client.push_sparse_grad("emb", keys, grads, shows=shows)
            if number == 3:
                for client in (ps, ram_ps):
                    await client.save("base", mode="base")
                evicted = [await client.shrink("emb", decay=0.9, threshold=1.2, days=1) for client in (ps, ram_ps)]
                assert evicted[0] == evicted[1] > 0
        for client in (ps, ram_ps):
            await client.save("delta", mode="delta")
        assert (await ps.table_info("emb")).keys == (await ram_ps.table_info("emb")).keys
        every = np.arange(KEYS, dtype=np.int64)
        assert np.array_equal(await ps.pull_sparse("emb", every), await ram_ps.pull_sparse("emb", every))
    # an online job's restart from the base and its delta, onto another cluster size
    async with cluster(2, tmp_path / "d", "b") as (_, ps), cluster(2, tmp_path / "r", "c") as (_, ram_ps):
        for client in (ps, ram_ps):
            await client.load("base", deltas=["delta"])
        assert (await ps.table_info("emb")).keys == (await ram_ps.table_info("emb")).keys > 0
        assert np.array_equal(await ps.pull_sparse("emb", every), await ram_ps.pull_sparse("emb", every))
    for save in ("base", "delta"):
        disk_files, ram_files = export_files(tmp_path / "d" / save), export_files(tmp_path / "r" / save)
        assert disk_files.keys() == ram_files.keys() and len(disk_files) == 1024
        for name, arrays in ram_files.items():
            assert disk_files[name].keys() == arrays.keys(), name
            for array, saved in arrays.items():
                assert np.array_equal(disk_files[name][array], saved), (save, name, array)
        if save == "delta":
            assert sum(a["deleted_keys"].size for a in disk_files.values()) > 0


async def test_max_keys_evicts_the_lowest_scores_among_keys_in_ram_and_on_disk(tmp_path: Path) -> None:
    cap = 55_000
    capped = aps.HashTable(**{**spec().__dict__, "max_keys": cap})
    rng = np.random.default_rng(6)
    async with cluster(1, tmp_path, "c") as (servers, ps):
        await ps.create_table(capped)
        store = servers[0].core.tables["emb"]
        for at in range(0, 80_000, 10_000):
            keys = np.arange(at, at + 10_000, dtype=np.int64)
            shows = (1 + (keys * 7919) % 1000).astype(np.float32)  # each key's score, the same every push
            await ps.push_sparse_grad("emb", keys, rng.standard_normal((keys.size, DIM)).astype(np.float32), shows=shows)
            held = store.all_rows()
            assert held.size == len(store) <= cap
        info = await ps.table_info("emb")
        assert info.keys == held.size and info.evicted == 80_000 - held.size > 0
        assert store.paged_out > 0 and len(store.hot) < held.size  # keys were on disk when the cap evicted
        score = 1 + (np.arange(80_000) * 7919) % 1000
        gone = np.setdiff1d(np.arange(80_000), held)
        last = np.arange(70_000, 80_000)  # the last push's keys: never evicted by their own push
        assert np.isin(last, held).all()
        assert score[np.setdiff1d(gone, last)].max() <= score[np.setdiff1d(held, last)].min() + 1
