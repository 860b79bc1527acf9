"""splitmix64's finaliser: the one 64-bit mixer of aps.

It seeds the counter-based initialisers (aps/storage/init_kernels.py), starts a hash index's probe
(aps/storage/hash/index.py) and picks a hash table key's logical shard (aps/sharding.py). One
definition, so that the client's split and the server's ownership check can never disagree
about where a key lives.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@njit(cache=True, nogil=True, inline="always")
def mix64(z: np.uint64) -> np.uint64:
    """A bijection on 64 bits with full avalanche (every input bit moves every output bit)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)
