"""The launchers: what starts a run's processes and answers for the run.

``contract``: the one contract of every run a user holds (:class:`RunHandle`) and how a
run ended (:class:`RunResult`). ``spec``: the launch options, declared once. ``run``: a run
started here (the master in this process), whose ranks come from a ``launcher``: ``local``
(a forkserver group, ``group``) or ``on_slurm`` (one batch job: ``slurm``, ``slurm_options``,
``function_file``). ``detach`` starts a run under its own supervisor (``_supervisor``,
``attach_file``, ``detached_run``); ``attached`` follows one by address or id; ``loaded``
reads one back from disk. They join the master and the worker runtime; experiments and
views sit above.
"""
