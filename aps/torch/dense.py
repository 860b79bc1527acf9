"""The dense half of a user's network: each ``torch.nn.Parameter`` is an aps dense table.

The table is named by the parameter's module path (``mlp.0.weight``), has its shape, and is
initialised *on the pservers* (every trainer and every restart sees the same values) with the
distribution the module drew its own from. That distribution is read from the module, never
guessed from the values alone: a parameter whose values are all equal is ``Constant``; the
layers whose init torch documents (``Linear``, convolutions, ``Embedding``,
``MultiheadAttention``'s packed input projection) get theirs; anything else needs ``init=`` on
:class:`~aps.torch.TorchModel`, and a layer whose values do not fit its documented init (the
user re-initialised it) is refused with a line saying so, so no init is silently replaced.

At each step :class:`DenseBinding` points every parameter's ``data`` at the worker's replica of
its table and its ``grad`` at the runtime's gradient buffer: torch views of the shared arrays,
no copy, and autograd accumulates straight into the buffer the communicator pushes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from ..errors import ConfigError
from ..specs import Constant, DenseTable, Initializer, Normal, Optimizer, Uniform

#: modules whose ``weight`` and ``bias`` torch draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in))
#: (``kaiming_uniform_(a=sqrt(5))`` for the weight, the same bound for the bias)
_FAN_IN_UNIFORM = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def table_name(path: str) -> str:
    """A parameter's module path as a table name (already one: letters, digits, dots, '_')."""
    return path


def dense_tables(
    network: torch.nn.Module, optimizer: Optimizer, inits: Mapping[str, Initializer], seed: int,
) -> list[DenseTable]:
    """One dense table per parameter of ``network`` (at :class:`~aps.torch.Embedding`\\ s there
    are none), initialised as :func:`initializer` says."""
    unknown = sorted(set(inits) - {name for name, _ in network.named_parameters()})
    if unknown:
        raise ConfigError(f"init= names no parameter of the network: {', '.join(unknown)}")
    owners = {f"{path}.{p}" if path else p: module for path, module in network.named_modules()
              for p, _ in module.named_parameters(recurse=False)}
    tables = []
    for name, param in network.named_parameters():
        if param.numel() == 0:  # a layer over no columns (Linear(0, n) on data without dense ones): nothing to train
            continue
        init = inits.get(name) or initializer(name, owners[name], param)
        shape = tuple(param.shape) or (1,)
        tables.append(DenseTable(table_name(name), shape, init, optimizer, seed=seed))
    return tables


def initializer(name: str, module: torch.nn.Module, param: torch.nn.Parameter) -> Initializer:
    """The distribution ``param`` (``name`` in the network, owned by ``module``) was drawn from."""
    values = param.detach().reshape(-1)
    if bool((values == values[0]).all()):
        return Constant(float(values[0]))
    leaf = name.rsplit(".", 1)[-1]
    if isinstance(module, _FAN_IN_UNIFORM) and leaf in ("weight", "bias"):
        fan_in = module.weight.shape[1] * math.prod(module.weight.shape[2:])
        return _checked(name, values, Uniform(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in)), type(module).__name__)
    if isinstance(module, torch.nn.Embedding) and leaf == "weight":
        return _checked(name, values, Normal(0.0, 1.0), "Embedding")
    if isinstance(module, torch.nn.MultiheadAttention) and leaf == "in_proj_weight":
        fan_out, fan_in = module.in_proj_weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        return _checked(name, values, Uniform(-bound, bound), "MultiheadAttention")
    raise ConfigError(
        f"parameter {name} ({type(module).__name__}): aps cannot tell which distribution it was drawn from; "
        f"name one in TorchModel(init={{{name!r}: aps.Normal(0, 0.01)}}) (Uniform, Normal or Constant)"
    )


def _checked(name: str, values: torch.Tensor, init: Uniform | Normal, layer: str) -> Initializer:
    """``init`` if ``values`` could have been drawn from it, else a ConfigError: the user drew
    them otherwise, and aps would silently train from another init."""
    v = values.double()
    if isinstance(init, Uniform):
        inside = bool(((v >= init.low - 1e-6) & (v <= init.high + 1e-6)).all())
        spread = v.numel() < 50 or float(v.abs().max()) > 0.8 * init.high
        fits = inside and spread
    else:
        fits = v.numel() < 50 or abs(float(v.std()) - init.std) < 0.2 * init.std
    if not fits:
        raise ConfigError(
            f"parameter {name}: its values do not look drawn from {layer}'s default init ({init}); name the one you "
            f"used in TorchModel(init={{{name!r}: aps.Uniform(...) or aps.Normal(...)}})"
        )
    return init


class DenseBinding:
    """Points a network's parameters at aps's arrays for a step (see the module docstring)."""

    def __init__(self, network: torch.nn.Module) -> None:
        self.params = {name: p for name, p in network.named_parameters() if p.numel()}
        #: torch views made so far, by (table, address of the array): the replica and gradient
        #: buffers are the same few arrays every step, so each view is made once
        self._views: dict[tuple[str, int], torch.Tensor] = {}

    def bind(self, values: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray] | None) -> None:
        """``data`` of every parameter from ``values``; ``grad`` into ``grads`` (None: scoring,
        no gradient wanted)."""
        for name, param in self.params.items():
            param.data = self._view(name, values[table_name(name)], param.shape)
            param.grad = None if grads is None else self._view(name, grads[table_name(name)], param.shape)

    def _view(self, name: str, array: np.ndarray, shape: torch.Size) -> torch.Tensor:
        key = (name, array.__array_interface__["data"][0])
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= 8 * len(self.params):  # a caller that hands new arrays: keep it bounded
                self._views.clear()
            view = self._views[key] = torch.from_numpy(array).view(shape)
        return view
