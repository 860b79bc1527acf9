"""Processes: the local launcher (``aps.launcher.local``: ``LocalCluster``, ``launch``), its
supervisor, roles and restart rules, and aps-ray's driver and actors. aps-local and aps-ray in
aps/cli/ are thin commands over these."""

from .local import LaunchResult, LocalCluster, PServerProcess, RoleResult, launch

__all__ = ["LaunchResult", "LocalCluster", "PServerProcess", "RoleResult", "launch"]
