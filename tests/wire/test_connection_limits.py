"""A server connection's limits without a socket: what a header may declare, how arriving bytes
are charged to the server-wide pools and given back, when reading stops, and when the handshake
and a frame are due (times are passed in)."""

from __future__ import annotations

from dataclasses import dataclass

from aps.errors import ErrorCode
from aps.wire import HEADER_SIZE
from aps.wire.limits import ConnectionLimits


@dataclass
class Pools:
    inflight_bytes: int = 0
    handshake_bytes: int = 0


def at(t: float):
    """A clock that reads ``t``."""
    return lambda: t


def limits(pools: Pools, **kw: float) -> ConnectionLimits:
    return ConnectionLimits(pools, **kw)  # type: ignore[arg-type]


def test_arriving_bytes_are_charged_to_the_handshake_pool_then_moved_to_the_main_one() -> None:
    pools = Pools()
    lim = limits(pools)
    assert lim.charge_arrived(10) is None and lim.charge_arrived(25) is None  # 25 buffered in all
    assert (lim.held, lim.arrived, pools.handshake_bytes, pools.inflight_bytes) == (25, 25, 25, 0)
    assert lim.charge_arrived(25) is None  # nothing new
    lim.through_handshake()
    assert (pools.handshake_bytes, pools.inflight_bytes, lim.in_handshake) == (0, 25, False)
    lim.take_frame(20)
    assert (lim.arrived, lim.frame) == (5, 20)
    lim.frame_done()
    assert (lim.held, pools.inflight_bytes, lim.frame) == (5, 5, 0)
    lim.lost()  # the 5 bytes of a half-received frame go with the connection
    assert (lim.held, pools.inflight_bytes) == (0, 0)


def test_a_waiting_request_holds_its_frame_until_done() -> None:
    pools = Pools()
    lim = limits(pools)
    lim.through_handshake()
    lim.charge_arrived(100)
    lim.take_frame(100)
    lim.hold_frame("barrier")
    lim.frame_done()  # taken over by the request: nothing released
    assert (lim.held, pools.inflight_bytes) == (100, 100)
    lim.lost()  # the connection goes: a waiting request still holds its bytes
    assert pools.inflight_bytes == 100
    lim.request_done("barrier")
    assert (lim.held, pools.inflight_bytes) == (0, 0)
    lim.request_done("barrier")  # twice: nothing more
    assert pools.inflight_bytes == 0


def test_declared_size_is_checked_against_what_waiting_requests_hold() -> None:
    lim = limits(Pools(), max_connection_bytes=1000)
    assert lim.declared(1000 - HEADER_SIZE) is None
    lim.charge_arrived(300)
    lim.take_frame(300)
    lim.hold_frame(1)
    lim.charge_arrived(50)  # received, not held by a waiting request: not counted against it
    assert lim.declared(700 - HEADER_SIZE) is None
    refusal = lim.declared(701 - HEADER_SIZE)
    assert refusal is not None and refusal.code is ErrorCode.TOO_LARGE and refusal.retriable
    assert "300 bytes in flight and this frame's 701" in refusal.message and "--max-connection-bytes" in refusal.message
    assert limits(Pools()).declared(1 << 40) is None  # 0: no limit


def test_arriving_bytes_over_the_pool_budget_are_refused_and_not_charged() -> None:
    pools = Pools(handshake_bytes=90)
    lim = limits(pools, max_handshake_bytes=100, max_inflight_bytes=1000)
    assert lim.charge_arrived(10) is None
    refusal = lim.charge_arrived(11)
    assert refusal is not None and "--max-handshake-bytes" in refusal.message and "100 bytes in flight and 1 more" in refusal.message
    assert (lim.held, pools.handshake_bytes) == (10, 100)
    lim.through_handshake()
    pools.inflight_bytes = 995
    refusal = lim.charge_arrived(20)
    assert refusal is not None and "--max-inflight-bytes" in refusal.message and refusal.code is ErrorCode.TOO_LARGE
    assert (lim.held, pools.inflight_bytes) == (10, 995)


def test_should_pause() -> None:
    lim = limits(Pools(), max_requests=2)
    assert not lim.should_pause(checking_auth=False, peer_reading=True, waiting=1)
    assert lim.should_pause(checking_auth=False, peer_reading=True, waiting=2)
    assert lim.should_pause(checking_auth=True, peer_reading=True, waiting=0)
    assert lim.should_pause(checking_auth=False, peer_reading=False, waiting=0)


def test_reading_stops_and_resumes_once_per_change_and_a_stop_clears_the_frame_deadline() -> None:
    lim = limits(Pools(), max_requests=2, frame_timeout=5.0)
    assert lim.reading(checking_auth=False, waiting=1) is None  # reading, and still reads
    lim.watch_frame(at(1.0), 3, reading=True, completed=False)
    assert lim.reading(checking_auth=False, waiting=2) is True and lim.read_paused
    assert lim.frame_deadline() is None  # the peer cannot finish a frame while we do not read
    assert lim.reading(checking_auth=False, waiting=2) is None  # already stopped
    lim.peer_reading = False
    assert lim.reading(checking_auth=False, waiting=0) is None  # stopped still: the peer does not read
    lim.peer_reading = True
    assert lim.reading(checking_auth=True, waiting=0) is None  # an AUTH is checked
    assert lim.reading(checking_auth=False, waiting=0) is False and not lim.read_paused


def test_handshake_deadline() -> None:
    assert limits(Pools(), handshake_timeout=2.5).handshake_deadline(100.0) == 102.5
    assert limits(Pools()).handshake_deadline(100.0) is None


def test_frame_deadline_runs_from_the_first_byte_of_the_frame_in_progress() -> None:
    lim = limits(Pools(), frame_timeout=5.0)
    assert lim.watch_frame(at(10.0), 0, reading=True, completed=False) is None  # nothing buffered
    assert lim.watch_frame(at(11.0), 3, reading=True, completed=False) == 16.0  # a frame began at 11
    assert lim.watch_frame(at(13.0), 8, reading=True, completed=False) == 16.0  # still the same frame
    assert lim.frame_deadline() == 16.0
    assert lim.watch_frame(at(14.0), 2, reading=True, completed=True) == 19.0  # one done, the next began
    assert lim.watch_frame(at(15.0), 2, reading=False, completed=False) is None  # we do not read: no deadline
    assert lim.frame_deadline() is None
    lim.watch_frame(at(16.0), 2, reading=True, completed=False)
    lim.reading_stopped()
    assert lim.frame_deadline() is None
    assert limits(Pools()).watch_frame(at(1.0), 3, reading=True, completed=False) is None  # 0: no limit
