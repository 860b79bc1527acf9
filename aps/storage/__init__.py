"""The storage floor: where table rows live and how they change, with no server and no files.

numpy arrays and numba kernels only (no asyncio, no sockets, no paths): the fixed and dense
stores (:mod:`.tables`), the hash store and its parts (:mod:`.hash`), the initialisers, the
optimizer kernels, page and prefetch helpers, GEO's change tracking, and the lookup by a store's
or a spec's class (:mod:`.table_classes`) that the server's kinds and the checkpoint formats
share. The pserver, aps-serve, the trainer's local caches and the checkpoint formats all build
on it; it imports none of them.
"""
