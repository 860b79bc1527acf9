"""The client's connections: one :class:`Link` per port of every pserver, and the one way a
request goes out (:meth:`LinkPool.call`), retried over reconnects by the client's policy.

A link is opened on first use and shared by every concurrent caller (one connect in flight per
port, however many wait for it). A reconnect must find the same server index it found before:
a pserver restarted with another index would mix shards, so that is a loud error. A trainer's
pool also pings every open link while the trainer computes, so the pservers can tell a quiet
trainer from a dead one (aps-server --trainer-timeout).
"""

from __future__ import annotations

import asyncio
import ssl as _ssl

from .. import wire
from ..errors import CloseReason, ConfigError, ConnectionLost, RequestTimeout, ServerError
from .fanout import gather
from .lanes import PortPlan, lane_address
from .link import Link
from .outages import Outages
from .retry import Attempts, RetryPolicy, timed_out, within

#: bytes kept free in a frame for the header and small fields when sizing chunks
FRAME_SLACK = 4096


class LinkPool:
    """The links of one client, lane ``j`` of server ``k`` at ``k * ports.lanes + j``."""

    def __init__(
        self,
        addresses: list[str],
        ports: PortPlan,
        retry: RetryPolicy,
        *,
        client_id: int,
        trainer_id: int,
        token: str | None,
        max_frame: int,
        ssl: _ssl.SSLContext | None,
        timeout: float | None,
        heartbeat: float,
        busy_poll: float = 0.0,
    ) -> None:
        self.addresses = addresses
        self.ports = ports
        self.retry = retry
        self.client_id = client_id
        self.trainer_id = trainer_id
        self.token = token
        self.max_frame = max_frame
        self.ssl = ssl
        self.timeout = timeout
        self.heartbeat = heartbeat
        #: seconds each link spins for a lone request's reply (Link.busy_poll); 0: never
        self.busy_poll = busy_poll
        lanes = len(addresses) * ports.lanes
        self.links: list[Link | None] = [None] * lanes
        self._connecting: list[asyncio.Future[Link] | None] = [None] * lanes
        self._next_request = 1
        self._frame_budget: int | None = None  # frame_budget(), until the links change
        self.closed = False
        self._heartbeat: asyncio.Task[None] | None = None
        #: pservers unreachable right now, reported as they stay so (outages.py)
        self.outages = Outages(retry.deadline)

    def request_id(self, count: int = 1) -> int:
        """The first of ``count`` fresh request ids."""
        rid = self._next_request
        self._next_request += count
        return rid

    def frame_budget(self) -> int:
        """Bytes of payload one frame may carry to every server (the smallest max frame); kept
        until a link is opened or the client closes, as every small pull asks for it."""
        if self._frame_budget is None:
            limit = min([self.max_frame] + [link.max_frame for link in self.links if link is not None])
            self._frame_budget = max(1024, limit - FRAME_SLACK)
        return self._frame_budget

    # ----------------------------------------------------------------- open and close

    async def open(self) -> None:
        """Connect to every port of every pserver (concurrently) within the client's timeout,
        check they agree on the cluster layout, and start the heartbeats of a trainer."""
        num_servers, lanes = len(self.addresses), self.ports.lanes
        try:
            links = await within(gather([self.link(k, j) for k in range(num_servers) for j in range(lanes)]), self.timeout)
        except BaseException:
            await self.aclose()  # no half-open client: close the links that did open
            raise
        for i, link in enumerate(links):
            k = i // lanes
            if link.num_servers != num_servers or link.server_index != k:
                await self.aclose()
                raise ConfigError(
                    f"pserver {link.address} says it is server {link.server_index} of {link.num_servers}, "
                    f"but it is number {k} of the {num_servers} addresses given: order or count is wrong"
                )
        if self.trainer_id >= 0 and self.heartbeat > 0 and self._heartbeat is None:
            self._heartbeat = asyncio.ensure_future(self._heartbeats())

    async def aclose(self) -> None:
        """Stop the heartbeats and close every link; later calls fail (ConfigError)."""
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None
        for link in self.links:
            if link is not None:
                link.close()
        self.links = [None] * len(self.links)
        self._frame_budget = None

    async def _heartbeats(self) -> None:
        """Ping every open connection each ``heartbeat`` seconds (or a quarter of the shortest
        lease a pserver announced, if less), so the pservers keep this
        trainer's lease while it computes. A ping that fails is not an error here: the link is
        then closed, and the next real call reconnects (within ``deadline``) or fails loudly."""
        while True:
            # four beats per lease, so that one late ping never costs a live trainer its lease
            leases = [link.lease / 4 for link in self.links if link is not None and link.lease > 0]
            interval = min([self.heartbeat, *leases])
            await asyncio.sleep(interval)
            links = [link for link in self.links if link is not None and not link.closed]
            pings = [link.request(wire.Ping(), self.request_id()) for link in links]
            try:
                async with asyncio.timeout(interval):
                    await asyncio.gather(*pings, return_exceptions=True)
            except TimeoutError:
                pass  # a server too busy to answer in time still got the ping: its lease is renewed

    # ----------------------------------------------------------------- links

    async def link(self, k: int, lane: int = 0) -> Link:
        """The open link to server k's port ``lane``, connecting (once, for every waiter) if needed."""
        i = k * self.ports.lanes + lane
        link = self.links[i]
        if link is not None and not link.closed:
            return link
        pending = self._connecting[i]
        if pending is None:
            pending = self._connecting[i] = asyncio.ensure_future(self._open_link(k, lane))
        try:
            link = await asyncio.shield(pending)
        finally:
            if pending.done():
                self._connecting[i] = None
        if self.closed:  # closed while connecting: the new link must not outlive the client
            link.close()
            raise ConnectionLost(f"client closed while connecting to {link.address}", CloseReason.CLOSED)
        self.links[i] = link
        self._frame_budget = None
        self.outages.reached(link.address)
        return link

    async def _open_link(self, k: int, lane: int = 0) -> Link:
        """Connect and handshake, bounded: a peer that accepts TCP but never answers must not
        wedge every later call to this server on one shared, never-finishing connect."""
        address = lane_address(self.addresses[k], lane)
        num_servers = len(self.addresses)
        try:
            async with asyncio.timeout(self.timeout):
                link = await Link.open(
                    address, self.client_id, self.trainer_id, self.token, self.max_frame, self.request_id(2), ssl=self.ssl,
                )
        except TimeoutError:
            raise ConnectionLost(
                f"pserver {address} did not answer the handshake within {self.timeout} s", CloseReason.HANDSHAKE_TIMEOUT
            ) from None
        if self.busy_poll:
            link.busy_poll(self.busy_poll)
        if self.links[k * self.ports.lanes + lane] is not None and (link.server_index, link.num_servers) != (k, num_servers):
            link.close()  # a reconnect found another server at this address: never mix shards
            raise ConfigError(
                f"pserver {link.address} now says it is server {link.server_index} of {link.num_servers}, "
                f"but it was server {k} of {num_servers}: restart it with the same index"
            )
        return link

    async def _connect_by(self, k: int, lane: int, deadline: float | None, limit: float) -> Link:
        """The link to server k's port ``lane``, (re)connecting if needed before ``deadline``."""
        if deadline is None:
            return await self.link(k, lane)
        try:
            async with asyncio.timeout_at(deadline):
                return await self.link(k, lane)
        except TimeoutError:
            raise timed_out(limit, f"connecting to server {k}") from None

    # ----------------------------------------------------------------- requests

    async def call(
        self, k: int, msg: wire.Message, flags: int = 0, lane: int = 0, deadline: float | None = None, limit: float = 0.0
    ) -> wire.Message:
        """One request to server k (on its port ``lane``), retried on lost connections and
        retriable server errors as the client's :class:`RetryPolicy` says (retry.py).

        The request id stays the same across attempts, so the server drops a replayed push it
        has already applied and answers with the first reply.

        ``deadline`` (loop time; ``limit`` the seconds it stands for): the whole call, retries
        included, fails with :class:`RequestTimeout` once it passes. The link watches it, so a
        one-request call needs no timeout context of its own.
        """
        if self.closed:
            raise ConfigError("this client is closed")
        request_id = self.request_id()
        attempts: Attempts | None = None
        unreachable = ""  # the address this call failed to reach, while it retries
        try:
            while True:
                try:
                    link = self.links[k * self.ports.lanes + lane]
                    if link is None or link.closed:
                        link = await self._connect_by(k, lane, deadline, limit)
                    return await link.request(msg, request_id, flags, deadline, limit)
                except (ConnectionLost, ServerError) as exc:
                    if self.closed:  # closed by its owner meanwhile: no reconnect, no retry
                        raise
                    address = lane_address(self.addresses[k], lane)
                    if attempts is None:
                        attempts = self.retry.attempts(address, deadline, limit)
                    if isinstance(exc, ConnectionLost):
                        self.outages.failed(address, exc, type(msg).__name__, first=not unreachable)
                        unreachable = address
                    pause = attempts.failed(exc, asyncio.get_running_loop().time())
                await asyncio.sleep(pause)
        except RequestTimeout as exc:
            if unreachable:  # the timeout's cause: name the pserver and its last connect error
                raise self.outages.explain(exc, unreachable) from exc
            raise
        finally:
            if unreachable:
                self.outages.ended(unreachable, type(msg).__name__)
