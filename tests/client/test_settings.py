"""The shared checks of seconds and count settings (aps/validate.py) and the three places that
use them: PSClient's arguments, the pserver's config and its AUTH throttle. Each wrong value is a
ConfigError naming the option, raised where the value is given, before any socket is opened."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.server.transport.throttle import AuthThrottle
from aps.validate import count, seconds


@pytest.mark.parametrize("value", [-1, -0.001, math.nan, math.inf, -math.inf, True, False, "3", None, [1]])
def test_seconds_refuses_what_is_not_a_finite_duration(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^frame_timeout must be a number of seconds >= 0 \(0: no limit\), got "):
        seconds("frame_timeout", value)


def test_seconds_returns_floats_and_says_what_zero_and_none_mean() -> None:
    assert seconds("t", 0) == 0.0 and isinstance(seconds("t", 0), float)
    assert seconds("t", 3) == 3.0 and seconds("t", np.float32(0.5)) == 0.5 and seconds("t", Fraction(1, 4)) == 0.25
    assert seconds("t", None, none="no limit") is None
    with pytest.raises(ConfigError, match=r"^t must be a number of seconds >= 0 \(0: no delay\), got -2$"):
        seconds("t", -2, "no delay")
    with pytest.raises(ConfigError, match=r"^t must be a number of seconds > 0 \(None: no limit\), got 0$"):
        seconds("t", 0, None, none="no limit")
    with pytest.raises(ConfigError, match=r"^t must be a number of seconds > 0, got None$"):
        seconds("t", None, None)


@pytest.mark.parametrize("value", [-1, True, 1.0, 2.5, "8", None, math.nan])
def test_count_refuses_what_is_not_a_whole_number(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^max_table_bytes must be a number of bytes >= 0 \(0: no limit\), got "):
        count("max_table_bytes", value, "bytes")


def test_count_returns_ints_and_takes_numpy_integers() -> None:
    assert count("n", 0, "bytes") == 0
    assert count("n", np.int64(7), "bytes") == 7 and type(count("n", np.int64(7), "bytes")) is int
    assert count("n", 1, least=1) == 1
    with pytest.raises(ConfigError, match=r"^n must be an integer >= 1, got 0$"):
        count("n", 0, least=1)
    with pytest.raises(ConfigError, match=r"^retries must be an integer >= 0 \(0: no retry\), got -1$"):
        count("retries", -1, zero="no retry")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retries": -1}, r"^retries must be an integer >= 0 \(0: no retry\), got -1$"),
        ({"retries": True}, r"^retries must be an integer >= 0 \(0: no retry\), got True$"),
        ({"retries": 1.5}, r"^retries must be an integer >= 0 \(0: no retry\), got 1.5$"),
        ({"deadline": -1}, r"^deadline must be a number of seconds >= 0 \(0: no retry\), got -1$"),
        ({"deadline": math.inf}, r"^deadline must be a number of seconds >= 0 \(0: no retry\), got inf$"),
        ({"heartbeat": math.nan}, r"^heartbeat must be a number of seconds >= 0 \(0: no heartbeat\), got nan$"),
        ({"backoff": -0.1}, r"^backoff must be a number of seconds >= 0 \(0: retry at once\), got -0.1$"),
        ({"timeout": 0}, r"^timeout must be a number of seconds > 0 \(None: no limit\), got 0$"),
        ({"timeout": "30"}, r"^timeout must be a number of seconds > 0 \(None: no limit\), got '30'$"),
    ],
)
def test_client_arguments_are_checked_before_connecting(kwargs: dict[str, Any], message: str) -> None:
    # port 9 (discard) on a documentation address: nothing is ever dialled, connect() only builds
    with pytest.raises(ConfigError, match=message):
        aps.connect(["192.0.2.1:9"], **kwargs)


def test_client_accepts_the_edges() -> None:
    ps = aps.connect(["192.0.2.1:9"], timeout=None, retries=0, backoff=0, deadline=0, heartbeat=0)
    assert (ps.timeout, ps.retries, ps.backoff, ps.deadline, ps.heartbeat) == (None, 0, 0, 0, 0)
    assert aps.connect("192.0.2.1:9,192.0.2.2:9", retries=np.int64(2)).num_servers == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"frame_timeout": -1}, r"^frame_timeout must be a number of seconds >= 0 \(0: no limit\), got -1$"),
        ({"handshake_timeout": math.nan}, r"^handshake_timeout must be a number of seconds >= 0"),
        ({"drain_timeout": -5.0}, r"^drain_timeout must be a number of seconds >= 0 \(0: do not wait\), got -5.0$"),
        ({"max_connections": True}, r"^max_connections must be a number of connections >= 0 \(0: no limit\), got True$"),
        ({"max_tracking_bytes": 1.5}, r"^max_tracking_bytes must be a number of bytes >= 0 \(0: no limit\), got 1.5$"),
        ({"max_inflight_per_connection": 0}, r"^max_inflight_per_connection must be a number of requests >= 1, got 0$"),
        ({"auth_fail_delay": -0.05}, r"^auth_fail_delay must be a number of seconds >= 0 \(0: no delay\), got -0.05$"),
        ({"auth_fail_concurrent": 0}, r"^auth_fail_concurrent must be a number of slots >= 1, got 0$"),
        ({"auth_fail_delay": 2.0}, r"^auth_fail_max_delay \(1.0\) must be at least auth_fail_delay \(2.0\)$"),
    ],
)
def test_server_config_checks_each_setting_where_it_is_made(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        aps.ServerConfig(**kwargs)


def test_server_config_takes_zero_for_no_limit() -> None:
    config = aps.ServerConfig(frame_timeout=0, handshake_timeout=0, max_connections=0, max_table_bytes=0,
                              auth_fail_delay=0, auth_fail_max_delay=0, drain_timeout=0)
    assert (config.frame_timeout, config.max_connections, config.auth_fail_max_delay) == (0, 0, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_delay": -1}, r"^base_delay must be a number of seconds >= 0 \(0: no delay\), got -1$"),
        ({"max_delay": math.inf}, r"^max_delay must be a number of seconds >= 0 \(0: no delay\), got inf$"),
        ({"forget_after": -1}, r"^forget_after must be a number of seconds >= 0 \(0: forget at once\), got -1$"),
        ({"concurrent": 0}, r"^concurrent must be an integer >= 1, got 0$"),
        ({"max_peers": 2.0}, r"^max_peers must be an integer >= 1, got 2.0$"),
        ({"base_delay": 0.5, "max_delay": 0.1}, r"^need base_delay <= max_delay, got 0.5, 0.1$"),
        ({"max_pending": 10, "max_pending_total": 5}, r"^need max_pending <= max_pending_total, got 10, 5$"),
    ],
)
def test_auth_throttle_settings_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AuthThrottle(**kwargs)
