"""Metrics of the libraries people train with, in orch's panel: one module per library.

Each imports its library only inside itself, so none is a dependency of orch: importing
``orch.integrations.hf`` needs transformers, ``.lightning`` needs lightning, ``.accelerate``
needs accelerate, and nothing else imports them. Each records through
:mod:`orch.runtime.current`, so it does nothing outside a rank of an orch run, and the code
that uses it runs as before under the library's own launcher.

- :class:`orch.integrations.hf.OrchCallback`: ``Trainer(..., callbacks=[OrchCallback()])``
- :class:`orch.integrations.lightning.OrchLogger`: ``L.Trainer(logger=OrchLogger(), ...)``
- :class:`orch.integrations.accelerate.OrchTracker`: ``Accelerator(log_with=OrchTracker())``

Scalars written through ``torch.utils.tensorboard.SummaryWriter`` (the TensorBoard loggers
of all three) reach the panel without any of these.
"""
