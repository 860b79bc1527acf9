"""The shared-token handshake: the server sends a nonce, the client proves the token with HMAC."""

from __future__ import annotations

import hashlib
import hmac


def auth_mac(token: str, nonce: bytes, client_id: int) -> bytes:
    """HMAC-SHA256 over nonce + client id; the token itself never crosses the wire."""
    return hmac.new(token.encode(), nonce + client_id.to_bytes(8, "little"), hashlib.sha256).digest()


def check_mac(token: str, nonce: bytes, client_id: int, mac: bytes) -> bool:
    return hmac.compare_digest(auth_mac(token, nonce, client_id), mac)
