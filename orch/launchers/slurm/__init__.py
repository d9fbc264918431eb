"""A run's ranks on a Slurm cluster: ``options`` (:class:`~orch.launchers.slurm.options.Slurm`,
what the user asks for), ``job`` (the batch job: its script, submission, queue state and
cancellation) and ``launcher`` (:class:`~orch.launchers.slurm.launcher.SlurmLauncher`)."""
