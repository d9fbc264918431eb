"""Who may talk to a master: a shared token on every RPC, and TLS when asked for.

Every RPC but the standard health check carries ``authorization: Bearer <token>``; the
master's :class:`TokenInterceptor` rejects a missing or wrong one with UNAUTHENTICATED
(compared with :func:`hmac.compare_digest`). A run started by ``orch.launch`` or
``orch run`` makes a random token and hands it to its own workers through their
environment (``ORCH_TOKEN``); ``orch master`` takes ``--token`` or ``ORCH_TOKEN`` (or
makes one and prints it). :func:`open_channel` is the one place clients build channels.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import os
import secrets
import ssl
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from orch.errors import ConfigError
from orch.wire.net import connection_cap, is_unix

log = logging.getLogger(__name__)

TOKEN_ENV = "ORCH_TOKEN"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
# An authorization header longer than this is refused without hashing it. gRPC's own limit on a
# call's headers is raised above it (MAX_METADATA_BYTES), so tokens of any length up to it work.
MAX_AUTH_HEADER_BYTES = 64 * 1024
MAX_METADATA_BYTES = 80 * 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A connection that carried no call for this long is closed by the server (HTTP/2 GOAWAY; a
# client that calls again reconnects by itself): connections a stranger opens and leaves idle
# do not pile up to the process's open-file limit. Every caller of orch calls far more often.
IDLE_CONNECTION_SECONDS = 30.0


def idle_limit(seconds: float = IDLE_CONNECTION_SECONDS) -> tuple[str, int]:
    """The server option that closes connections idle for ``seconds``."""
    return ("grpc.max_connection_idle_ms", max(1, round(seconds * 1000)))


def connection_limit() -> tuple[str, int]:
    """The server option that caps a listener's connections at once (see ``connection_cap``)."""
    return ("grpc.max_allowed_incoming_connections", connection_cap())


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
    """Rejects every call but the health check unless it carries the run's token.

    The check reads only the call's headers: a refused call's body is never read, and the
    call ends at once, so a stranger holds no memory and no call slot of the master.
    """

    def __init__(self, token: str) -> None:
        self._expected = _digest(bearer(token)[1].encode())

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        method: str = handler_call_details.method
        if method.startswith(HEALTH_PREFIX):
            return await continuation(handler_call_details)
        given = next(
            (v for k, v in handler_call_details.invocation_metadata or () if k == "authorization"), None
        )
        if given is None:
            return _MISSING
        raw = given.encode() if isinstance(given, str) else bytes(given)
        # Digests of both sides: equal lengths, so the comparison takes the same time for any token.
        if len(raw) > MAX_AUTH_HEADER_BYTES or not hmac.compare_digest(_digest(raw), self._expected):
            return _WRONG
        return await continuation(handler_call_details)


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def _deny(message: str) -> grpc.RpcMethodHandler:  # type: ignore[type-arg]
    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        # A streaming handler that never reads its requests: grpc reads no body for it (a unary
        # handler would wait for the whole body first), and the client still gets this status.
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


_MISSING = _deny(
    "this orch master requires a token: pass --token or set ORCH_TOKEN "
    "(orch.attach(..., token=...) in a notebook)"
)
_WRONG = _deny(
    "wrong token for this orch master: use the token it was started with "
    "(printed by `orch master`, or $ORCH_TOKEN)"
)


class CallBudget(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """At most ``limits[method]`` calls of each method at once (``default`` for the others).

    A call holds its slot from its headers to its reply: unary requests are read here, not by
    grpc before the handler starts, so a caller that never sends its body is counted too, and
    is cut off after ``read_timeout`` seconds. Each method has its own budget, so a flood of
    one kind of call (slow GetState polls, health checks from strangers) never takes the
    slots another needs (the workers' heartbeats). A request that does not parse gets
    INVALID_ARGUMENT and one log line, not a traceback.
    """

    def __init__(self, limits: Mapping[str, int], default: int, *, read_timeout: float = 30.0) -> None:
        self.limits = dict(limits)
        self.default = default
        self.read_timeout = read_timeout
        self.in_flight: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.served: Counter[str] = Counter()  # calls let in, by method (only for the methods served)
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        if len(self._wrapped) < 1024:  # the methods served: a stranger's made-up names are not kept
            self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: Any) -> Any:
        serialize = handler.response_serializer
        if not handler.request_streaming:
            behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
            if not inspect.iscoroutinefunction(behavior) and not inspect.isasyncgenfunction(behavior):
                return handler  # a synchronous handler: served as grpc serves it, outside the budget
            deserialize = handler.request_deserializer

            async def unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await self._enter(method, context)
                try:
                    request = await self._read_one(method, deserialize, context)
                    if not handler.response_streaming:
                        return await behavior(request, context)
                    await _stream_out(behavior(request, context), context)
                    return None
                finally:
                    self.in_flight[method] -= 1

            if handler.response_streaming:
                return grpc.stream_stream_rpc_method_handler(unary, response_serializer=serialize)
            return grpc.stream_unary_rpc_method_handler(unary, response_serializer=serialize)
        behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary
        if not inspect.iscoroutinefunction(behavior) and not inspect.isasyncgenfunction(behavior):
            return handler

        async def streaming(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await self._enter(method, context)
            try:
                if not handler.response_streaming:
                    return await behavior(requests, context)
                await _stream_out(behavior(requests, context), context)
                return None
            finally:
                self.in_flight[method] -= 1

        make = (
            grpc.stream_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.stream_unary_rpc_method_handler
        )
        return make(
            streaming, request_deserializer=handler.request_deserializer, response_serializer=serialize
        )

    async def _enter(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        limit = self.limits.get(method, self.default)
        if self.in_flight[method] >= limit:
            self.refused[method] += 1
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this orch master is serving {limit} {method.rsplit('/', 1)[-1]} calls already, "
                "its limit: retry later",
            )
        self.in_flight[method] += 1
        self.served[method] += 1

    async def _read_one(
        self,
        method: str,
        deserialize: Callable[[bytes], Any] | None,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> Any:
        try:
            raw = await _read(context, self.read_timeout)
        except asyncio.TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request did not arrive within {self.read_timeout:g}s of the call's headers",
            )
        if not isinstance(raw, bytes):  # grpc.aio.EOF: the client sent none
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
        if deserialize is None:
            return raw
        try:
            return deserialize(raw)
        except Exception:  # protobuf's DecodeError, or any other failure to parse: bad input
            log.warning(
                "%s: refused a request that does not parse (%d bytes) from %s",
                method,
                len(raw),
                context.peer(),
            )
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request is not a valid message for {method}: {len(raw)} bytes that do not parse",
            )


async def _read(context: grpc.aio.ServicerContext[Any, Any], timeout: float) -> Any:
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):  # a timer, where wait_for makes a task per call
            return await context.read()
    return await asyncio.wait_for(context.read(), timeout)


async def _stream_out(result: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """Run a response-streaming behavior: an async generator's replies are written in turn."""
    if inspect.isasyncgen(result):
        async for reply in result:
            await context.write(reply)
    else:
        await result


class _TokenMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._metadata = bearer(token)

    def _with_token(self, details: Any) -> Any:
        # grpc passes its call details as a namedtuple: _replace keeps the other fields.
        metadata = [*(details.metadata or ()), self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


def bearer(token: str) -> tuple[str, str]:
    """The metadata entry that carries ``token`` on a call."""
    return ("authorization", f"Bearer {token}")


def channel_security(
    tls_ca: str | Path | None, tls_server_name: str | None
) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, int | str]]]:
    """Credentials (None: plaintext) and options of a channel to a master, sync or asyncio:
    TLS verified against ``tls_ca`` when given, for ``tls_server_name`` when that differs
    from the address dialled."""
    options: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
    if tls_ca is None:
        return None, options
    try:
        ca = Path(tls_ca).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the TLS CA certificate {tls_ca}: {e}") from e
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return grpc.ssl_channel_credentials(root_certificates=ca), options


def open_channel(
    address: str,
    *,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    tls_server_name: str | None = None,
) -> grpc.Channel:
    """A channel to a master: TLS verified against ``tls_ca`` when given, the token on every call.

    ``tls_server_name`` is the name to verify the master's certificate for, when it differs
    from the address dialled (a master's own clients dial 127.0.0.1). A ``unix:`` address is
    the server's private listener (a 0700 folder of this user): it serves plaintext.
    """
    credentials, options = channel_security(None if is_unix(address) else tls_ca, tls_server_name)
    if credentials is not None:
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
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
