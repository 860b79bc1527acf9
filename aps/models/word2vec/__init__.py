"""word2vec (skip-gram with negative sampling): data preparation, batches and kernels."""
