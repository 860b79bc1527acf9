"""Hash tables: rows for keys that arrive at run time (DeepRec's EmbeddingVariable, Paddle's
MemorySparseTable): the open-addressing index over a slab (:mod:`.index`), the slab of rows and
its growth (:mod:`.slab`), the store with its admission and statistics (:mod:`.store`), eviction
planning (:mod:`.evict`) and change tracking (:mod:`.tracking`).
"""
