"""A run that outlives the process that started it: ``start`` launches it under a
supervisor process of its own session (``supervisor``), and ``run``'s
:class:`~orch.launchers.detached.run.DetachedRun` follows it from any later process."""
