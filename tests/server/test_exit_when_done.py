"""``exit_when_done`` means one thing with one default, whether a pserver is built from a
:class:`aps.ServerConfig` or by :func:`aps.serve` (real TCP on port 0)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

import pytest

import aps
from aps.fleet import Fleet, Role, UserDefinedRoleMaker

STARTS: dict[str, Callable[..., Awaitable[aps.PServer]]] = {
    "serve": lambda **kw: aps.serve(port=0, num_trainers=1, **kw),
    "ServerConfig": lambda **kw: aps.PServer(aps.ServerConfig(port=0, num_trainers=1, **kw)).start(),
}


def test_the_default_is_the_same_and_off() -> None:
    assert inspect.signature(aps.serve).parameters["exit_when_done"].default is False
    assert aps.ServerConfig().exit_when_done is False


@pytest.mark.parametrize("how", sorted(STARTS))
async def test_a_default_pserver_outlives_its_trainers(how: str) -> None:
    srv = await STARTS[how]()
    try:
        async with aps.connect([srv.address], trainer_id=0) as ps:
            await ps.worker_done()
        assert srv.core.done_trainers == {0}
        async with aps.connect([srv.address], trainer_id=0) as ps:  # after the worker_done's call_soon ran
            await ps.ping()
        assert srv.exit_reason == ""
    finally:
        await srv.aclose()


@pytest.mark.parametrize("how", sorted(STARTS))
async def test_exit_when_done_stops_after_every_trainers_worker_done(how: str) -> None:
    srv = await STARTS[how](exit_when_done=True)
    try:
        async with aps.connect([srv.address], trainer_id=0) as ps:
            await ps.worker_done()
        await asyncio.wait_for(srv.wait_closed(), 5)
        assert srv.exit_reason == "all trainers sent worker_done"
    finally:
        await srv.aclose()


def test_fleet_and_aps_server_pservers_exit_when_done() -> None:
    from aps.cli.server import build_parser, config_from_args

    fleet = Fleet().init(UserDefinedRoleMaker(current_id=0, role=Role.SERVER, worker_num=1,
                                              server_endpoints=["127.0.0.1:7164"]))
    fleet.init_server()
    assert fleet._server_config is not None and fleet._server_config.exit_when_done is True
    assert config_from_args(build_parser().parse_args([])).exit_when_done is True
    assert config_from_args(build_parser().parse_args(["--no-exit-when-done"])).exit_when_done is False
