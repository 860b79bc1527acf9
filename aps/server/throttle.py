"""Slowing down token guessing: failed handshakes are answered late, and few at a time per address.

Answering a wrong MAC late is not enough by itself: a right one is answered at once, so a guesser
that opens many connections in parallel learns from the silence that its guesses failed. So a
failed check also holds one of its address's few *slots* until its late answer goes out, and an
AUTH from an address whose slots are all held waits before it is even checked. A guesser thus gets
at most ``concurrent`` checks per ``max_delay`` seconds per address, however many connections it
opens, while a client with the right token, from an address without recent failures, is checked
and answered at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable

#: ``check()`` says whether the MAC is right, or None when its connection has gone meanwhile
Check = Callable[[], "bool | None"]
#: ``verdict(ok, reason)`` answers the client (a refusal closes the connection)
Verdict = Callable[[bool, str], None]


class _Peer:
    __slots__ = ("failures", "last_failure", "held", "waiting")

    def __init__(self) -> None:
        self.failures = 0
        self.last_failure = float("-inf")
        self.held = 0
        self.waiting: deque[tuple[Check, Verdict]] = deque()


class AuthThrottle:
    """Per peer address: the n-th recent failure is answered after ``base * 2**(n-1)`` seconds
    (at most ``max_delay``), at most ``concurrent`` failures are held at once, and further AUTHs
    from that address wait (up to ``max_waiting``; more are refused unchecked). An address's count
    starts again after ``forget_after`` seconds without failures; at most ``max_peers`` addresses
    are remembered (the least recently seen are forgotten first)."""

    def __init__(
        self,
        base_delay: float = 0.05,
        max_delay: float = 1.0,
        concurrent: int = 2,
        *,
        forget_after: float = 60.0,
        max_waiting: int = 256,
        max_peers: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if base_delay < 0 or max_delay < base_delay:
            raise ValueError(f"need 0 <= base_delay <= max_delay, got {base_delay}, {max_delay}")
        if concurrent < 1:
            raise ValueError(f"concurrent must be >= 1, got {concurrent}")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.concurrent = concurrent
        self.forget_after = forget_after
        self.max_waiting = max_waiting
        self.max_peers = max_peers
        self.clock = clock
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self.failures_total = 0

    def _peer(self, address: str) -> _Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _Peer()
            if len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)  # a pending timer keeps its own reference
        else:
            self._peers.move_to_end(address)
        return peer

    def next_delay(self, address: str) -> float:
        """The delay the next failure from ``address`` would get (for logs and tests)."""
        peer = self._peers.get(address)
        failures = 0 if peer is None or self.clock() - peer.last_failure > self.forget_after else peer.failures
        return self._delay(failures)

    def _delay(self, failures: int) -> float:
        return min(self.max_delay, self.base_delay * 2.0 ** min(failures, 64))  # no float overflow

    def submit(self, address: str, check: Check, verdict: Verdict) -> None:
        """Check a MAC now, or once a slot of ``address`` frees; answer through ``verdict``."""
        peer = self._peer(address)
        if peer.held < self.concurrent:
            self._run(peer, check, verdict)
        elif len(peer.waiting) < self.max_waiting:
            peer.waiting.append((check, verdict))
        else:
            verdict(False, "too many failed handshakes from this address; try again later")

    def _run(self, peer: _Peer, check: Check, verdict: Verdict) -> None:
        ok = check()
        if ok is None:
            return
        if ok:
            verdict(True, "")
            return
        now = self.clock()
        if now - peer.last_failure > self.forget_after:
            peer.failures = 0
        delay = self._delay(peer.failures)
        peer.failures += 1
        peer.last_failure = now
        peer.held += 1
        self.failures_total += 1
        asyncio.get_running_loop().call_later(delay, self._release, peer, verdict)

    def _release(self, peer: _Peer, verdict: Verdict) -> None:
        peer.held -= 1
        try:
            verdict(False, "bad token")
        finally:
            while peer.waiting and peer.held < self.concurrent:
                check, waiting_verdict = peer.waiting.popleft()
                self._run(peer, check, waiting_verdict)
