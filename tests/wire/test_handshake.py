"""The handshake state machines, driven by bytes through a FrameDecoder (no sockets): whole,
byte by byte, and with trailing bytes; every out-of-order message closes them for good. The
server's first, then the client's."""

from __future__ import annotations

import numpy as np
import pytest

from aps import wire
from aps.errors import ErrorCode, LocalProtocolError, RemoteProtocolError, TokenMissing
from aps.wire.auth import check_mac
from aps.wire.handshake import (
    HANDSHAKE_MAX_FRAME, Action, ClientHandshake, ClientState, HandshakeState, ServerHandshake,
)
from bench.hostile import cut_payload

MAX_FRAME = 1 << 20
PULL = wire.PullSparse(table="emb", ids=np.array([3, 1, 2], dtype=np.int64))


class Peer:
    """A decoder and a handshake, as a server connection holds them; records every step."""

    def __init__(self, token: bool) -> None:
        self.handshake = ServerHandshake(token, MAX_FRAME)
        self.decoder = wire.FrameDecoder(self.handshake.frame_limit)
        self.steps: list[tuple[int, Action, ErrorCode | None]] = []
        self.requests: list[wire.Message] = []

    def feed(self, data: bytes, chunk: int = 0) -> None:
        pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] if chunk else [data]
        for piece in pieces:
            self.decoder.receive_data(piece)
            while self.handshake.state not in (HandshakeState.CLOSED, HandshakeState.CHECKING):
                frame = self.decoder.next_frame()
                if frame is None:
                    break
                try:
                    msg: wire.Message | None = wire.decode(frame)
                except RemoteProtocolError as exc:  # as the server connection does
                    msg, step = None, self.handshake.receive_unparsable(frame.opcode, ErrorCode.BAD_REQUEST, str(exc))
                else:
                    step = self.handshake.receive(msg)
                self.steps.append((frame.request_id, step.action, step.code))
                self.decoder.max_frame = self.handshake.frame_limit
                if step.action is Action.REQUEST:
                    self.requests.append(msg)


def frames(*msgs: wire.Message) -> bytes:
    return b"".join(wire.encode_bytes(m, i + 1) for i, m in enumerate(msgs))


@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_no_token_hello_then_requests(chunk: int) -> None:
    peer = Peer(token=False)
    assert peer.decoder.max_frame == HANDSHAKE_MAX_FRAME
    peer.feed(frames(wire.Hello(client_id=9, trainer_id=2), PULL, wire.Ping()), chunk)
    assert peer.steps == [(1, Action.HELLO, None), (2, Action.REQUEST, None), (3, Action.REQUEST, None)]
    assert peer.handshake.state is HandshakeState.READY
    assert (peer.handshake.client_id, peer.handshake.trainer_id) == (9, 2)
    assert peer.decoder.max_frame == MAX_FRAME  # the full size once handshaken
    assert isinstance(peer.requests[0], wire.PullSparse)
    assert peer.requests[0].ids.tolist() == [3, 1, 2]


@pytest.mark.parametrize("chunk", [0, 1, 5])
def test_token_hello_auth_checked_then_requests(chunk: int) -> None:
    peer = Peer(token=True)
    data = frames(wire.Hello(client_id=4), wire.Auth(mac=b"m" * 32), PULL)
    peer.feed(data, chunk)
    # the machine stops at the AUTH: the pull waits in the decoder until the verdict
    assert peer.steps == [(1, Action.HELLO, None), (2, Action.CHECK_AUTH, None)]
    assert peer.handshake.state is HandshakeState.CHECKING
    assert peer.decoder.max_frame == HANDSHAKE_MAX_FRAME
    with pytest.raises(LocalProtocolError, match="being checked"):
        peer.handshake.receive(wire.Ping())
    assert peer.handshake.auth_checked(True).action is Action.AUTH_OK
    peer.decoder.max_frame = peer.handshake.frame_limit
    peer.feed(b"")
    assert peer.steps[-1] == (3, Action.REQUEST, None)
    assert peer.decoder.max_frame == MAX_FRAME


def test_trailing_bytes_stay_for_the_next_frame() -> None:
    peer = Peer(token=False)
    whole = frames(wire.Hello(client_id=1), PULL)
    peer.feed(whole[:-5])  # HELLO plus all but the pull's last 5 bytes
    assert peer.steps == [(1, Action.HELLO, None)]
    assert peer.decoder.buffered == len(whole) - 5 - len(frames(wire.Hello(client_id=1)))
    peer.feed(whole[-5:])
    assert [s[1] for s in peer.steps] == [Action.HELLO, Action.REQUEST]
    assert peer.decoder.buffered == 0


def test_request_before_hello_closes_and_stays_closed() -> None:
    peer = Peer(token=False)
    peer.feed(frames(PULL, wire.Hello(client_id=1)))
    assert peer.steps == [(1, Action.REFUSE, ErrorCode.AUTH_REQUIRED)]  # the hello after it is never read
    assert peer.handshake.state is HandshakeState.CLOSED
    assert peer.handshake.close_reason == "the first message must be hello"
    with pytest.raises(LocalProtocolError, match="closed"):
        peer.handshake.receive(wire.Hello(client_id=1))


def test_auth_before_hello_is_refused() -> None:
    peer = Peer(token=True)
    peer.feed(frames(wire.Auth(mac=b"x")))
    assert peer.steps == [(1, Action.REFUSE, ErrorCode.AUTH_REQUIRED)]


def test_request_without_auth_on_a_token_server_closes() -> None:
    peer = Peer(token=True)
    peer.feed(frames(wire.Hello(client_id=1), PULL), 3)
    assert peer.steps == [(1, Action.HELLO, None), (2, Action.REFUSE, ErrorCode.AUTH_REQUIRED)]
    assert peer.handshake.close_reason == "this server needs a token"
    assert peer.decoder.max_frame == HANDSHAKE_MAX_FRAME  # never grew for an unauthenticated peer


def test_wrong_auth_closes_with_its_reason() -> None:
    peer = Peer(token=True)
    peer.feed(frames(wire.Hello(client_id=1), wire.Auth(mac=b"bad")))
    step = peer.handshake.auth_checked(False, "wrong token")
    assert (step.action, step.code, step.message) == (Action.REFUSE, ErrorCode.AUTH_FAILED, "wrong token")
    assert peer.handshake.state is HandshakeState.CLOSED
    with pytest.raises(LocalProtocolError):
        peer.handshake.auth_checked(True)  # sticky: a late verdict cannot reopen it
    assert peer.handshake.state is HandshakeState.CLOSED


def test_duplicate_hello_is_an_error_reply_not_a_close() -> None:
    peer = Peer(token=False)
    peer.feed(frames(wire.Hello(client_id=1), wire.Hello(client_id=2), wire.Ping()))
    assert peer.steps == [(1, Action.HELLO, None), (2, Action.ERROR, ErrorCode.BAD_REQUEST), (3, Action.REQUEST, None)]
    assert peer.handshake.client_id == 1  # the second hello changed nothing


def test_auth_after_the_handshake_is_an_error_reply_never_a_check() -> None:
    """A second AUTH on an authenticated connection is answered at once: were its MAC checked,
    a wrong one could be shed by the throttle and leave the connection held, unanswered."""
    peer = Peer(token=True)
    peer.feed(frames(wire.Hello(client_id=1), wire.Auth(mac=b"x")))
    assert peer.handshake.auth_checked(True).action is Action.AUTH_OK
    peer.feed(wire.encode_bytes(wire.Auth(mac=b"junk"), 3) + wire.encode_bytes(wire.Ping(), 4))
    assert peer.steps[-2:] == [(3, Action.ERROR, ErrorCode.BAD_REQUEST), (4, Action.REQUEST, None)]
    assert peer.handshake.state is HandshakeState.READY


def test_auth_on_a_server_without_token_is_ok() -> None:
    peer = Peer(token=False)
    peer.feed(frames(wire.Hello(client_id=1), wire.Auth(mac=b"")))
    assert peer.steps[-1] == (2, Action.AUTH_OK, None)
    assert peer.handshake.state is HandshakeState.READY


def test_a_big_frame_before_the_handshake_breaks_the_stream() -> None:
    peer = Peer(token=False)
    big = wire.PullSparse(table="emb", ids=np.arange(HANDSHAKE_MAX_FRAME, dtype=np.int64))
    with pytest.raises(RemoteProtocolError, match="max frame"):
        peer.feed(frames(big))
    assert peer.steps == []


def cut(msg: wire.Message, request_id: int) -> bytes:
    """``msg``'s frame with its payload cut to 5 bytes: a whole frame that does not decode."""
    return cut_payload(wire.encode_bytes(msg, request_id), 5)


@pytest.mark.parametrize("chunk", [0, 1])
def test_unparsable_frame_before_hello_closes_and_the_hello_after_it_is_never_read(chunk: int) -> None:
    peer = Peer(token=False)
    peer.feed(cut(PULL, 1) + frames(wire.Hello(client_id=1)) + cut(PULL, 3), chunk)
    assert peer.steps == [(1, Action.REFUSE, ErrorCode.AUTH_REQUIRED)]
    assert (peer.handshake.state, peer.handshake.close_reason) == (HandshakeState.CLOSED, "the first message must be hello")
    with pytest.raises(LocalProtocolError, match="CLOSED"):
        peer.handshake.receive_unparsable(int(wire.Op.PULL_SPARSE), ErrorCode.BAD_REQUEST, "late")


def test_unparsable_hello_is_bad_request_and_closes() -> None:
    peer = Peer(token=False)
    peer.feed(cut(wire.Hello(client_id=1), 1) + frames(wire.Hello(client_id=1)))
    assert peer.steps == [(1, Action.REFUSE, ErrorCode.BAD_REQUEST)]
    assert peer.handshake.close_reason.startswith("bad hello: payload truncated")


def test_unparsable_frame_before_auth_on_a_token_server_closes() -> None:
    for bad, code in ((cut(PULL, 2), ErrorCode.AUTH_REQUIRED), (cut(wire.Auth(mac=bytes(32)), 2), ErrorCode.BAD_REQUEST)):
        peer = Peer(token=True)
        peer.feed(frames(wire.Hello(client_id=1)) + bad + wire.encode_bytes(wire.Auth(mac=bytes(32)), 3))
        assert peer.steps == [(1, Action.HELLO, None), (2, Action.REFUSE, code)]
        assert peer.handshake.state is HandshakeState.CLOSED


def test_unparsable_frame_after_the_handshake_is_an_error_reply_not_a_close() -> None:
    peer = Peer(token=False)
    peer.feed(frames(wire.Hello(client_id=1)) + cut(PULL, 2) + wire.encode_bytes(wire.Ping(), 3))
    assert peer.steps == [(1, Action.HELLO, None), (2, Action.ERROR, ErrorCode.BAD_REQUEST), (3, Action.REQUEST, None)]


def test_close_keeps_the_first_reason() -> None:
    hs = ServerHandshake(False, MAX_FRAME)
    hs.close("connection lost")
    hs.close("server shutting down")
    assert (hs.state, hs.close_reason) == (HandshakeState.CLOSED, "connection lost")


# ---------------------------------------------------------------- the client's machine

NONCE = bytes(range(16))


def _replies(*msgs: wire.Message, chunk: int = 0) -> list[wire.Message]:
    """Encode the server's replies and read them back through a decoder (``chunk`` bytes a time)."""
    data = b"".join(wire.encode_bytes(m, i + 1) for i, m in enumerate(msgs))
    decoder = wire.FrameDecoder(MAX_FRAME)
    out = []
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] if chunk else [data]
    for piece in pieces:
        decoder.receive_data(piece)
        while (frame := decoder.next_frame()) is not None:
            out.append(wire.decode(frame))
    return out


def _hello_reply(auth: bool) -> wire.HelloReply:
    return wire.HelloReply(server_index=1, num_servers=3, max_frame=4096, auth_required=int(auth), lease_ms=2500, nonce=NONCE)


@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_client_handshake_without_token_is_ready_after_hello_reply(chunk: int) -> None:
    hs = ClientHandshake(client_id=42, trainer_id=0, token=None, max_frame=MAX_FRAME, address="h:1")
    assert hs.hello() == wire.Hello(client_id=42, trainer_id=0)
    (reply,) = _replies(_hello_reply(False), chunk=chunk)
    assert hs.receive(reply) is None and hs.ready
    assert (hs.server_index, hs.num_servers, hs.max_frame, hs.lease) == (1, 3, 4096, 2.5)


@pytest.mark.parametrize("chunk", [0, 1, 5])
def test_client_handshake_with_token_sends_the_mac_of_the_servers_nonce(chunk: int) -> None:
    hs = ClientHandshake(client_id=42, trainer_id=-1, token="s3cret", max_frame=MAX_FRAME)
    hello_reply, ok = _replies(_hello_reply(True), wire.Ok(op=wire.Op.AUTH), chunk=chunk)
    auth = hs.receive(hello_reply)
    assert isinstance(auth, wire.Auth) and check_mac("s3cret", NONCE, 42, auth.mac)
    assert hs.state is ClientState.AWAIT_AUTH_OK and not hs.ready
    assert hs.receive(ok) is None and hs.ready


def test_client_handshake_without_the_token_a_server_needs_is_a_config_error() -> None:
    hs = ClientHandshake(client_id=1, trainer_id=-1, token=None, max_frame=MAX_FRAME, address="h:9")
    with pytest.raises(TokenMissing, match="h:9 requires a token"):
        hs.receive(_hello_reply(True))
    assert hs.state is ClientState.CLOSED


@pytest.mark.parametrize(
    "token, replies",
    [
        (None, [wire.Ok(op=wire.Op.AUTH)]),  # OK before HELLO_REPLY
        (None, [_hello_reply(False), _hello_reply(False)]),  # a second HELLO_REPLY
        ("t", [_hello_reply(True), _hello_reply(True)]),  # HELLO_REPLY where OK(AUTH) belongs
        ("t", [_hello_reply(True), wire.Ok(op=wire.Op.PING)]),  # OK of another op
    ],
)
def test_client_handshake_out_of_order_is_the_servers_protocol_error(token: str | None, replies: list) -> None:
    hs = ClientHandshake(client_id=1, trainer_id=-1, token=token, max_frame=MAX_FRAME)
    with pytest.raises(RemoteProtocolError, match="answered the handshake"):
        for reply in _replies(*replies):
            hs.receive(reply)
    assert hs.state is ClientState.CLOSED
    with pytest.raises(RemoteProtocolError):  # closed for good
        hs.receive(_hello_reply(False))
