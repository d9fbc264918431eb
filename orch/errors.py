"""Every exception orch raises, in one place.

::

    OrchError                      base of everything below
    ├── ConfigError                bad arguments, caught before anything starts
    │   └── PortInUseError         a port the user named is taken
    ├── MasterUnavailable          no orch master answers at the address
    │   └── AuthError              it answered, but refused our token
    ├── RunFailed                  a run ended FAILED; carries the root cause
    └── WorkerError                a worker could not join or finish its run

    StopTraining (a BaseException) ends a training function that was asked to stop.
"""

from __future__ import annotations


class OrchError(Exception):
    """Base class of every orch error."""


class ConfigError(OrchError, ValueError):
    """An argument is wrong; the message says which and what to pass instead."""


class PortInUseError(ConfigError):
    """A port the user asked for is taken."""

    def __init__(self, port: int, what: str, option: str) -> None:
        self.port, self.what, self.option = port, what, option
        super().__init__(
            f"port {port} ({what}) is already in use on this machine: "
            f"stop whatever holds it, or pass {option}=<another port> "
            f"(or 0 to pick a free one)"
        )


class MasterUnavailable(OrchError):
    """No orch master answered at the given address."""


class AuthError(MasterUnavailable):
    """The master refused the call: a missing or wrong token."""


class WorkerError(OrchError):
    """A worker could not register, pass the start barrier, or report back."""


class RunFailed(OrchError):
    """A run ended FAILED. ``rank``, ``exit_code`` and ``traceback`` name the root cause."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exit_code: int | None = None,
        traceback: str = "",
        state: object = None,
    ) -> None:
        self.rank = rank
        self.exit_code = exit_code
        self.traceback = traceback
        self.state = state
        super().__init__(message)


class StopTraining(BaseException):
    """Raised by ``ctx.log`` in a loop without ``ctx.steps`` once the run was asked to stop.

    Every rank raises it at the same step, so DDP's collectives end together; the rank ends
    STOPPED. A BaseException, so that ``except Exception`` in a training loop lets it through.
    """
