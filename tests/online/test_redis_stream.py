"""The Redis stream source against a real redis-server: passes of N entries, a consumer group
shared by two trainers without overlap, acknowledgement only after a checkpoint, and on resume
the pending entries trained again unless the checkpoint already covers them."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from aps.errors import ConfigError
from aps.trainer.sources.base import Pass
from aps.trainer.sources.redis_stream import RedisStream, parse_stream_url

pytestmark = pytest.mark.timeout(30)


async def add(url: str, stream: str, lines: list[str]) -> None:
    r = aioredis.from_url(url)
    try:
        for line in lines:
            await r.xadd(stream, {"line": line})
    finally:
        await r.aclose()


async def pending(url: str, stream: str, group: str) -> int:
    r = aioredis.from_url(url)
    try:
        return int((await r.xpending(stream, group))["pending"])
    finally:
        await r.aclose()


def lines_of(p: Pass) -> list[str]:
    return [line for f in p.files for line in Path(f).read_text().splitlines()]


def source(url: str, trainer_id: int = 0, **kw) -> RedisStream:
    return RedisStream(f"{url}/clicks", trainer_id=trainer_id, records=kw.pop("records", 10), wait=kw.pop("wait", 0.3), **kw)


def test_stream_urls() -> None:
    assert parse_stream_url("redis://10.0.0.1:6380/clicks") == ("10.0.0.1", 6380, "clicks")
    with pytest.raises(ConfigError, match="redis://HOST:PORT/STREAM"):
        parse_stream_url("redis://10.0.0.1:6380")


async def test_two_trainers_share_the_stream_in_passes_without_overlap(redis_url: str) -> None:
    await add(redis_url, "clicks", [f"{i} 1 0" for i in range(50)])
    a, b = source(redis_url, 0, parts=2), source(redis_url, 1, parts=2)
    got: dict[int, list[str]] = {0: [], 1: []}
    sizes = []
    try:
        for s in (a, b):
            await s.open(None)
        while True:
            pa, pb = await a.next_pass(), await b.next_pass()
            if pa is None and pb is None:
                break
            for t, p in ((0, pa), (1, pb)):
                if p is not None:
                    assert len(p.files) == 2  # one file per worker
                    got[t] += lines_of(p)
                    sizes.append(len(lines_of(p)))
    finally:
        await a.aclose()
        await b.aclose()
    assert sorted(got[0] + got[1], key=lambda s: int(s.split()[0])) == [f"{i} 1 0" for i in range(50)]
    assert not set(got[0]) & set(got[1]) and all(n <= 10 for n in sizes)
    assert a.stop_reason == "no new entry in stream clicks within --pass-wait 0.3 s"


async def test_entries_are_acked_after_the_checkpoint_and_pending_ones_reread_on_resume(redis_url: str) -> None:
    await add(redis_url, "clicks", [f"{i} 1 0" for i in range(30)])
    first = source(redis_url)
    await first.open(None)
    p0 = await first.next_pass()
    assert p0 is not None and p0.seq == 0 and lines_of(p0) == [f"{i} 1 0" for i in range(10)]
    pos0 = await first.position(p0)
    assert pos0["covered"] == {"trainer-0": p0.name.split("@")[1]}
    assert await pending(redis_url, "clicks", "aps:clicks") == 10  # read, no checkpoint yet
    await first.committed(p0)
    assert await pending(redis_url, "clicks", "aps:clicks") == 0
    p1 = await first.next_pass()
    assert p1 is not None and lines_of(p1) == [f"{i} 1 0" for i in range(10, 20)]
    pos1 = await first.position(p1)
    await first.aclose()  # the trainer dies here: pass 1 trained, its checkpoint maybe not written

    # resumed from the checkpoint of pass 0: pass 1's entries are trained again, first
    again = source(redis_url)
    await again.open(pos0)
    p = await again.next_pass()
    assert p is not None and p.seq == 1 and p.reread == 10 and lines_of(p) == [f"{i} 1 0" for i in range(10, 20)]
    await again.aclose()

    # resumed from the checkpoint of pass 1 (written, but the trainer died before XACK): those
    # entries are in it, so they are acknowledged and not trained again
    covered = source(redis_url)
    await covered.open(pos1)
    assert await pending(redis_url, "clicks", "aps:clicks") == 0
    p = await covered.next_pass()
    assert p is not None and p.seq == 2 and p.reread == 0 and lines_of(p) == [f"{i} 1 0" for i in range(20, 30)]
    await covered.aclose()
    with pytest.raises(ConfigError, match="not of stream"):
        await source(redis_url).open({"source": "passes", "pass": "d/p", "seq": 0})
