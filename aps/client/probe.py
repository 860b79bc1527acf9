"""Waiting for pservers to accept connections.

Roles of one job rarely start in order: Kubernetes starts pods as it pleases, and a launcher that
starts the trainers only once every pserver listens makes a short job wait for pserver start-up
and trainer start-up one after the other. A trainer that waits for its pservers itself can start
with them. Only "not there yet" is waited for (refused, unreachable, a name that does not
resolve yet, a connect that times out); what the pserver answers once connected is the client's
business, not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from ..errors import CloseReason, ConnectionLost

#: seconds between tries while a pserver is not listening yet
POLL = 0.02


async def wait_listening(addresses: Sequence[str], seconds: float, poll: float = POLL) -> None:
    """Return once every ``host:port`` accepts a TCP connection (each probe is closed at once);
    :class:`ConnectionLost` naming the first that did not within ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    for address in addresses:
        host, _, port = address.rpartition(":")
        while True:
            left = deadline - loop.time()
            try:
                async with asyncio.timeout(max(left, poll)):
                    _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            except (OSError, TimeoutError) as exc:
                if loop.time() + poll > deadline:
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
                    raise ConnectionLost(
                        f"pserver {address} did not accept connections within {seconds:g} s ({reason})",
                        CloseReason.CONNECT_FAILED,
                    ) from exc
                await asyncio.sleep(poll)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            break
