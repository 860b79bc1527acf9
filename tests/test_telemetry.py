"""Prometheus endpoints of pservers and trainers: real TCP on port 0, real HTTP scrapes, values
parsed with prometheus-client's own parser and checked against what the test did."""

from __future__ import annotations

import asyncio
import math
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import aps
from aps.cli.server import build_parser as server_parser
from aps.cli.server import config_from_args
from aps.cli.trainer import build_parser as trainer_parser
from aps.cli.trainer import make_trainer
from aps.cluster import ClusterSpec
from aps.metrics import Auc, auc_state_shape, merged_auc
from aps.server.stats import OpStats
from aps.trainer.collector import TrainerCollector, TrainerProbe, trainer_registry
from aps.trainer import Strategy, Trainer, TrainOptions
from aps.trainer.shared import STAT, STAT_FIELDS
from tests.conftest import BIN, ROOT, wait_port_file
from examples.linreg.model import LinReg, make_data

Samples = dict[str, list[Sample]]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        return parse(reply.read().decode())


async def ascrape(port: int) -> Samples:
    """Scrape from a thread: the endpoint must answer while this event loop keeps running."""
    return await asyncio.to_thread(scrape, port)


def value(samples: Samples, name: str, **labels: str) -> float:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def refused(port: int) -> bool:
    try:
        scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


# ----------------------------------------------------------------------------------- pserver


async def test_pserver_metrics_count_what_clients_did() -> None:
    servers = [
        await aps.serve(port=0, server_index=k, num_servers=2, num_trainers=2, exit_when_done=False, metrics_port=0)
        for k in range(2)
    ]
    try:
        assert all(s.metrics_port not in (None, 0, s.port) for s in servers)
        async with aps.connect([s.address for s in servers], trainer_id=1) as ps:
            await ps.create_table(aps.SparseTable("emb", rows=1001, dim=4, optimizer=aps.Adagrad(lr=0.1)))
            await ps.create_table(aps.DenseTable("bias", shape=(6,)))
            ids = np.arange(0, 40, dtype=np.int64)  # even ids on server 0, odd on server 1
            for _ in range(5):
                await ps.pull_sparse("emb", ids)
            for _ in range(3):
                await ps.push_sparse_grad("emb", ids, np.ones((len(ids), 4), np.float32))
            await ps.pull_dense("bias")
            await ps.worker_done()
            stats = await ps.stats()
            scraped = [await ascrape(s.metrics_port) for s in servers]  # type: ignore[arg-type]

            for k, (server, m) in enumerate(zip(servers, scraped)):
                assert value(m, "aps_server_requests_total", op="pull_sparse") == 5
                assert value(m, "aps_server_requests_total", op="push_sparse_grad") == 3
                assert value(m, "aps_server_request_errors_total", op="pull_sparse") == 0
                # 20 of the 40 ids live here: each reply carries at least their 20 x 4 float32
                assert value(m, "aps_server_sent_bytes_total", op="pull_sparse") > 5 * 20 * 4 * 4
                assert value(m, "aps_server_received_bytes_total", op="push_sparse_grad") > 3 * 20 * (8 + 16)
                own = stats[server.address]["ops"]["PullSparse"]
                assert value(m, "aps_server_sent_bytes_total", op="pull_sparse") == own["bytes_out"]
                # a real histogram: cumulative, ending in +Inf == count, with a positive sum
                buckets = [s for s in m["aps_server_request_duration_seconds_bucket"] if s.labels["op"] == "pull_sparse"]
                counts = [s.value for s in buckets]
                assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf" and counts[-1] == 5
                assert value(m, "aps_server_request_duration_seconds_count", op="pull_sparse") == 5
                assert value(m, "aps_server_request_duration_seconds_sum", op="pull_sparse") > 0
                # 1001 rows: server 0 owns ids 0, 2, .., 1000 (501 rows), server 1 the other 500
                assert value(m, "aps_server_table_rows", table="emb") == (501, 500)[k]
                assert value(m, "aps_server_table_values", table="emb") == (501, 500)[k] * 4
                assert value(m, "aps_server_table_bytes", table="emb") == stats[server.address]["tables"]["emb"]["bytes"]
                # Adagrad keeps one accumulator per value: values + state, float32
                assert value(m, "aps_server_table_bytes", table="emb") >= 2 * (501, 500)[k] * 4 * 4
                assert "bias" not in {s.labels["table"] for s in m["aps_server_table_rows"]}  # dense: no rows
                assert value(m, "aps_server_connections") == 1
                assert value(m, "aps_server_connections_accepted_total") == 1
                assert value(m, "aps_server_trainers") == 2
                assert value(m, "aps_server_trainers_done") == 1
                assert value(m, "aps_server_shard_index") == k
                assert value(m, "aps_process_resident_memory_bytes") > 10e6
            dense_values = [value(m, "aps_server_table_values", table="bias") for m in scraped]
            assert sum(dense_values) == 6
        # the client went away: the gauge follows at the next scrape
        for _ in range(100):
            if value(await ascrape(servers[0].metrics_port), "aps_server_connections") == 0:  # type: ignore[arg-type]
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("aps_server_connections did not drop to 0")
    finally:
        ports = [s.metrics_port for s in servers]
        for s in servers:
            await s.aclose()
    # a stopped server leaves nothing listening behind it
    assert all(refused(p) for p in ports)  # type: ignore[arg-type]


async def test_registry_is_per_server_and_not_started_without_port() -> None:
    a = await aps.serve(port=0, exit_when_done=False, metrics_port=0)
    b = await aps.serve(port=0, exit_when_done=False)
    try:
        assert b.metrics is None and b.metrics_port is None
        assert a.registry is not b.registry
        async with aps.connect(b.address) as ps:
            await ps.ping()
            await ps.ping()
        m_a = await ascrape(a.metrics_port)  # type: ignore[arg-type]
        m_b = parse(generate_latest(b.registry).decode())
        assert value(m_b, "aps_server_requests_total", op="ping") == 2
        assert "aps_server_requests_total" not in m_a  # a's registry saw none of b's traffic
    finally:
        await a.aclose()
        await b.aclose()


async def test_metrics_port_taken_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(aps.ConfigError, match="cannot serve metrics"):
            await aps.serve(port=0, metrics_port=taken.getsockname()[1])


def test_port_file_without_port_is_refused() -> None:
    with pytest.raises(aps.ConfigError, match="metrics port"):
        aps.ServerConfig(metrics_port_file="x")
    with pytest.raises(aps.ConfigError, match="out of range"):
        aps.ServerConfig(metrics_port=70000)
    with pytest.raises(aps.ConfigError, match="metrics port"):
        Trainer(LinReg(), Strategy(workers=1), ClusterSpec(["127.0.0.1:1"], 1), 0, TrainOptions(metrics_port_file="x"))


def test_cli_flags_reach_the_configs(tmp_path: Path) -> None:
    args = server_parser().parse_args(["--host", "127.0.0.1", "--metrics-port", "0", "--metrics-port-file", "m.port"])
    config = config_from_args(args)
    assert (config.metrics_port, config.metrics_host, config.metrics_port_file) == (0, None, "m.port")
    assert "--metrics-port" in server_parser().format_help() and "--metrics-port" in trainer_parser().format_help()
    args = trainer_parser().parse_args(
        ["--pservers", "127.0.0.1:1", "--model", "examples.linreg.model:LinReg", "--data", "x",
         "--metrics-port", "9999", "--metrics-port-file", "t.port", "--workers", "1",
         "--metrics", str(tmp_path / "m.jsonl")]
    )
    options = make_trainer(args).options
    assert (options.metrics_port, options.metrics_host, options.metrics_port_file) == (9999, "127.0.0.1", "t.port")
    assert make_trainer(trainer_parser().parse_args(
        ["--pservers", "127.0.0.1:1", "--model", "examples.linreg.model:LinReg", "--data", "x", "--workers", "1",
         "--metrics", str(tmp_path / "m.jsonl")]
    )).options.metrics_port is None


@pytest.mark.slow
def test_aps_server_cli_writes_metrics_port_file(tmp_path: Path) -> None:
    port_file, metrics_file, log = tmp_path / "ps.port", tmp_path / "ps.metrics.port", tmp_path / "ps.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(BIN / "aps-server"), "--port", "0", "--trainers", "3", "--port-file", str(port_file),
             "--metrics-port", "0", "--metrics-port-file", str(metrics_file)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )
    try:
        metrics_port = wait_port_file(metrics_file, proc)
        data_port = wait_port_file(port_file, proc)
        assert metrics_port != data_port
        m = scrape(metrics_port)
        assert value(m, "aps_server_trainers") == 3
        assert value(m, "aps_server_connections") == 0
        assert value(m, "aps_process_resident_memory_bytes") > 10e6
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in log.read_text().splitlines() if "metrics endpoint" in line]
    assert len(lines) == 1 and f"port={metrics_port}" in lines[0], lines
    assert refused(metrics_port)


def test_histogram_buckets_follow_the_log2_layout() -> None:
    s = OpStats()
    for ns in (0, 1500, 1500, 3_000_000, 1 << 40):
        s.record(ns, 1, 1, False)
    edges, total = s.cumulative_seconds()
    by_edge = dict(edges)
    assert total == 5
    assert by_edge[1024 / 1e9] == 1  # 0 ns
    assert by_edge[2048 / 1e9] == 3  # 1500 ns < 2048 ns
    assert by_edge[(1 << 21) / 1e9] == 3 and by_edge[(1 << 22) / 1e9] == 4  # 3 ms in [2^21, 2^22) ns
    assert edges[-1][1] == 4  # 2^40 ns (~18 min) only in +Inf


# ----------------------------------------------------------------------------------- trainer


def test_trainer_collector_reports_auc_of_the_shared_counts() -> None:
    rng = np.random.default_rng(1)
    auc = np.zeros((2, *auc_state_shape()), dtype=np.float64)
    for w in range(2):
        counter = Auc(state=auc[w])
        for _ in range(30):
            labels = rng.integers(0, 2, 64).astype(np.float32)
            counter.update(np.clip(0.3 * labels + rng.uniform(0, 0.7, 64), 0, 1).astype(np.float32), labels)
    stats = np.zeros((2, len(STAT_FIELDS)))
    stats[:, STAT["examples"]] = [100, 50]
    stats[:, STAT["loss_sum"]] = [30.0, 15.0]
    probe = TrainerProbe(trainer_id=3, workers=2, stats=stats, auc=auc)
    m = parse(generate_latest(trainer_registry(probe)).decode())
    total, window = merged_auc(auc)
    assert 0.6 < total < 1.0
    assert value(m, "aps_trainer_auc", trainer="3") == pytest.approx(total)
    assert value(m, "aps_trainer_sliding_auc", trainer="3") == pytest.approx(window)
    assert value(m, "aps_trainer_examples_total", trainer="3") == 150
    assert value(m, "aps_trainer_loss", trainer="3") == pytest.approx(0.3)  # no report yet: mean so far
    # before training starts only the static numbers are there
    assert [f.name for f in TrainerCollector(TrainerProbe(0, workers=1)).collect()] == ["aps_trainer_workers"]


async def test_trainer_metrics_while_training(tmp_path: Path) -> None:
    lines = 640
    make_data(tmp_path / "data", files=2, lines_per_file=lines, features=50)
    # two trainers in the cluster, one started: trainer 0 trains its file, then waits at the
    # end-of-epoch barrier for trainer 1 (this test), a deterministic moment to scrape
    server = await aps.serve(port=0, num_trainers=2, exit_when_done=False, metrics_port=0)
    port_file = tmp_path / "trainer.metrics.port"
    options = TrainOptions(
        save_dir=None, print_period=0.2, live_line=False, metrics_port=0, metrics_port_file=str(port_file)
    )
    trainer = Trainer(LinReg(features=50, lr=0.1), Strategy(mode="async", workers=1), ClusterSpec([server.address], 2),
                      0, options)
    task = asyncio.ensure_future(trainer.atrain([str(tmp_path / "data")], 1))
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.02)
        port = int(port_file.read_text())
        assert port == trainer.metrics_port
        while True:  # until every line of this trainer's file is counted and its last push is sent
            m = await ascrape(port)  # (the examples count before the communicator takes the last batch)
            if (m.get("aps_trainer_examples_total") and value(m, "aps_trainer_examples_total", trainer="0") == lines
                    and value(m, "aps_trainer_send_queue_depth", trainer="0") == 0):
                break
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert value(m, "aps_trainer_steps_total", trainer="0") >= lines / 32  # batch size 32
        loss = value(m, "aps_trainer_loss", trainer="0")
        assert math.isfinite(loss) and loss > 0
        assert value(m, "aps_trainer_epoch", trainer="0") == 0
        assert value(m, "aps_trainer_workers", trainer="0") == 1
        assert value(m, "aps_trainer_pushes_total", trainer="0") > 0
        assert value(m, "aps_trainer_geo_syncs_total", trainer="0") == 0  # async mode
        assert value(m, "aps_trainer_send_queue_capacity", trainer="0") == 1  # = workers
        assert value(m, "aps_trainer_bad_lines_total", trainer="0") == 0
        assert value(m, "aps_trainer_compute_seconds_total", trainer="0") > 0
        assert "aps_trainer_auc" not in m  # linear regression predicts no probabilities
        assert value(m, "aps_process_resident_memory_bytes") > 10e6
        async with aps.connect(server.address) as ps:  # be trainer 1 at the barrier
            await ps.barrier("aps.epoch.0", timeout=30)
        result = await asyncio.wait_for(task, 60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.aclose()
    assert refused(port)  # the endpoint lives exactly as long as atrain
    # the registry keeps the final numbers, the epoch's report included
    final = parse(generate_latest(trainer.registry).decode())
    assert value(final, "aps_trainer_examples_total", trainer="0") == lines == result.epochs[0]["examples"]
    assert value(final, "aps_trainer_loss", trainer="0") == pytest.approx(result.final_loss)
    assert value(final, "aps_trainer_examples_per_second", trainer="0") > 0
    assert value(final, "aps_trainer_wait_share", trainer="0") >= 0


async def test_hash_table_keys_and_admission_counts_are_exported() -> None:
    srv = await aps.serve(port=0, metrics_port=0)
    try:
        async with aps.connect([srv.address]) as ps:
            await ps.create_table(aps.HashTable("h", dim=4, max_keys=100))
            keys = np.arange(-60, 90, dtype=np.int64) * 1_000_003
            await ps.push_sparse_grad("h", keys, np.ones((150, 4), np.float32))
            while srv.core.hash_upkeep.running:  # the eviction that makes room for the next push, off the loop
                await asyncio.sleep(0.01)
            info = await ps.table_info("h")
            m = await ascrape(srv.metrics_port)  # type: ignore[arg-type]
            assert value(m, "aps_server_table_keys", table="h") == info.keys <= 100
            assert value(m, "aps_server_table_values", table="h") == info.keys * 4
            assert value(m, "aps_server_table_key_events_total", table="h", event="admitted") == info.admitted
            assert value(m, "aps_server_table_key_events_total", table="h", event="rejected") == info.rejected > 0
            assert value(m, "aps_server_table_key_events_total", table="h", event="evicted") == info.evicted
    finally:
        await srv.aclose()
