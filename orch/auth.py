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


def open_channel(address: str, *, token: str | None = None, tls_ca: str | Path | None = None) -> grpc.Channel:
    """A channel to a master: TLS verified against ``tls_ca`` when given, the token on every call."""
    if tls_ca is not None:
        try:
            ca = Path(tls_ca).read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read the TLS CA certificate {tls_ca}: {e}") from e
        channel = grpc.secure_channel(
            address, grpc.ssl_channel_credentials(root_certificates=ca), options=CHANNEL_OPTIONS
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
