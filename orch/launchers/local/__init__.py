"""The ranks of a run on this machine: a forkserver's processes (``group``), started,
watched and ended by :class:`~orch.launchers.local.launcher.LocalLauncher`."""
