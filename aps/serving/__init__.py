"""Versioned exports of a model (base and delta) and the read-only store that serves them."""
