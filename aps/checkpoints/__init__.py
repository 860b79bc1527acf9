"""The checkpoint formats: shard directories, manifests, per-kind table files and delta chains.

What a checkpoint looks like on disk, written and read without a server: the pserver saves and
loads its shard through :mod:`.shards`, hash tables write one file per logical shard
(:mod:`.hash_files`), aps-serve and the export path follow base + delta chains (:mod:`.deltas`),
:mod:`.reader` opens a whole checkpoint for a user, :mod:`.latest` finds the newest complete copy
of a shard for ``--resume`` and the launcher's restarts, and :mod:`.stale` removes what killed
saves left behind.
"""
