"""The launchers: what starts a run's processes and answers for the run.

``contract``: the one contract of every run a user holds (:class:`RunHandle`) and how a
run ended (:class:`RunResult`). ``spec``: the launch options, declared once. ``run``: a run
started here (the master in this process), whose ranks come from a ``launcher``, one
strategy package each: ``local`` (a forkserver group on this machine) and ``slurm`` (one
batch job, a host agent per node). ``detached`` starts a run under its own supervisor and
follows it (``attach_file`` says where); ``attached`` follows a run by address or id;
``loaded`` reads one back from disk. ``kernel_wait`` is how every ``wait()`` blocks in a
notebook kernel while the panel's clicks still reach it. They join the master and the
worker runtime; experiments and views sit above.
"""
