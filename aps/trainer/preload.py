"""Imported by the compute workers' fork server (see :mod:`aps.trainer.pool`), and by nothing else.

Importing it does two things to the process that imports it, which is why nothing else may:

* It sets up numba's CPU target, which every worker's first kernel call would otherwise do on
  its own: the target's registries import ``numba.np.arraymath``, which looks for BLAS by
  importing ``scipy.linalg.cython_blas`` (about 0.3 s in a fresh process, whichever kernel comes
  first: no kernel's own ``np.dot`` causes it, so no rewrite of a kernel avoids it). Done once in
  the fork server, every worker forked from it inherits a ready target.
* It asks for SIGKILL when the parent (the trainer) dies. The fork server would exit anyway once
  the trainer's end of its pipe closes, but only after it finished importing and after a normal
  interpreter teardown (about 0.25 s with numba and scipy loaded, on the path from the trainer's
  exit to the launcher's); killed, it is gone at once, and its workers with it (they ask for the
  same about it).

A module-level effect is the point of this module: the fork server can only import modules.
"""

from __future__ import annotations

from numba.core.registry import cpu_target

from ..procs import die_with_parent

die_with_parent()
cpu_target.target_context.refresh()
