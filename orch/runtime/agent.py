"""The host agent: one host's ranks reach the master through it, their heartbeats in one call.

Python gRPC serves a few thousand unary calls a second per core, so a master that takes one
heartbeat call per rank per interval tops out near a thousand ranks whatever its own code
costs. ``orch worker --nproc-per-node K`` therefore starts this agent in its own process
before its K ranks: the ranks dial it (a unix socket in a 0700 folder, with the run's token)
as they would the master, it forwards their registration, barrier and completion calls unchanged, and it
gathers their heartbeats into one ``SendHostHeartbeats`` call, sent when every rank of the
host has one waiting or ``window`` seconds after the first arrived. The master then takes one
call per host per interval: traffic grows with hosts, not ranks.

A rank's heartbeat is answered only once the master acknowledged the batch that carried it,
so its points are as durable as over a direct call; a beat the master refuses gets that
refusal (status code and message), and a master too old to take batches gets the beats one
by one. When a rank's process dies without reporting (the OOM killer, a segfault), the agent
reports its death for it (:meth:`HostAgent.report_exit`), so the master names the rank that
died at once rather than the peers its death broke.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.auth import (
    CHANNEL_OPTIONS,
    TokenInterceptor,
    bearer,
    channel_security,
    connection_limit,
    idle_limit,
)
from orch.wire.limits import MAX_BATCH_BYTES, MAX_BEATS_PER_BATCH
from orch.wire.net import PrivateSocket, raise_fd_limit
from orch.wire.rpc import status_code
from orch.wire.states import SERVICE_NAME, describe_exit

log = logging.getLogger(__name__)

HEARTBEAT = "SendHeartbeat"
BATCH = "SendHostHeartbeats"
FORWARD_TIMEOUT = 30.0  # a forwarded call without a deadline of its own gets this one


@dataclass
class _Refused(Exception):
    code: grpc.StatusCode
    details: str


class HostAgent:
    """Serve the ranks of one host on a private unix socket and relay them to ``master``.

    ``ranks``: how many ranks the host runs (a batch goes as soon as each has a heartbeat
    waiting); ``window``: the longest a heartbeat waits for the others of its host.
    """

    def __init__(
        self,
        master: str,
        *,
        ranks: int,
        window: float,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self.master = master
        self.ranks = ranks
        self.window = window
        self.token = token
        self.tls_ca = tls_ca
        self.tls_server_name = tls_server_name
        self.address = ""
        self.batches = 0  # SendHostHeartbeats calls made
        self.beats = 0  # heartbeats they carried
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._pending: list[tuple[pb.HeartbeatRequest, asyncio.Future[pb.HeartbeatResponse]]] = []
        self._arrived: asyncio.Event | None = None
        self._batching = True
        self._run_of: dict[str, str] = {}  # worker id -> the run id the master gave it
        # Ranks that died before they registered: the master hears of them with the next SyncHost.
        self.unreported: list[str] = []

    def start(self) -> str:
        """Start serving; returns the address the ranks dial."""
        self._thread = threading.Thread(target=self._run, name="orch-host-agent", daemon=True)
        self._thread.start()
        self._ready.wait(30.0)
        if self._error is not None:
            raise self._error
        if not self.address:
            raise RuntimeError("the host agent did not start within 30s")
        return self.address

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(10.0)

    def __enter__(self) -> HostAgent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the agent's own thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported to start(), or logged once serving
            if not self._ready.is_set():
                self._error = e
                self._ready.set()
            else:
                log.exception("the host agent failed")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._arrived = asyncio.Event()
        self._upstream = self._channel()
        raise_fd_limit()  # each connection to the relay is an open file, a stranger's too
        server = grpc.aio.server(
            interceptors=[TokenInterceptor(self.token)] if self.token else [],
            options=[*CHANNEL_OPTIONS, idle_limit(), connection_limit()],
        )
        handlers = {}
        for method in pb.DESCRIPTOR.services_by_name["Orchestrator"].methods:
            if method.name == HEARTBEAT:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._heartbeat,
                    request_deserializer=pb.HeartbeatRequest.FromString,
                    response_serializer=pb.HeartbeatResponse.SerializeToString,
                )
            elif method.name != BATCH:  # bytes in, bytes out: the agent reads only Register's
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(self._forwarder(method.name))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        # The ranks dial a unix socket in a 0700 folder: no other user of the host can connect
        # to the relay, let alone fill its connections.
        socket = PrivateSocket("agent")
        try:
            if not server.add_insecure_port(socket.address):
                raise OSError(f"could not listen on {socket.path}")
            await server.start()
            flusher = asyncio.create_task(self._flush_loop())
            self.address = socket.address
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                flusher.cancel()
                await server.stop(grace=1.0)
                await self._upstream.close(None)
        finally:
            socket.remove()

    def _channel(self) -> grpc.aio.Channel:
        credentials, options = channel_security(self.tls_ca, self.tls_server_name)
        if credentials is None:
            return grpc.aio.insecure_channel(self.master, options=options)
        return grpc.aio.secure_channel(self.master, credentials, options=options)

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (bearer(self.token),) if self.token else ()

    def _forwarder(self, name: str) -> Any:
        call = self._upstream.unary_unary(
            f"/{SERVICE_NAME}/{name}", request_serializer=None, response_deserializer=None
        )

        async def forward(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            remaining = context.time_remaining()
            try:
                reply: bytes = await call(
                    request,
                    timeout=remaining if remaining is not None else FORWARD_TIMEOUT,
                    metadata=self._metadata,
                )
            except grpc.aio.AioRpcError as e:
                await context.abort(e.code(), e.details() or "")
            if name == "Register":  # which run each rank joined: to report its death (report_exit)
                self._run_of[pb.RegisterRequest.FromString(request).worker_id] = (
                    pb.RegisterResponse.FromString(reply).run_id
                )
            return reply

        return forward

    def report_exit(self, worker_id: str, exit_code: int, timeout: float = 10.0) -> bool:
        """Tell the master that ``worker_id``'s process died with ``exit_code`` without
        reporting (negative: a signal). Called from the process that watches the ranks; True
        when the master took it (it keeps a rank's own report if one came first)."""
        run_id = self._run_of.get(worker_id)
        if not run_id:
            return False  # it never registered: the master does not know it
        host = socket.gethostname()
        error = f"process exited with {describe_exit(exit_code)} (seen by its host agent on {host})"
        request = pb.CompletionRequest(
            run_id=run_id, worker_id=worker_id, outcome=pb.RANK_FAILED, error=error, exit_code=exit_code
        )
        try:
            self._call("ReportCompletion", request, pb.CompletionResponse, timeout)
        except (grpc.RpcError, TimeoutError, RuntimeError) as e:
            log.warning("could not report the death of worker %s to the master: %s", worker_id, e)
            return False
        return True

    def registered(self, worker_id: str) -> bool:
        """The master gave ``worker_id`` a rank (through this agent)."""
        return worker_id in self._run_of

    def sync_host(self, request: pb.HostSyncRequest, timeout: float = 5.0) -> pb.HostSyncResponse:
        """Tell the master which ranks this host runs; its answer says what to do next
        (see :mod:`orch.master.control.hosts`). Raises grpc.RpcError (UNIMPLEMENTED from a master too
        old for it), TimeoutError, or RuntimeError once the agent stopped."""
        reply: pb.HostSyncResponse = self._call("SyncHost", request, pb.HostSyncResponse, timeout)
        return reply

    def _call(self, name: str, request: Any, reply_type: Any, timeout: float) -> Any:
        """One call to the master from another thread, on the agent's channel and loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("the host agent is not running")
        method = self._upstream.unary_unary(
            f"/{SERVICE_NAME}/{name}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply_type.FromString,
        )

        async def send() -> Any:
            return await method(request, timeout=timeout, metadata=self._metadata)

        return asyncio.run_coroutine_threadsafe(send(), loop).result(timeout + 1.0)

    async def _heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.HeartbeatResponse:
        assert self._loop is not None and self._arrived is not None
        future: asyncio.Future[pb.HeartbeatResponse] = self._loop.create_future()
        self._pending.append((request, future))
        self._arrived.set()
        try:
            return await future
        except _Refused as e:
            await context.abort(e.code, e.details)
            raise  # context.abort raises; this line is for the type checker

    async def _flush_loop(self) -> None:
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            deadline = loop.time() + self.window
            # Wait for the host's other ranks (they beat on the same interval), not past window.
            while len(self._pending) < self.ranks and (left := deadline - loop.time()) > 0:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    break
            batch = _batch(self._pending)
            del self._pending[: len(batch)]
            if not self._pending:
                self._arrived.clear()
            if batch:
                await self._send(batch)

    async def _send(
        self, batch: list[tuple[pb.HeartbeatRequest, asyncio.Future[pb.HeartbeatResponse]]]
    ) -> None:
        if self._batching:
            try:
                reply = await self._upstream.unary_unary(
                    f"/{SERVICE_NAME}/{BATCH}",
                    request_serializer=pb.HostHeartbeatsRequest.SerializeToString,
                    response_deserializer=pb.HostHeartbeatsResponse.FromString,
                )(
                    pb.HostHeartbeatsRequest(beats=[r for r, _ in batch]),
                    timeout=max(1.0, self.window * 8),
                    metadata=self._metadata,
                )
            except grpc.aio.AioRpcError as e:
                if e.code() is not grpc.StatusCode.UNIMPLEMENTED:
                    for _, future in batch:
                        _settle(future, exception=_Refused(e.code(), e.details() or ""))
                    return
                log.warning("the master at %s takes no batches: relaying heartbeats one by one", self.master)
                self._batching = False
            else:
                self.batches += 1
                self.beats += len(batch)
                for (_, future), beat in zip(batch, reply.replies, strict=False):
                    if beat.code:
                        _settle(
                            future,
                            exception=_Refused(status_code(beat.code), beat.error),
                        )
                    else:
                        _settle(future, result=beat.reply)
                for _, future in batch[len(reply.replies) :]:
                    _settle(
                        future,
                        exception=_Refused(grpc.StatusCode.INTERNAL, "the master answered too few beats"),
                    )
                return
        single = self._upstream.unary_unary(
            f"/{SERVICE_NAME}/{HEARTBEAT}",
            request_serializer=pb.HeartbeatRequest.SerializeToString,
            response_deserializer=pb.HeartbeatResponse.FromString,
        )
        for request, future in batch:
            try:
                _settle(
                    future,
                    result=await single(request, timeout=max(1.0, self.window * 8), metadata=self._metadata),
                )
            except grpc.aio.AioRpcError as e:
                _settle(future, exception=_Refused(e.code(), e.details() or ""))


def _batch(pending: list[tuple[pb.HeartbeatRequest, Any]]) -> list[tuple[pb.HeartbeatRequest, Any]]:
    """The first beats waiting that fit in one call the master takes: at most
    MAX_BEATS_PER_BATCH of them, in at most MAX_BATCH_BYTES (a bigger beat goes alone: its
    rank's sender keeps each beat well under the master's message limit)."""
    size = 0
    for n, (request, _) in enumerate(pending[:MAX_BEATS_PER_BATCH]):
        size += request.ByteSize() + 8  # its own field's tag and length in the batch
        if size > MAX_BATCH_BYTES and n:
            return pending[:n]
    return pending[:MAX_BEATS_PER_BATCH]


def _settle(
    future: asyncio.Future[pb.HeartbeatResponse],
    *,
    result: pb.HeartbeatResponse | None = None,
    exception: BaseException | None = None,
) -> None:
    """Answer a waiting rank (unless its call already ended: it gave up, or went away)."""
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result if result is not None else pb.HeartbeatResponse())
