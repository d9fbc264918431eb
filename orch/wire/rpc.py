"""gRPC status codes, as orch errors: the one place a failed call becomes a message.

Clients (``orch status``, ``orch.attach``, the panel) and workers (registering with their
master) both say what failed, where, and what to check, the same way.
"""

from __future__ import annotations

import grpc

from orch.errors import AuthError, MasterUnavailable, OrchError


def status_code(number: int) -> grpc.StatusCode:
    """The grpc status code of a number carried in a message (UNKNOWN for one it has not)."""
    return _BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}

# Codes that say the master is not there (yet): a worker keeps trying them until its timeout.
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def rpc_error(
    call: str, address: str, e: grpc.RpcError, *, tls: bool = False, error: type[OrchError] | None = None
) -> OrchError:
    """The orch error for ``call`` to the master at ``address`` failing with ``e``.

    Its class is ``error`` when given (a worker's WorkerError), else AuthError for a refused
    token and MasterUnavailable for the rest.
    """
    code, details = e.code(), e.details() or ""
    kind: type[OrchError] = MasterUnavailable
    if code is grpc.StatusCode.UNAUTHENTICATED:
        kind, message = AuthError, f"the master at {address} refused {call}: {details}"
    elif code is grpc.StatusCode.UNIMPLEMENTED:
        message = (
            f"{address} answered, but it is not an orch master ({call} is unknown there): "
            "check the address and port"
        )
    elif code in UNREACHABLE:
        message = f"{call} to {address} failed: {code.name}: {details}: {unavailable_hint(details, tls)}"
    else:
        message = f"{call} to {address} failed: {code.name}: {details}"
    return (error or kind)(message)


def unavailable_hint(details: str, tls: bool) -> str:
    """What to check when a master cannot be reached, with TLS named when it may be the cause."""
    lowered = details.lower()
    if tls and any(w in lowered for w in ("ssl", "handshake", "certificate", "peer name", "tls")):
        return (
            "the TLS handshake failed: check that the master serves TLS, that --tls-ca / tls_ca is "
            "the CA that signed its certificate, and that the certificate names the address you dial"
        )
    if not tls and "socket closed" in lowered:
        return (
            "the master closed the connection: if it serves TLS, pass its CA (--tls-ca / tls_ca); "
            "otherwise check the address and port"
        )
    return (
        "check the address, that the master is running, and that TLS is used on both sides or on "
        "neither (--tls-ca / tls_ca for a master that serves TLS)"
    )
