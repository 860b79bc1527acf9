"""Pservers a client cannot reach right now: since when, the last connect error, what waits.

A lost pserver is retried until the client's deadline (retry.py), long enough for a restart; as
the only signal it meant minutes of silence when the pserver stayed dead. So every failed
attempt of a call is recorded here: the first failure of an outage is logged at once and then
one line every :data:`REPORT_PERIOD` seconds while calls still retry (warning ``pserver
unreachable``: address, since when, for how long, what waits for it, the last connect error,
when the waiting calls give up); the trainer's progress line and metrics records carry
:meth:`Outages.report`, and a call that times out names what it waited for.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..errors import RequestTimeout

log = structlog.get_logger("aps.client")

#: seconds between two log lines about one pserver that stays unreachable
REPORT_PERIOD = 3.0


@dataclass
class Outage:
    """One pserver address that failed its last attempts."""

    address: str
    since: float  # wall-clock time of the first failure
    started: float  # monotonic time of the first failure
    error: str
    waiting: Counter[str] = field(default_factory=Counter)  # request kind -> calls retrying it
    reported: float = 0.0  # monotonic time of the last log line

    def describe(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "since": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since)),
            "seconds": round(time.monotonic() - self.started, 1),
            "waiting": _waiting(self.waiting),
            "last_error": self.error,
        }


class Outages:
    """The unreachable pservers of one client (keyed by the address tried)."""

    def __init__(self, deadline: float, period: float = REPORT_PERIOD) -> None:
        self.deadline = deadline
        self.period = period
        self._by_address: dict[str, Outage] = {}

    def failed(self, address: str, error: BaseException, what: str, first: bool) -> None:
        """An attempt of a call (a ``what`` request) to ``address`` failed with ``error``;
        ``first``: the call's first failure (it waits from now until :meth:`ended`)."""
        now = time.monotonic()
        outage = self._by_address.get(address)
        if outage is None:
            outage = self._by_address[address] = Outage(address, time.time(), now, str(error))
        outage.error = str(error)
        if first:
            outage.waiting[what] += 1
        if now - outage.reported >= self.period or outage.reported == 0.0:
            outage.reported = now
            log.warning(
                "pserver unreachable",
                **outage.describe(),
                calls_fail_in=round(max(0.0, self.deadline - (now - outage.started)), 1),
            )

    def ended(self, address: str, what: str) -> None:
        """A call that had failed to reach ``address`` is over (it succeeded or gave up)."""
        outage = self._by_address.get(address)
        if outage is not None and outage.waiting[what] > 0:
            outage.waiting[what] -= 1
            if not outage.waiting[what]:
                del outage.waiting[what]

    def reached(self, address: str) -> None:
        """A connection to ``address`` opened: its outage, if any, is over."""
        outage = self._by_address.pop(address, None)
        if outage is not None:
            log.info("pserver reachable again", address=address, seconds=round(time.monotonic() - outage.started, 1))

    def report(self) -> list[dict[str, Any]]:
        """Every current outage (for progress lines, metrics records and errors)."""
        return [outage.describe() for outage in self._by_address.values()]

    def summary(self, address: str | None = None) -> str:
        """One line naming every current outage, or ``address``'s only ('' when none)."""
        return "; ".join(
            f"pserver {o['address']} unreachable since {o['since']} ({o['seconds']} s; last connect error: {o['last_error']})"
            for o in self.report()
            if address is None or o["address"] == address
        )

    def explain(self, error: RequestTimeout, address: str | None = None) -> RequestTimeout:
        """``error`` with what it waited for added: the outage of ``address`` (None: every
        outage of this client); ``error`` itself when there is none or it says so already."""
        summary = self.summary(address)
        if not summary or summary in str(error):
            return error
        explained = RequestTimeout(f"{error}: {summary}")
        explained.__cause__ = error
        return explained


def _waiting(waiting: Counter[str]) -> str:
    return ", ".join(f"{what} x{n}" if n > 1 else what for what, n in sorted(waiting.items())) or "nothing now"
