"""Sans-IO wire protocol: frames and messages. Never imports asyncio."""

from .frame import DEFAULT_MAX_FRAME, HEADER_SIZE, PROTOCOL_VERSION, Flag, Frame, FrameDecoder
from .messages import *  # noqa: F401,F403
from .messages import __all__ as _messages_all

__all__ = ["DEFAULT_MAX_FRAME", "HEADER_SIZE", "PROTOCOL_VERSION", "Flag", "Frame", "FrameDecoder", *_messages_all]
