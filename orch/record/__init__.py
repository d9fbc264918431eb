"""The record: a run dir on disk, written and read back.

``store`` writes the append-only metric log and the run's JSON files; ``rundir`` reads a
run dir into a :class:`~orch.record.rundir.RunRecord`; ``tensorboard`` exports one. It
imports the wire (the rank record, the state mirror a loaded run answers with) and nothing
above it.
"""
