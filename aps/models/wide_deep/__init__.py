"""wide&deep: a wide linear part over slots and dense features plus a deep ReLU stack."""
