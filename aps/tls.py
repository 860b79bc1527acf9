"""Optional TLS (standard library ``ssl``): the pserver's context from a certificate and key, the
client's from what ``aps.connect(..., ssl=...)`` was given."""

from __future__ import annotations

import os
import ssl
from typing import Any

from .errors import ConfigError


def server_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A server context for the PEM ``cert`` (chain) and ``key``; None when neither is given."""
    if cert is None and key is None:
        return None
    if not cert or not key:
        raise ConfigError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not os.path.isfile(path):
            raise ConfigError(f"{flag} {path}: no such file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"TLS: cannot load certificate {cert} with key {key}: {exc}") from None
    return context


def client_context(value: Any) -> ssl.SSLContext | None:
    """``None`` / ``False``: plain TCP; ``True``: TLS verified against the system's CAs; an
    :class:`ssl.SSLContext`: used as it is."""
    if value is None or value is False:
        return None
    if value is True:
        return ssl.create_default_context()
    if isinstance(value, ssl.SSLContext):
        return value
    raise ConfigError(f"ssl must be None, True or an ssl.SSLContext, got {type(value).__name__}")


def ca_context(cafile: str) -> ssl.SSLContext:
    """A client context that trusts the CA certificate(s) in ``cafile`` (PEM), e.g. a self-signed
    pserver certificate; host names are checked."""
    if not os.path.isfile(cafile):
        raise ConfigError(f"--tls-ca {cafile}: no such file")
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-ca {cafile}: not a PEM certificate file ({exc})") from None
