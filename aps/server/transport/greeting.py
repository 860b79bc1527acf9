"""What a pserver answers in a connection's handshake: HELLO's reply, AUTH's check through the
guess throttle and its verdict, and a refusal.

Why apart from the connection: the handshake's state machine (aps/wire/handshake.py) says what a
message is; these are the answers and their order (the budget moves and the connection counts
as established before HELLO's reply when no token is needed, after AUTH's verdict when one is;
a wrong AUTH is answered late or not at all), not transport. The connection hands over what it
decoded and gives the few operations the answers need (:class:`Port`).
"""

from __future__ import annotations

from typing import Protocol

import structlog

from ... import wire
from ...errors import CloseReason, ServerError
from ...wire.auth import check_mac
from ...wire.handshake import Action, ServerHandshake, Step
from ..config import ServerConfig
from . import dispatch
from .throttle import AuthThrottle

log = structlog.get_logger("aps.server")

_AUTH_OK = wire.Ok(op=wire.Op.AUTH)


class Port(Protocol):
    """What the answers need of their connection."""

    peer: str

    @property
    def closed(self) -> bool: ...

    def send(self, msg: wire.Message, request_id: int) -> int: ...

    def send_error(self, request_id: int, exc: ServerError) -> None: ...

    def close(self, reason: CloseReason, detail: str = "") -> None: ...

    def through_handshake(self) -> None:
        """The handshake is done: the budget and admission count it as established."""

    def update_reading(self) -> None:
        """Stop or resume reading as the handshake's state now asks (nothing is read while an
        AUTH is checked)."""

    def read_queued(self) -> None:
        """Parse, soon, the frames that arrived behind the AUTH."""


class Greeter:
    """The answers of one connection's handshake."""

    __slots__ = ("port", "handshake", "config", "throttle", "nonce")

    def __init__(self, port: Port, handshake: ServerHandshake, config: ServerConfig, throttle: AuthThrottle, nonce: bytes) -> None:
        self.port = port
        self.handshake = handshake
        self.config = config
        self.throttle = throttle
        self.nonce = nonce

    def receive(self, msg: wire.Message, request_id: int, closing: bool) -> bool:
        """Answer ``msg`` if the handshake is its business; True when it is a request to run
        (``closing``: the server is stopping, and a request is refused SHUTTING_DOWN)."""
        port, step = self.port, self.handshake.receive(msg)
        action = step.action
        if action is Action.REQUEST:
            if not closing:
                return True
            port.send_error(request_id, dispatch.shutting_down())
        elif action is Action.HELLO:
            port.through_handshake()  # without a token HELLO is the whole handshake
            port.send(dispatch.hello_reply(self.config, self.nonce), request_id)
        elif action is Action.AUTH_OK:
            port.send(_AUTH_OK, request_id)
        elif action is Action.CHECK_AUTH:
            assert isinstance(msg, wire.Auth)
            self._check(msg.mac, request_id)
        else:
            self.refuse(step, request_id)
        return False

    def refuse(self, step: Step, request_id: int) -> None:
        """Answer an ERROR or REFUSE step with its error; a REFUSE also closes the connection."""
        assert step.code is not None
        self.port.send_error(request_id, ServerError(step.code, step.message))
        if step.action is Action.REFUSE:
            self.port.close(CloseReason.HANDSHAKE_REFUSED, step.message)

    def _check(self, mac: bytes, request_id: int) -> None:
        """Hand AUTH's MAC to the throttle, which answers a wrong one late (throttle.py); the
        connection reads nothing else meanwhile (CHECKING). A wrong AUTH the throttle sheds (as
        many refusals scheduled as it keeps) gets no answer: the handshake deadline closes it
        (an early answer would tell a guesser sooner than the throttle allows; with
        ``handshake_timeout`` 0 it stays open until the peer closes it)."""
        port, token, client_id = self.port, self.config.token, self.handshake.client_id
        assert token is not None and client_id is not None
        port.update_reading()
        self.throttle.submit(
            port.peer.rpartition(":")[0],
            lambda: None if port.closed else check_mac(token, self.nonce, client_id, mac),
            lambda ok, why: self._verdict(ok, why, request_id),
            lambda: log.debug("wrong AUTH shed: the handshake deadline closes it", peer=port.peer),
        )

    def _verdict(self, ok: bool, why: str, request_id: int) -> None:
        """The answer to AUTH: a success at once, a refusal when its address's slot time ends
        (see throttle.py), possibly after the connection has gone."""
        port = self.port
        if port.closed:
            return
        step = self.handshake.auth_checked(ok, why)
        if step.action is not Action.AUTH_OK:
            log.warning("authentication failed", peer=port.peer, reason=why)
            self.refuse(step, request_id)
            return
        port.through_handshake()
        port.send(_AUTH_OK, request_id)
        port.update_reading()
        port.read_queued()
