"""Both sides of the connection handshake as sans-IO state machines.

A connection goes ``AWAIT_HELLO -> (AWAIT_AUTH ->) READY -> CLOSED``: HELLO first, then, when
the server has a token, AUTH (whose MAC the server checks, possibly later: the guess throttle
answers a wrong one late), then any request. Anything out of order moves it to CLOSED, and
CLOSED is sticky: the machine refuses to be driven further, so a connection that forgot it had
refused a peer cannot serve it by accident.

The client's machine (:class:`ClientHandshake`) is the mirror image: it says what to send first
(HELLO), what follows the server's HELLO_REPLY (AUTH, with the MAC of the server's nonce, or
nothing), and when the link is ready; a reply out of order is the server's protocol error.

The machines never touch a socket nor a clock: it takes decoded messages and says what the
connection must do (:class:`Step`), so every path is tested with bytes fed through a
:class:`~aps.wire.frame.FrameDecoder` (tests/wire/test_handshake.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import ErrorCode, LocalProtocolError, RemoteProtocolError, TokenMissing
from .auth import auth_mac
from .messages import Auth, Hello, HelloReply, Message, Ok, Op

#: the largest frame accepted before the handshake is done, so an unauthenticated peer cannot
#: make the server allocate a max-size body
HANDSHAKE_MAX_FRAME = 4096


class HandshakeState(Enum):
    AWAIT_HELLO = "await_hello"
    AWAIT_AUTH = "await_auth"  # HELLO done, the server has a token: AUTH next
    CHECKING = "checking"  # an AUTH's MAC is being checked: nothing else is read meanwhile
    READY = "ready"
    CLOSED = "closed"


class Action(Enum):
    """What the connection does with a message the machine has seen."""

    HELLO = "hello"  # answer with HELLO_REPLY
    CHECK_AUTH = "check_auth"  # check the MAC, then call :meth:`ServerHandshake.auth_checked`
    AUTH_OK = "auth_ok"  # answer AUTH with OK (no token on this server)
    REQUEST = "request"  # a request of a handshaken client: dispatch it
    ERROR = "error"  # answer with an error and go on reading
    REFUSE = "refuse"  # answer with an error and close the connection


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    code: ErrorCode | None = None  # of the error reply (ERROR, REFUSE)
    message: str = ""


#: what every request after the handshake gets (one shared, immutable step)
_REQUEST = Step(Action.REQUEST)


class ServerHandshake:
    """Handshake state of one server connection (``token_required``: AUTH must follow HELLO)."""

    __slots__ = ("token_required", "max_frame", "state", "client_id", "trainer_id", "close_reason")

    def __init__(self, token_required: bool, max_frame: int) -> None:
        self.token_required = token_required
        #: the server's max frame; until READY only :data:`HANDSHAKE_MAX_FRAME` is accepted
        self.max_frame = max_frame
        self.state = HandshakeState.AWAIT_HELLO
        self.client_id: int | None = None
        self.trainer_id = -1  # what HELLO said (-1: not a trainer)
        self.close_reason = ""

    @property
    def frame_limit(self) -> int:
        """The largest payload to accept now (the decoder's max frame)."""
        if self.state is HandshakeState.READY:
            return self.max_frame
        return min(self.max_frame, HANDSHAKE_MAX_FRAME)

    @property
    def ready(self) -> bool:
        return self.state is HandshakeState.READY

    def receive(self, msg: Message) -> Step:
        """The connection decoded ``msg`` from the peer: what to do with it."""
        state = self.state
        if state is HandshakeState.CLOSED:
            raise LocalProtocolError(f"connection handshake is closed ({self.close_reason}); nothing more is read")
        if state is HandshakeState.CHECKING:
            raise LocalProtocolError("an AUTH is being checked; nothing is read until auth_checked()")
        if isinstance(msg, Hello):
            if state is not HandshakeState.AWAIT_HELLO:
                return Step(Action.ERROR, ErrorCode.BAD_REQUEST, "duplicate hello")
            self.client_id, self.trainer_id = msg.client_id, msg.trainer_id
            self.state = HandshakeState.AWAIT_AUTH if self.token_required else HandshakeState.READY
            return Step(Action.HELLO)
        if state is HandshakeState.AWAIT_HELLO:
            return self._close(ErrorCode.AUTH_REQUIRED, "the first message must be hello")
        if isinstance(msg, Auth):
            if not self.token_required:
                return Step(Action.AUTH_OK)
            if state is HandshakeState.READY:
                # answered at once and never checked: a guess on a connection that holds the
                # token learns nothing, and nothing is held for it (a shed check would leave the
                # connection reading nothing, and its handshake deadline is over)
                return Step(Action.ERROR, ErrorCode.BAD_REQUEST, "duplicate auth: this connection is already authenticated")
            self.state = HandshakeState.CHECKING
            return Step(Action.CHECK_AUTH)
        if state is HandshakeState.AWAIT_AUTH:
            return self._close(ErrorCode.AUTH_REQUIRED, "this server needs a token")
        return _REQUEST

    def receive_unparsable(self, opcode: int, code: ErrorCode, message: str) -> Step:
        """The connection got a whole frame whose payload did not decode (``code`` and
        ``message`` say why). Once READY that is one bad request: an error, and reading goes
        on. Before, it is refused like any other frame that is not the handshake's next message:
        left open, the connection would let a HELLO sent after the frame be served."""
        state = self.state
        if state is HandshakeState.CLOSED or state is HandshakeState.CHECKING:
            raise LocalProtocolError(f"a frame was read in state {state.name}: nothing is read there")
        if state is HandshakeState.READY:
            return Step(Action.ERROR, code, message)
        expected = Op.HELLO if state is HandshakeState.AWAIT_HELLO else Op.AUTH
        if opcode != expected:
            return self._close(ErrorCode.AUTH_REQUIRED, "the first message must be hello"
                               if expected is Op.HELLO else "this server needs a token")
        return self._close(code, f"bad {expected.name.lower()}: {message}")

    def auth_checked(self, ok: bool, why: str = "") -> Step:
        """The verdict on the AUTH being checked: OK it (READY) or refuse and close."""
        if self.state is not HandshakeState.CHECKING:
            raise LocalProtocolError(f"auth_checked() in state {self.state.name}: no AUTH is being checked")
        if ok:
            self.state = HandshakeState.READY
            return Step(Action.AUTH_OK)
        return self._close(ErrorCode.AUTH_FAILED, why or "authentication failed")

    def close(self, reason: str) -> None:
        """The connection is closing for ``reason`` (kept for the first close only)."""
        if self.state is not HandshakeState.CLOSED:
            self.state = HandshakeState.CLOSED
            self.close_reason = reason

    def _close(self, code: ErrorCode, message: str) -> Step:
        self.close(message)
        return Step(Action.REFUSE, code, message)


class ClientState(Enum):
    AWAIT_HELLO_REPLY = "await_hello_reply"  # HELLO sent
    AWAIT_AUTH_OK = "await_auth_ok"  # AUTH sent (the server has a token)
    READY = "ready"
    CLOSED = "closed"


class ClientHandshake:
    """Handshake state of one client connection: ``hello()`` to send first, then each reply to
    :meth:`receive`, which returns the next message to send (AUTH) or None once ready.

    What the server said about itself (index, count, max frame, lease) is kept for the link.
    A reply that does not fit the state raises :class:`RemoteProtocolError` and closes the
    machine; a server that wants a token when none was given raises :class:`TokenMissing`."""

    __slots__ = ("client_id", "trainer_id", "token", "address", "state", "server_index", "num_servers",
                 "max_frame", "lease")

    def __init__(self, client_id: int, trainer_id: int, token: str | None, max_frame: int, address: str = "") -> None:
        self.client_id = client_id
        self.trainer_id = trainer_id
        self.token = token
        self.address = address
        self.state = ClientState.AWAIT_HELLO_REPLY
        self.server_index = -1
        self.num_servers = 0
        #: the smaller of ours and the server's: what either side may send
        self.max_frame = max_frame
        #: seconds of silence after which the server takes this trainer for gone (0: never)
        self.lease = 0.0

    @property
    def ready(self) -> bool:
        return self.state is ClientState.READY

    def hello(self) -> Hello:
        """The first message of the connection."""
        return Hello(client_id=self.client_id, trainer_id=self.trainer_id)

    def receive(self, reply: Message) -> Message | None:
        """The server answered: the next message to send, or None (ready)."""
        state = self.state
        if state is ClientState.AWAIT_HELLO_REPLY and isinstance(reply, HelloReply):
            self.server_index, self.num_servers = reply.server_index, reply.num_servers
            self.max_frame = min(self.max_frame, reply.max_frame)
            self.lease = reply.lease_ms / 1000
            if not reply.auth_required:
                self.state = ClientState.READY
                return None
            if self.token is None:
                self.state = ClientState.CLOSED
                raise TokenMissing(f"pserver {self.address} requires a token and none was given "
                                   "(pass token=, or set APS_TOKEN)")
            self.state = ClientState.AWAIT_AUTH_OK
            return Auth(mac=auth_mac(self.token, reply.nonce, self.client_id))
        if state is ClientState.AWAIT_AUTH_OK and isinstance(reply, Ok) and reply.op == Op.AUTH:
            self.state = ClientState.READY
            return None
        self.state = ClientState.CLOSED
        raise RemoteProtocolError(
            f"pserver {self.address} answered the handshake ({state.value}) with {type(reply).__name__}"
        )
