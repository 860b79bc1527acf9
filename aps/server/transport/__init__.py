"""The transport: listening, connections, handshake, limits and dispatch, over any request core.

Generic over :class:`~aps.server.transport.service.RequestCore` (the service behind it), as an
ASGI server is over its application: the pserver serves its training core with it
(aps/server/pserver.py), aps-serve its read-only core over an export (aps/serving/server.py).
"""
