"""Whether a reply of float32 values fits in one frame, asked before the reply is built.

Every core that answers pulls asks the same question (the pserver's and aps-serve's): a reply
over ``max_frame`` would be refused by the client's own frame limit after the server built it,
so it is refused up front, with the size and what to do.
"""

from __future__ import annotations

import math

from ...errors import ErrorCode, ServerError


def array_bytes(offset: int, shape: tuple[int, ...], itemsize: int) -> int:
    """Encoded size of an ``arr`` field that starts ``offset`` bytes into a payload (see codec.py:
    8-byte head, u64 per dimension, padding to 8 before and after the data)."""
    head = 8 + 8 * len(shape)
    head += -(offset + head) % 8
    data = math.prod(shape) * itemsize
    return head + data + (-(offset + head + data) % 8)


def check_float32_reply(max_frame: int, shape: tuple[int, ...], table: str) -> None:
    """Refuse (TOO_LARGE) a reply of float32 values of ``shape`` (rows x dim, or a count) that
    would not fit in a frame. On every pull: the refusal's text is built only for a refusal."""
    size = array_bytes(0, shape, 4)
    if size > max_frame:
        what = f"{shape[0]} rows of {shape[1]} float32" if len(shape) == 2 else f"{shape[0]} float32"
        raise ServerError(
            ErrorCode.TOO_LARGE,
            f"table {table!r}: the reply ({what}) would be {size} bytes, over the max frame of "
            f"{max_frame}; ask for less per request (aps clients split large pulls)",
        )
