"""The storage floor: where table rows live and how they change, with no server and no files.

numpy arrays and numba kernels only (no asyncio, no sockets, no paths): the fixed and dense
stores (:mod:`.tables`), the hash store and its parts (:mod:`.hash`), the initialisers, the
optimizer kernels, page and prefetch helpers and GEO's change tracking. The pserver, aps-serve,
the trainer's local caches and the checkpoint formats all build on it; it imports none of them.
"""
