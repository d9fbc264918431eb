"""The launchers: what starts a run's processes and answers for the run.

A run started here (``run``: the master in this process, the ranks from a local
forkserver group or a Slurm job), detached (``detach``, its ``_supervisor``) or on Slurm
(``slurm``). They join the master and the worker runtime; experiments and views sit above.
"""
