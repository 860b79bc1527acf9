"""Hash tables: rows for keys that arrive at run time (DeepRec's EmbeddingVariable, Paddle's
MemorySparseTable): the open-addressing index over a slab (:mod:`.index`), the store with its
admission, statistics and growth (:mod:`.store`), eviction scores (:mod:`.evict`) and change
tracking (:mod:`.tracking`).
"""
