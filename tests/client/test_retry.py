"""The retry policy of a call (aps/client/retry.py), decided from failures and loop times alone:
what is retried, after which pause, and what the call finally fails with."""

from __future__ import annotations

import asyncio
import ssl

import pytest

import aps
from aps.client.retry import MAX_BACKOFF, RetryPolicy, call_deadline, call_limit, within
from aps.errors import CloseReason, ConnectionLost, ErrorCode, RequestTimeout, ServerError

WHERE = "10.0.0.1:7000"


def lost(reason: str = "reset") -> ConnectionLost:
    try:
        raise ConnectionLost("connection lost", CloseReason.RESET) from ConnectionResetError(reason)
    except ConnectionLost as exc:
        return exc


def test_lost_connections_back_off_doubling_up_to_the_cap_then_fail_naming_the_server() -> None:
    attempts = RetryPolicy(retries=0, backoff=0.1, deadline=5.0).attempts(WHERE, None, 0.0)
    pauses = [attempts.failed(lost(), now) for now in (100.0, 100.1, 100.3, 100.7, 101.5, 102.5)]
    assert pauses == pytest.approx([0.1, 0.2, 0.4, 0.8, MAX_BACKOFF, MAX_BACKOFF])
    assert attempts.failed(lost(), 104.5) == pytest.approx(0.5)  # never past the rpc deadline
    with pytest.raises(ConnectionLost, match=r"pserver 10\.0\.0\.1:7000 still unreachable 5\.0 s .*rpc deadline 5 s") as info:
        attempts.failed(lost("refused"), 105.0)
    assert isinstance(info.value.__cause__, ConnectionResetError) and str(info.value.__cause__) == "refused"


def test_a_zero_deadline_means_no_retry() -> None:
    attempts = RetryPolicy(retries=3, backoff=0.1, deadline=0.0).attempts(WHERE, None, 0.0)
    with pytest.raises(ConnectionLost, match="still unreachable 0.0 s"):
        attempts.failed(lost(), 1.0)


def test_the_call_timeout_ends_retries_and_clips_the_pause() -> None:
    attempts = RetryPolicy(retries=3, backoff=0.5, deadline=60.0).attempts(WHERE, 10.2, 2.0)
    assert attempts.failed(lost(), 10.0) == pytest.approx(0.2)
    error = lost()
    with pytest.raises(RequestTimeout, match=r"within 2.0 s \(last failure: connection lost\)") as info:
        attempts.failed(error, 10.2)
    assert info.value.__cause__ is error


def test_refusals_other_than_shutting_down_are_retried_a_count_of_times() -> None:
    attempts = RetryPolicy(retries=2, backoff=0.01, deadline=60.0).attempts(WHERE, None, 0.0)
    busy = ServerError(ErrorCode.TOO_LARGE, "busy", retriable=True)
    assert attempts.failed(busy, 1.0) > 0 and attempts.failed(busy, 1.1) > 0
    with pytest.raises(ServerError) as info:
        attempts.failed(busy, 1.2)
    assert info.value is busy


def test_shutting_down_is_retried_for_the_deadline_then_raised_as_is() -> None:
    attempts = RetryPolicy(retries=0, backoff=0.01, deadline=1.0).attempts(WHERE, None, 0.0)
    down = ServerError(ErrorCode.SHUTTING_DOWN, "restarting", retriable=True)
    assert [attempts.failed(down, t) > 0 for t in (0.0, 0.5, 0.9)] == [True, True, True]
    with pytest.raises(ServerError) as info:
        attempts.failed(down, 1.0)
    assert info.value is down


def test_what_never_passes_is_not_retried() -> None:
    attempts = RetryPolicy(retries=5, backoff=0.01, deadline=60.0).attempts(WHERE, None, 0.0)
    refused = ServerError(ErrorCode.UNKNOWN_TABLE, "no such table")
    with pytest.raises(ServerError) as info:
        attempts.failed(refused, 0.0)
    assert info.value is refused
    try:
        raise ConnectionLost("untrusted", CloseReason.CONNECT_FAILED) from ssl.SSLCertVerificationError("self-signed")
    except ConnectionLost as exc:
        untrusted = exc
    with pytest.raises(ConnectionLost) as info2:
        attempts.failed(untrusted, 0.0)
    assert info2.value is untrusted


async def test_limits_and_budgets() -> None:
    assert (call_limit(True, 30.0), call_limit(None, 30.0), call_limit(False, 30.0), call_limit(2, 30.0)) == (30.0, None, None, 2)
    assert call_deadline(None, 5.0) == (None, 0.0)
    loop_now = asyncio.get_running_loop().time()
    deadline, limit = call_deadline(True, 5.0)
    assert limit == 5.0 and deadline is not None and loop_now + 5.0 <= deadline < loop_now + 6.0
    assert await within(asyncio.sleep(0, "done"), None) == "done"
    with pytest.raises(aps.RequestTimeout, match=r"^call did not finish within 0.05 s$"):
        await within(asyncio.sleep(5), 0.05)
