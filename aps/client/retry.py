"""The client's time policy: how long a call may take, and when a failed request is tried again.

Two clocks bound a call. Its *timeout* (``timeout=`` of the call, else the client's) covers the
whole call, every part and retry included, and ends it with :class:`RequestTimeout`. Its
*deadline* (the client's ``deadline``) is how long a lost pserver is retried, counted from the
call's first failure: long enough by default for a pserver to be restarted, after which the
call fails with :class:`ConnectionLost` naming the server. Other retriable refusals are retried
at most ``retries`` times. Between attempts the client waits with exponential backoff, never
more than :data:`MAX_BACKOFF`, so a restarted pserver is found soon after it listens.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections.abc import Awaitable
from typing import TypeVar

from ..errors import ConnectionLost, ErrorCode, RequestTimeout, ServerError

T = TypeVar("T")
#: longest wait between two reconnect attempts: a restarted pserver is found within this
MAX_BACKOFF = 1.0
#: seconds a lost pserver is retried by default (a restart fits in it; docs/operations.md)
DEFAULT_DEADLINE = 120.0
#: seconds between a trainer client's heartbeat pings by default
DEFAULT_HEARTBEAT = 5.0

#: what a call's ``timeout=`` may be: seconds, None or False for no limit, True for the default
Timeout = float | None | bool


def timed_out(limit: float | None, detail: str = "") -> RequestTimeout:
    """The error of a call that ran past its ``limit`` seconds; ``detail`` says where it was."""
    return RequestTimeout(f"call did not finish within {limit} s" + (f" ({detail})" if detail else ""))


def call_limit(timeout: Timeout, default: float | None) -> float | None:
    """The seconds a call given ``timeout`` may take (None: no limit); True means ``default``."""
    limit = default if timeout is True else timeout
    return None if limit is None or limit is False else limit


def call_deadline(timeout: Timeout, default: float | None) -> tuple[float | None, float]:
    """The loop time a call given ``timeout`` must end by (None: no limit), and its limit in
    seconds (0.0 with no limit), for the calls whose deadline the link watches."""
    limit = call_limit(timeout, default)
    if limit is None:
        return None, 0.0
    return asyncio.get_running_loop().time() + float(limit), float(limit)


async def within(work: Awaitable[T], limit: float | None) -> T:
    """Run ``work`` under one timeout budget of ``limit`` seconds (None: none)."""
    if limit is None:
        return await work
    try:
        async with asyncio.timeout(float(limit)):
            return await work
    except TimeoutError:
        raise timed_out(limit) from None


class RetryPolicy:
    """The client's retry settings; :meth:`attempts` starts the bookkeeping of one call."""

    __slots__ = ("retries", "backoff", "deadline")

    def __init__(self, retries: int, backoff: float, deadline: float) -> None:
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline

    def attempts(self, where: str, deadline: float | None, limit: float) -> Attempts:
        """A failed call to the pserver ``where`` (``host:port``), which must end by the loop
        time ``deadline`` (None: never; ``limit`` the seconds that stands for)."""
        return Attempts(self, where, deadline, limit)


class Attempts:
    """The failures of one call so far: decides whether the next failure is retried, and after
    what pause. Made on the first failure only, so a call that succeeds pays nothing for it."""

    __slots__ = ("policy", "where", "deadline", "limit", "attempt", "refusals", "first_failure")

    def __init__(self, policy: RetryPolicy, where: str, deadline: float | None, limit: float) -> None:
        self.policy = policy
        self.where = where
        self.deadline = deadline
        self.limit = limit
        self.attempt = 0
        self.refusals = 0
        self.first_failure: float | None = None

    def failed(self, error: ConnectionLost | ServerError, now: float) -> float:
        """The seconds to wait before trying again after ``error`` (at loop time ``now``), or
        raise what the call fails with: ``error`` itself when it is not retried, else
        :class:`RequestTimeout` past the call's timeout, or the last failure past ``deadline``.

        A lost connection, or a server that says it is shutting down, is retried until the
        client's ``deadline`` after the first failure; other retriable refusals at most
        ``retries`` times; an untrusted certificate never (it stays untrusted).
        """
        policy = self.policy
        if isinstance(error, ConnectionLost):
            if isinstance(error.__cause__, _ssl.SSLCertVerificationError):
                raise error
        else:
            if not error.retriable:
                raise error
            if error.code != ErrorCode.SHUTTING_DOWN:  # a refusal that may pass later, not a restart
                self.refusals += 1
                if self.refusals > policy.retries:
                    raise error
        if self.deadline is not None and now >= self.deadline:
            raise timed_out(self.limit, f"last failure: {error}") from error
        if self.first_failure is None:
            self.first_failure = now
        waited = now - self.first_failure
        if waited >= policy.deadline:
            if isinstance(error, ServerError):
                raise error
            raise ConnectionLost(
                f"pserver {self.where} still unreachable {waited:.1f} s after the connection was lost "
                f"(rpc deadline {policy.deadline:g} s): {error}",
                error.reason,
            ) from (error.__cause__ or error)
        pause = min(policy.backoff * 2**self.attempt, MAX_BACKOFF, policy.deadline - waited)
        self.attempt += 1
        return pause if self.deadline is None else min(pause, self.deadline - now)
