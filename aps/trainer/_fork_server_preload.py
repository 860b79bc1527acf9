"""Imported by the compute workers' fork server (see :mod:`aps.trainer.pool`), and by nothing else.

Importing it prepares the process that imports it, which is why it is private:

* It sets up numba's CPU target, which every worker's first kernel call would otherwise do on
  its own: the target's registries import ``numba.np.arraymath``, which looks for BLAS by
  importing ``scipy.linalg.cython_blas`` (about 0.3 s in a fresh process, whichever kernel comes
  first: no kernel's own ``np.dot`` causes it, so no rewrite of a kernel avoids it). Done once in
  the fork server, every worker forked from it inherits a ready target. Harmless anywhere.
* In the fork server only, it asks for SIGKILL when the parent (the trainer) dies. The fork
  server would exit anyway once the trainer's end of its pipe closes, but only after it finished
  importing and after a normal interpreter teardown (about 0.25 s with numba and scipy loaded,
  on the path from the trainer's exit to the launcher's); killed, it is gone at once, and its
  workers with it (they ask for the same about it). The check that this is the fork server
  (started as ``python -c "from multiprocessing.forkserver import main; ..."``) keeps any other
  importer from being tied to its parent by accident.

A module-level effect is the point of this module: the fork server can only import modules.
"""

from __future__ import annotations

import sys

from numba.core.registry import cpu_target

from ..procs import die_with_parent


def in_fork_server() -> bool:
    """True in multiprocessing's fork server: a ``python -c`` process that runs its main()."""
    return sys.argv == ["-c"] and "multiprocessing.forkserver" in sys.modules


if in_fork_server():
    die_with_parent()
cpu_target.target_context.refresh()
