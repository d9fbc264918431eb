"""Who may talk to a master: a shared token on every RPC, and TLS when asked for.

Every RPC but the standard health check carries ``authorization: Bearer <token>``; the
master's :class:`TokenInterceptor` rejects a missing or wrong one with UNAUTHENTICATED
(compared with :func:`hmac.compare_digest`). A run started by ``orch.launch`` or
``orch run`` makes a random token and hands it to its own workers through their
environment (``ORCH_TOKEN``); ``orch master`` takes ``--token`` or ``ORCH_TOKEN`` (or
makes one and prints it). :func:`open_channel` is the one place clients build channels.
"""

from __future__ import annotations

import hmac
import os
import secrets
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from .errors import ConfigError

TOKEN_ENV = "ORCH_TOKEN"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
MAX_TOKEN_LEN = 512
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_from_env(token: str | None) -> str | None:
    """The token given, else ``$ORCH_TOKEN``, else None."""
    return token or os.environ.get(TOKEN_ENV) or None


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Rejects every call but the health check unless it carries the run's token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        method: str = handler_call_details.method
        if method.startswith(HEALTH_PREFIX):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get("authorization")
        if given is None:
            return _deny(
                "this orch master requires a token: pass --token or set ORCH_TOKEN "
                "(orch.attach(..., token=...) in a notebook)"
            )
        if not hmac.compare_digest(str(given).encode()[:MAX_TOKEN_LEN], self._expected):
            return _deny(
                "wrong token for this orch master: use the token it was started with "
                "(printed by `orch master`, or $ORCH_TOKEN)"
            )
        return await continuation(handler_call_details)


def _deny(message: str) -> grpc.RpcMethodHandler:  # type: ignore[type-arg]
    async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    # Every orch RPC is unary-unary; streaming calls (reflection) are refused the same way.
    return grpc.unary_unary_rpc_method_handler(abort)


class _TokenMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        # grpc passes its call details as a namedtuple: _replace keeps the other fields.
        metadata = [*(details.metadata or ()), self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


def open_channel(
    address: str,
    *,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    tls_server_name: str | None = None,
) -> grpc.Channel:
    """A channel to a master: TLS verified against ``tls_ca`` when given, the token on every call.

    ``tls_server_name`` is the name to verify the master's certificate for, when it differs
    from the address dialled (a master's own clients dial 127.0.0.1).
    """
    if tls_ca is not None:
        try:
            ca = Path(tls_ca).read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read the TLS CA certificate {tls_ca}: {e}") from e
        options: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        channel = grpc.secure_channel(
            address, grpc.ssl_channel_credentials(root_certificates=ca), options=options
        )
    else:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if token:
        channel = grpc.intercept_channel(channel, _TokenMetadata(token))
    return channel


def server_credentials(cert: str | Path, key: str | Path) -> grpc.ServerCredentials:
    try:
        pair = (Path(key).read_bytes(), Path(cert).read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read the TLS certificate or key: {e}") from e
    return grpc.ssl_server_credentials([pair])


def certificate_name(cert: str | Path) -> str | None:
    """A name the certificate is valid for (its first DNS name, else IP address, else CN).

    The master's own clients dial it on 127.0.0.1; they verify its certificate for a name
    it carries, so a certificate made for the host's real name works on the master's host too.
    """
    try:
        # CPython's own certificate decoder: no third-party parser needed for one field.
        decoded = ssl._ssl._test_decode_cert(str(cert))  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, ssl.SSLError):
        return None
    alt_names = decoded.get("subjectAltName", ())
    for wanted in ("DNS", "IP Address"):
        for kind, value in alt_names:
            if kind == wanted:
                return str(value)
    for rdn in decoded.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


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
