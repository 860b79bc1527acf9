"""Your own network in PyTorch, trained on aps's pservers (``pip install aps[torch]``).

A user writes a ``torch.nn.Module`` whose sparse features go through :class:`Embedding` (rows held
by aps tables, fixed or hash) and wraps it in :class:`TorchModel`, an ordinary aps model
plug-in: every parameter of the module becomes a dense aps table, the optimizers run on the
pservers, and the runtime (worker processes, modes, hash tables, online passes, exports) is the
one the built-in models use. ``aps-trainer --model my_net.py:build`` loads it like any model.

Why a plug-in and not a training loop of its own: everything around the network (reading,
merging gradients, the five modes, checkpoints) is already aps's; only the forward and backward
pass change hands, from hand-written numba kernels to torch's autograd.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # an optional extra: say how to get it instead of a bare ModuleNotFoundError
    raise ImportError(f"aps.torch needs PyTorch: pip install 'aps[torch]' ({exc})") from exc

from .embedding import Embedding
from .features import Features, ListFeature, Meta
from .model import TorchModel

__all__ = ["Embedding", "Features", "ListFeature", "Meta", "TorchModel"]
