"""Slowing down token guessing without slowing down the clients that hold the token.

Every AUTH is checked the moment it arrives (an HMAC compare costs microseconds): a right one is
answered at once, whatever else its address is doing. Only a *wrong* one is answered late, and
its address's failures are answered on a fixed schedule: each address has ``concurrent`` slots,
the n-th recent failure occupies a slot for ``base * 2**(n-1)`` seconds (at most ``max_delay``),
and a failure's refusal goes out when its slot time ends. Opening connections in parallel thus
buys nothing: an address learns at most ``concurrent`` wrong answers per ``max_delay`` seconds.

What the throttle holds is bounded: at most ``max_pending`` scheduled refusals per address and
``max_pending_total`` over the server, one timer each (its connection stops reading meanwhile).
A wrong AUTH beyond those bounds is not scheduled at all: it is *shed*, and its connection is left
to the handshake deadline every unauthenticated connection has (``handshake_timeout``), which
closes it unanswered. So a guesser holding thousands of connections open gets one answer per
connection per handshake deadline, costs the server nothing beyond the connections themselves,
and never delays a right AUTH from the same address.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from ...errors import ConfigError
from ...validate import count, seconds

#: ``check()`` says whether the MAC is right, or None when its connection has gone meanwhile
Check = Callable[[], "bool | None"]
#: ``verdict(ok, reason)`` answers the client (a refusal closes the connection)
Verdict = Callable[[bool, str], None]
#: ``shed()`` is called for a wrong AUTH over the bounds: its connection waits for its deadline
Shed = Callable[[], None]


class _Peer:
    __slots__ = ("failures", "last_failure", "slots", "pending")

    def __init__(self, concurrent: int) -> None:
        self.failures = 0
        self.last_failure = float("-inf")
        self.slots = [float("-inf")] * concurrent  # loop time at which each slot is free again
        self.pending = 0  # refusals scheduled and not yet sent


class AuthThrottle:
    """Per peer address: the n-th recent failure is answered after ``base * 2**(n-1)`` seconds
    (at most ``max_delay``) of one of ``concurrent`` slots; at most ``max_pending`` refusals are
    scheduled per address and ``max_pending_total`` in all (beyond them a wrong AUTH is shed). An
    address's count starts again after ``forget_after`` seconds without failures; at most
    ``max_peers`` addresses are remembered (the least recently seen are forgotten first)."""

    def __init__(
        self,
        base_delay: float = 0.05,
        max_delay: float = 1.0,
        concurrent: int = 2,
        *,
        forget_after: float = 60.0,
        max_pending: int = 64,
        max_pending_total: int = 4096,
        max_peers: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        seconds("base_delay", base_delay, "no delay")
        seconds("max_delay", max_delay, "no delay")
        seconds("forget_after", forget_after, "forget at once")
        for name, value in (("concurrent", concurrent), ("max_pending", max_pending), ("max_peers", max_peers)):
            count(name, value, least=1)
        if max_delay < base_delay:
            raise ConfigError(f"need base_delay <= max_delay, got {base_delay}, {max_delay}")
        if max_pending_total < max_pending:
            raise ConfigError(f"need max_pending <= max_pending_total, got {max_pending}, {max_pending_total}")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.concurrent = concurrent
        self.forget_after = forget_after
        self.max_pending = max_pending
        self.max_pending_total = max_pending_total
        self.max_peers = max_peers
        self.clock = clock
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self.failures_total = 0
        self.pending_total = 0
        self.shed_total = 0

    def _peer(self, address: str) -> _Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _Peer(self.concurrent)
            if len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)  # a scheduled refusal keeps its own reference
        else:
            self._peers.move_to_end(address)
        return peer

    def next_delay(self, address: str) -> float:
        """The slot time the next failure from ``address`` would get (for logs and tests)."""
        peer = self._peers.get(address)
        failures = 0 if peer is None or self.clock() - peer.last_failure > self.forget_after else peer.failures
        return self._delay(failures)

    def pending(self, address: str) -> int:
        """Refusals scheduled for ``address`` and not yet sent."""
        peer = self._peers.get(address)
        return 0 if peer is None else peer.pending

    def _delay(self, failures: int) -> float:
        return min(self.max_delay, self.base_delay * 2.0 ** min(failures, 64))  # no float overflow

    def submit(self, address: str, check: Check, verdict: Verdict, shed: Shed) -> None:
        """Check a MAC now; answer a right one now through ``verdict``, a wrong one when its
        slot time ends, or hand it to ``shed`` when the bounds are full."""
        ok = check()
        if ok is None:
            return
        if ok:
            verdict(True, "")
            return
        peer = self._peer(address)
        now = self.clock()
        if now - peer.last_failure > self.forget_after:
            peer.failures = 0
        delay = self._delay(peer.failures)
        peer.failures += 1
        peer.last_failure = now
        self.failures_total += 1
        if peer.pending >= self.max_pending or self.pending_total >= self.max_pending_total:
            self.shed_total += 1
            shed()
            return
        loop = asyncio.get_running_loop()
        slot = min(range(self.concurrent), key=peer.slots.__getitem__)
        due = max(loop.time(), peer.slots[slot]) + delay
        peer.slots[slot] = due
        peer.pending += 1
        self.pending_total += 1
        loop.call_at(due, self._refuse, peer, verdict)

    def _refuse(self, peer: _Peer, verdict: Verdict) -> None:
        peer.pending -= 1
        self.pending_total -= 1
        verdict(False, "bad token")
