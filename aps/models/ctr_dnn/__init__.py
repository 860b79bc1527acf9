"""CTR-DNN: the reference CTR network (26 embedded slots + 13 dense features, 3x400 ReLU, softmax)."""
