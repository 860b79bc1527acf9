"""What a request's answer becomes on the wire, without a socket: the error reply of a
ServerError (retriable by its word or its code, message bounded) and a reply too large for a
frame turned into a TOO_LARGE error the client can read."""

from __future__ import annotations

import numpy as np
import pytest

from aps import wire
from aps.errors import ErrorCode, LocalProtocolError, ServerError
from aps.server.transport import dispatch
from aps.server.config import ServerConfig


def decoded(parts: list[bytes]) -> tuple[int, wire.Message]:
    dec = wire.FrameDecoder(1 << 30)
    dec.receive_data(b"".join(bytes(p) for p in parts))
    frame = dec.next_frame()
    assert frame is not None and dec.next_frame() is None
    return frame.request_id, wire.decode(frame)


def test_error_reply_is_retriable_by_its_word_or_its_code_and_bounded() -> None:
    plain = dispatch.error_reply(ServerError(ErrorCode.BAD_REQUEST, "no"))
    assert (plain.code, plain.retriable, plain.message) == (int(ErrorCode.BAD_REQUEST), 0, "no")
    assert dispatch.error_reply(ServerError(ErrorCode.TOO_LARGE, "later", True)).retriable == 1
    assert dispatch.error_reply(dispatch.shutting_down()).retriable == 1
    assert dispatch.error_reply(ServerError(ErrorCode.SHUTTING_DOWN, "stop")).retriable == 1  # by its code
    assert len(dispatch.error_reply(ServerError(ErrorCode.INTERNAL, "x" * 10_000)).message) == 4000


def test_a_reply_too_large_for_a_frame_becomes_a_too_large_error() -> None:
    rows = wire.ArrayReply(op=int(wire.Op.PULL_SPARSE), values=np.ones((100, 16), np.float32))
    request_id, msg = decoded(dispatch.encode_reply(rows, 7, max_frame=1 << 20))
    assert request_id == 7 and isinstance(msg, wire.ArrayReply) and msg.values.shape == (100, 16)
    request_id, msg = decoded(dispatch.encode_reply(rows, 8, max_frame=1024))
    assert request_id == 8 and isinstance(msg, wire.Error)
    assert (msg.code, msg.retriable) == (int(ErrorCode.TOO_LARGE), 0) and msg.message.startswith("reply not sent: ")
    with pytest.raises(LocalProtocolError):  # an error that does not fit is our bug: not hidden
        dispatch.encode_reply(wire.Error(code=1, message="x" * 2000), 9, max_frame=1024)


async def test_a_waiting_request_settles_to_its_reply_or_the_error_to_answer() -> None:
    async def reply() -> wire.Message:
        return wire.Ok(op=wire.Op.BARRIER)

    async def refused() -> wire.Message:
        raise ServerError(ErrorCode.TRAINER_GONE, "gone")

    async def broken() -> wire.Message:
        raise KeyError("a bug")

    assert await dispatch.settle(reply(), "Barrier", "peer") == wire.Ok(op=wire.Op.BARRIER)
    error = await dispatch.settle(refused(), "Barrier", "peer")
    assert isinstance(error, ServerError) and error.code is ErrorCode.TRAINER_GONE
    error = await dispatch.settle(broken(), "Barrier", "peer")
    assert isinstance(error, ServerError) and (error.code, error.message) == (ErrorCode.INTERNAL, "KeyError: 'a bug'")


def test_hello_reply_says_the_servers_place_limits_lease_and_token() -> None:
    config = ServerConfig(server_index=1, num_servers=3, max_frame=1 << 20, token="t", trainer_timeout=2.5)
    reply = dispatch.hello_reply(config, b"n" * 16)
    assert (reply.server_index, reply.num_servers, reply.max_frame, reply.auth_required, reply.lease_ms) == (1, 3, 1 << 20, 1, 2500)
    assert reply.nonce == b"n" * 16
