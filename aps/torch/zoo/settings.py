"""The ``--model-arg`` settings every zoo network shares, its layers, and the one call that makes its model."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...errors import ConfigError
from ...models.ctr_model import make_optimizer, positive_float, positive_int
from ...specs import Initializer, Normal
from ..embedding import KINDS
from ..features import Meta
from ..model import TorchModel


def hidden_widths(model: str, hidden: str | int) -> tuple[int, ...]:
    """``"400,400,400"`` (``--model-arg`` text) as layer widths."""
    try:
        return tuple(positive_int(model, "hidden", h) for h in str(hidden).split(","))
    except ConfigError:
        raise ConfigError(f"{model} hidden must be comma-separated positive widths, got {hidden!r}") from None


def mlp(width: int, hidden: tuple[int, ...], out: int | None = 1) -> torch.nn.Sequential:
    """Linear + ReLU per hidden width, then a Linear to ``out`` (None: none, the last hidden
    layer's activations are the output)."""
    layers: list[torch.nn.Module] = []
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    return torch.nn.Sequential(*layers, *([] if out is None else [torch.nn.Linear(width, out)]))


def reference_fc_init(network: torch.nn.Module, under: str) -> dict[str, Initializer]:
    """The numba CTR models' fully connected init (:class:`aps.models.layers.Dense`) for every
    ``Linear`` below the module path ``under``: weight Normal(0, 1/sqrt(fan_in)), bias zero.
    Drawn into the network (so that it holds values of the init its tables get) and returned by
    parameter name for ``TorchModel(init=...)``: aps reads a Linear's init as torch's uniform one."""
    inits: dict[str, Initializer] = {}
    for path, module in network.get_submodule(under).named_modules(prefix=under):
        if isinstance(module, torch.nn.Linear):
            std = 1.0 / math.sqrt(module.in_features)
            with torch.no_grad():
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()  # all equal: aps reads it as Constant(0)
            inits[f"{path}.weight"] = Normal(0.0, std)
    return inits


def zoo_model(
    name: str, network: Callable[[Meta], torch.nn.Module], *, meta: str, lr: float, batch_size: int | None,
    table: str, seed: int, init: Callable[[torch.nn.Module], dict[str, Initializer]] | None = None,
    optimizer: str = "adam",
) -> TorchModel:
    """A zoo network as a :class:`TorchModel`: ``optimizer`` (``adam``, the built-in CTR models'
    default; ``sgd``, which geo mode needs; ``adagrad``) at ``lr`` on every table, ``table`` the
    kind of its embeddings (both checked here, one line if wrong).
    ``init``: the initialisers of the built network's parameters that aps cannot read from their
    layers (:func:`reference_fc_init`), by name."""
    if table not in KINDS:
        raise ConfigError(f"{name} table must be one of {', '.join(KINDS)}, got {table!r}")
    inits: dict[str, Initializer] = {}

    def build(m: Meta) -> torch.nn.Module:
        net = network(m)
        # filled before TorchModel reads it (it reads init= once the network is built); were it
        # read earlier, the values drawn here would not fit their layer's default init and
        # aps.torch.dense would refuse them with a line, not train from another init
        inits.update(init(net) if init is not None else {})
        return net

    opt = make_optimizer(name, str(optimizer), positive_float(name, "lr", lr))
    return TorchModel(build, meta=meta, optimizer=opt, batch_size=batch_size, seed=seed, name=name, init=inits)


def numba_port(
    name: str, network: Callable[..., torch.nn.Module], fc: str, *, meta: str, embedding_size: int, hidden: str,
    init_range: float, lr: float, batch_size: int | None, table: str, seed: int, optimizer: str = "adam",
) -> TorchModel:
    """A built-in numba CTR model's network in torch (torch_ctr_dnn, torch_wide_deep) as a zoo model:
    ``network(slots, dense, dim, hidden, init_range, kind)``, the Linear layers under the module
    path ``fc`` initialised as the numba model's (:func:`reference_fc_init`)."""
    widths = hidden_widths(name, hidden)
    dim, r = positive_int(name, "embedding_size", embedding_size), positive_float(name, "init_range", init_range)
    return zoo_model(name, lambda m: network(m.slots, m.dense, dim, widths, r, table), meta=meta, lr=lr,
                     batch_size=batch_size, table=table, seed=seed, init=lambda net: reference_fc_init(net, fc),
                     optimizer=optimizer)
