"""The optimizer of wide&deep's wide part (``wide.slot``, ``wide.dense``, ``wide.b``).

``same``: the model's own optimizer, as the reference trains every table. ``ftrl``:
FTRL-Proximal (McMahan et al. 2013), as CTR systems train their linear part: a per-coordinate
step ``alpha / (beta + sqrt(n))`` suits weights of features seen a thousand times and once, and
``l1`` holds rare ones at exactly zero. Its l2 is the model's ``l2``, the same penalty.
``adagrad``: Adagrad at ``wide_lr``, the same per-coordinate step without FTRL's proximal part.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ...specs import Adagrad, Ftrl, Optimizer

WIDE_OPTIMIZERS = ("same", "ftrl", "adagrad")


def wide_optimizer(model: str, name: str, optimizer: Optimizer, alpha: Any, beta: Any, l1: Any, lr: Any) -> Optimizer:
    """The wide part's optimizer: ``optimizer`` itself (``same``), FTRL with ``alpha``, ``beta``,
    ``l1`` and ``optimizer``'s l2 (``ftrl``) or Adagrad at ``lr`` with that l2 (``adagrad``);
    text numbers accepted (``--model-arg``)."""
    if name == "same":
        return optimizer
    if name == "adagrad":
        try:
            return Adagrad(float(lr), l2=optimizer.l2)
        except (ValueError, ConfigError):
            raise ConfigError(f"{model} wide_lr must be a positive number, got {lr!r}") from None
    if name != "ftrl":
        raise ConfigError(f"{model} wide_optimizer must be one of {', '.join(WIDE_OPTIMIZERS)}, got {name!r}")
    try:
        return Ftrl(alpha=float(alpha), beta=float(beta), l1=float(l1), l2=optimizer.l2)
    except ValueError:
        raise ConfigError(f"{model} ftrl_alpha, ftrl_beta and ftrl_l1 must be numbers, got {alpha!r}, {beta!r}, {l1!r}") from None
    except ConfigError as exc:
        raise ConfigError(f"{model} {exc}") from None
