"""A pserver that stays dead, as one client sees it (real TCP on port 0): the client knows at
once which pserver it cannot reach, since when and what waits for it, says so in its log, and
the call that gives up names the pserver and the last connect error."""

from __future__ import annotations

import asyncio
import time

import pytest
from structlog.testing import capture_logs

import aps
from aps.errors import ConnectionLost, RequestTimeout

EMB = aps.SparseTable("emb", rows=8, dim=2, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))


@pytest.mark.slow
async def test_a_save_to_a_dead_pserver_is_reported_at_once_and_fails_naming_it() -> None:
    srv = await aps.serve()
    address = srv.address
    ps = await aps.connect([address], deadline=2.0, backoff=0.01)
    saving: asyncio.Future[None] | None = None
    try:
        await ps.create_table(EMB)
        await srv.aclose()  # and it stays dead
        with capture_logs() as logs:
            saving = asyncio.ensure_future(ps.save("ckpt"))
            started = time.monotonic()
            while not ps.unreachable():
                assert time.monotonic() - started < 0.5, "the outage is not known 0.5 s after it began"
                await asyncio.sleep(0.01)
            (outage,) = ps.unreachable()
            assert outage["address"] == address and outage["waiting"] == "Save"
            assert outage["last_error"].startswith(f"cannot connect to pserver {address}")
            with pytest.raises(ConnectionLost, match=f"pserver {address} still unreachable .*cannot connect to pserver {address}"):
                await saving
        reports = [e for e in logs if e["event"] == "pserver unreachable"]
        assert reports and reports[0]["address"] == address and reports[0]["waiting"] == "Save"
        assert "since" in reports[0] and "last_error" in reports[0]
    finally:
        if saving is not None:
            saving.cancel()
        await ps.aclose()


async def test_a_call_that_times_out_on_a_dead_pserver_names_it_and_the_connect_error() -> None:
    srv = await aps.serve()
    address = srv.address
    ps = await aps.connect([address], deadline=30.0, backoff=0.01)
    try:
        await ps.create_table(EMB)
        await srv.aclose()
        for call in (ps.pull_sparse("emb", [1], timeout=0.5), ps.barrier("b", count=1, timeout=0.5)):
            with pytest.raises(RequestTimeout, match=f"pserver {address} unreachable since .*last connect error: cannot connect"):
                await call
        assert ps.unreachable()[0]["waiting"] == "nothing now"  # both calls gave up
    finally:
        await ps.aclose()


async def test_a_pserver_back_is_no_longer_reported() -> None:
    srv = await aps.serve(port=0)
    port = srv.port
    ps = await aps.connect([srv.address], deadline=20.0, backoff=0.01)
    try:
        await ps.create_table(EMB)
        await srv.aclose()
        pulling = asyncio.ensure_future(ps.ping())
        while not ps.unreachable():
            await asyncio.sleep(0.01)
        srv = await aps.serve(port=port)
        await asyncio.wait_for(pulling, 10)
        assert ps.unreachable() == []
    finally:
        await ps.aclose()
        await srv.aclose()
