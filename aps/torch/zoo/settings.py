"""The ``--model-arg`` settings every zoo network shares, and the one call that makes its model."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...errors import ConfigError
from ...models.ctr_model import positive_float, positive_int
from ...specs import Adam
from ..embedding import KINDS
from ..features import Meta
from ..model import TorchModel


def hidden_widths(model: str, hidden: str | int) -> tuple[int, ...]:
    """``"400,400,400"`` (``--model-arg`` text) as layer widths."""
    try:
        return tuple(positive_int(model, "hidden", h) for h in str(hidden).split(","))
    except ConfigError:
        raise ConfigError(f"{model} hidden must be comma-separated positive widths, got {hidden!r}") from None


def mlp(width: int, hidden: tuple[int, ...], out: int = 1) -> torch.nn.Sequential:
    """Linear + ReLU per hidden width, then a Linear to ``out``."""
    layers: list[torch.nn.Module] = []
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, out))


def zoo_model(
    name: str, network: Callable[[Meta], torch.nn.Module], *, meta: str, lr: float, batch_size: int | None,
    table: str, seed: int,
) -> TorchModel:
    """A zoo network as a :class:`TorchModel`: Adam at ``lr`` on every table (the built-in CTR
    models' default), ``table`` the kind of its embeddings (checked here, one line if wrong)."""
    if table not in KINDS:
        raise ConfigError(f"{name} table must be one of {', '.join(KINDS)}, got {table!r}")
    return TorchModel(network, meta=meta, optimizer=Adam(positive_float(name, "lr", lr)), batch_size=batch_size,
                      seed=seed, name=name)
