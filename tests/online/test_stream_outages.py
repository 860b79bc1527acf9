"""A Redis stream that goes quiet, and a redis-server that goes away for a while, are ordinary
events for a stream trainer: neither kills it, nothing is lost and nothing trained twice.

Quiet periods here are longer than redis-py's default socket timeout (5 s), which a blocking
read used to outlive (``TimeoutError: Timeout reading from HOST:PORT``, exit 1)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis

from aps.errors import ServerError, SourceUnavailable
from aps.trainer.sources.redis_stream import RedisStream
from tests.conftest import Processes
from tests.faults.cluster import wait_for

from .conftest import RedisServer
from .test_exactly_once import alive, counts, start_trainer
from .test_redis_stream import add, lines_of

def trained(address: str, n: int) -> np.ndarray:
    """How often each of records 0..n-1 was trained (zeros before the trainer made its tables)."""
    try:
        return counts(address, n)
    except ServerError:
        return np.zeros(n)


#: longer than redis-py's default socket timeout (5 s), so a read that waited through it failed
QUIET = 5.5


@pytest.mark.timeout(60)
async def test_a_quiet_stream_mid_pass_and_at_the_end_is_waited_out(redis_server: RedisServer) -> None:
    url = redis_server.url
    await add(url, "clicks", [f"{i} 1 0" for i in range(5)])
    source = RedisStream(f"{url}/clicks", records=10, wait=QUIET + 1)
    await source.open(None)
    try:
        later = asyncio.get_running_loop().call_later(QUIET, lambda: asyncio.ensure_future(add(url, "clicks", [f"{i} 1 0" for i in range(5, 10)])))
        t0 = time.monotonic()
        first = await source.next_pass()  # 5 entries, then quiet for QUIET s, then 5 more
        assert first is not None and lines_of(first) == [f"{i} 1 0" for i in range(10)]
        assert time.monotonic() - t0 >= QUIET
        t0 = time.monotonic()
        assert await source.next_pass() is None  # quiet to the end: --pass-wait, then a clean stop
        assert time.monotonic() - t0 >= QUIET + 1
        assert source.stop_reason == f"no new entry in stream clicks within --pass-wait {QUIET + 1:g} s"
        later.cancel()
    finally:
        await source.aclose()


@pytest.mark.timeout(60)
async def test_a_read_waiting_while_redis_restarts_loses_nothing(redis_server: RedisServer) -> None:
    """SIGKILL the server under a blocking read, bring it back (its append-only file holds the
    group), add entries: the pass holds each entry once, the pending list only those."""
    url = redis_server.url
    await add(url, "clicks", [f"{i} 1 0" for i in range(10)])
    source = RedisStream(f"{url}/clicks", records=10, wait=30)
    await source.open(None)
    try:
        first = await source.next_pass()
        assert first is not None and len(lines_of(first)) == 10
        second = asyncio.ensure_future(source.next_pass())
        await asyncio.sleep(0.5)  # the read of pass 1 now blocks in the server
        redis_server.kill()
        await asyncio.sleep(3.0)
        assert not second.done()  # retrying, not failed
        await asyncio.to_thread(redis_server.start)
        await add(url, "clicks", [f"{i} 1 0" for i in range(10, 20)])
        got = await asyncio.wait_for(second, 20)
        assert got is not None and lines_of(got) == [f"{i} 1 0" for i in range(10, 20)]
        r = aioredis.from_url(url)
        try:
            assert (await r.xpending("clicks", "aps:clicks"))["pending"] == 20  # read, none acknowledged yet
            await source.committed(got)
            assert (await r.xpending("clicks", "aps:clicks"))["pending"] == 0
        finally:
            await r.aclose()
    finally:
        await source.aclose()


@pytest.mark.timeout(60)
async def test_a_redis_that_stays_away_fails_with_the_option_named(redis_server: RedisServer) -> None:
    url = redis_server.url
    await add(url, "clicks", [f"{i} 1 0" for i in range(3)])
    source = RedisStream(f"{url}/clicks", records=10, wait=30, retry=1.5)
    await source.open(None)
    try:
        redis_server.kill()
        t0 = time.monotonic()
        with pytest.raises(SourceUnavailable, match=r"unreachable for --stream-retry 1.5 s"):
            await source.next_pass()
        assert 1.5 <= time.monotonic() - t0 < 5
    finally:
        await source.aclose()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_stream_trainer_outlives_quiet_periods_and_a_redis_restart(
    processes: Processes, tmp_path: Path, redis_server: RedisServer
) -> None:
    """aps-trainer over a stream: a burst, a quiet period longer than redis-py's default
    timeout, a burst, redis-server SIGKILLed mid-pass and back after 4 s, a last burst, then
    quiet until --pass-wait: exit 0, every entry trained exactly once."""
    (address,) = processes.start_servers(1, 1, "--checkpoint-root", str(tmp_path), "--no-exit-when-done")
    url = redis_server.url
    n, per = 60, 20
    r = redis.Redis.from_url(url)

    def burst(start: int) -> None:
        for i in range(start, start + per):
            r.xadd("clicks", {"line": f"{i} {1 - i % 2} {i % 2}"})

    burst(0)
    stream = ("--data-stream", f"{url}/clicks", "--pass-records", str(per), "--pass-wait", str(QUIET + 1))
    trainer = start_trainer(processes, tmp_path, address, *stream)
    wait_for(alive(trainer, lambda: trained(address, n)[:per].sum() == per), 90, "the first burst trained")
    time.sleep(QUIET)
    burst(per)
    wait_for(alive(trainer, lambda: counts(address, n)[per : 2 * per].sum() > 0), 30, "the second burst trained on", 0.01)
    redis_server.kill()  # mid-pass: the pass's checkpoint and XACK are yet to come
    time.sleep(4.0)
    assert trainer.poll() is None, f"the trainer exited with {trainer.returncode} while redis-server was away"
    redis_server.start()
    r = redis.Redis.from_url(url)
    burst(2 * per)
    assert trainer.wait(60) == 0
    assert counts(address, n + 20).tolist() == [1.0] * n + [0.0] * 20  # none lost, none twice
    assert r.xpending("clicks", "aps:clicks")["pending"] == 0
    (log,) = [path.read_text() for path in processes.tmp.glob("aps-trainer.*.log")]
    assert "redis unreachable, retrying" in log and "online training stopped" in log
    assert f"no new entry in stream clicks within --pass-wait {QUIET + 1:g} s" in log
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(rec["examples"] for rec in records if rec["event"] == "epoch") == n
