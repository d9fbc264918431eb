"""The gRPC master: the Orchestrator service over a :class:`~orch.master.coordinator.Coordinator`.

Runs in its own process (``orch master``) or in the background of the process that
launches the workers (``orch run``, ``orch.launch``). Serves the standard gRPC health
service and server reflection beside it, so stock gRPC tools can talk to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orch.errors import ConfigError, PortInUseError
from orch.master import _trim
from orch.master.control.validate import STATUS_CODE, Reject
from orch.master.coordinator import Coordinator
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.auth import (
    IDLE_CONNECTION_SECONDS,
    MAX_METADATA_BYTES,
    CallBudget,
    TokenInterceptor,
    connection_limit,
    idle_limit,
    server_credentials,
)
from orch.wire.net import (
    DEFAULT_MASTER_PORT,
    PrivateSocket,
    choose_port,
    free_port,
    is_loopback,
    raise_fd_limit,
)
from orch.wire.rpc import status_code
from orch.wire.states import SERVICE_NAME

log = logging.getLogger(__name__)
Ctx = grpc.aio.ServicerContext[Any, Any]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Calls of each method in flight at once (from their headers to their reply), each method on a
# budget of its own: no flood of one kind of call can take the slots the workers' heartbeats need.
# A call beyond its method's limit gets RESOURCE_EXHAUSTED at once.
CALL_LIMITS = {
    f"/{SERVICE_NAME}/SendHeartbeat": 4096,
    f"/{SERVICE_NAME}/SendHostHeartbeats": 1024,  # each up to 256 heartbeats
    f"/{SERVICE_NAME}/Register": 1024,
    f"/{SERVICE_NAME}/CanStartTraining": 1024,
    f"/{SERVICE_NAME}/ReportCompletion": 1024,
    f"/{SERVICE_NAME}/GetState": 32,  # each builds a reply of up to a few MiB
    f"/{SERVICE_NAME}/StopRun": 64,
    f"/{SERVICE_NAME}/GetStacks": 16,  # each waits up to MAX_STACKS_WAIT seconds
    f"/{SERVICE_NAME}/SyncHost": 1024,  # one call a second per host agent
    "/grpc.health.v1.Health/Check": 256,
    "/grpc.health.v1.Health/Watch": 64,
}
OTHER_CALLS_LIMIT = 16  # reflection, and any other method
REQUEST_READ_TIMEOUT = 30.0  # seconds from a call's headers to its whole request
HANDSHAKE_TIMEOUT_MS = 5000  # a connection that has not finished its TLS / HTTP/2 handshake by then is closed

_STATUS = {kind: status_code(n) for kind, n in STATUS_CODE.items()}


async def _abort(context: grpc.aio.ServicerContext[Any, Any], e: Reject) -> NoReturn:
    await context.abort(_STATUS[e.kind], str(e))
    raise AssertionError("context.abort returned")  # pragma: no cover


class OrchestratorServicer(pb_grpc.OrchestratorServicer):  # type: ignore[misc]
    """Each method validates through the coordinator and maps refusals to status codes.

    The methods run on the server's event loop; the coordinator's work per call is short
    and under its own lock (GetState, which can be long, runs in a thread).
    """

    def __init__(self, coordinator: Coordinator, in_flight: Mapping[str, int] | None = None) -> None:
        self.coordinator = coordinator
        self._pause = beats_first(in_flight if in_flight is not None else {})
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orch-writer")

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    async def Register(self, request: pb.RegisterRequest, context: Ctx) -> pb.RegisterResponse:
        try:
            return self.coordinator.register(request)
        except Reject as e:
            await _abort(context, e)

    async def CanStartTraining(
        self, request: pb.CanStartTrainingRequest, context: Ctx
    ) -> pb.CanStartTrainingResponse:
        try:
            return self.coordinator.can_start(request)
        except Reject as e:
            await _abort(context, e)

    async def SendHeartbeat(self, request: pb.HeartbeatRequest, context: Ctx) -> pb.HeartbeatResponse:
        try:
            reply, write = self.coordinator.accept_heartbeat(request)
        except Reject as e:
            await _abort(context, e)
        if write is not None:
            # The points reach the run dir before the reply, on the writer thread: the event
            # loop never waits on the disk, and writes keep their order.
            await asyncio.get_running_loop().run_in_executor(self._writer, write)
        return reply

    async def SendHostHeartbeats(
        self, request: pb.HostHeartbeatsRequest, context: Ctx
    ) -> pb.HostHeartbeatsResponse:
        """One host's heartbeats together: acknowledged once all their points are written."""
        try:
            replies, write = self.coordinator.accept_heartbeats(request.beats)
        except Reject as e:
            await _abort(context, e)
        if write is not None:
            await asyncio.get_running_loop().run_in_executor(self._writer, write)
        return pb.HostHeartbeatsResponse(replies=replies)

    async def ReportCompletion(self, request: pb.CompletionRequest, context: Ctx) -> pb.CompletionResponse:
        try:
            self.coordinator.complete(request)
        except Reject as e:
            await _abort(context, e)
        return pb.CompletionResponse()

    async def SyncHost(self, request: pb.HostSyncRequest, context: Ctx) -> pb.HostSyncResponse:
        try:
            return self.coordinator.sync_host(request)
        except Reject as e:
            await _abort(context, e)

    async def GetState(self, request: pb.GetStateRequest, context: Ctx) -> bytes:
        """The reply, built and serialized off the event loop (a catch-up is megabytes), so
        heartbeats flow meanwhile; served with a pass-through serializer (see _add_servicer)."""

        def build() -> bytes:
            return self.coordinator.snapshot_bytes(
                request.cursor,
                skip_series=request.skip_series,
                max_points=request.max_points,
                pause=self._pause,
                changed_ranks=request.changed_ranks,
            )

        try:
            return await asyncio.get_running_loop().run_in_executor(None, build)
        except Reject as e:
            await _abort(context, e)

    async def GetStacks(self, request: pb.GetStacksRequest, context: Ctx) -> pb.GetStacksResponse:
        """Ask every running rank for its stack, wait for their answers (at most ``wait``
        seconds, without holding the event loop), and send what came."""
        wait = request.wait
        if not math.isfinite(wait) or wait < 0:
            await _abort(
                context, Reject("invalid_argument", f"wait must be a number of seconds >= 0, got {wait}")
            )
        wait = min(wait or STACKS_WAIT, MAX_STACKS_WAIT)
        asked = self.coordinator.ask_stacks()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while loop.time() < deadline and not self.coordinator.stacks_since(asked):
            await asyncio.sleep(0.05)
        return self.coordinator.stacks()

    async def StopRun(self, request: pb.StopRunRequest, context: Ctx) -> pb.StopRunResponse:
        if len(request.reason) > 1024:
            await _abort(context, Reject("invalid_argument", "reason is longer than 1024 characters"))
        state = self.coordinator.request_stop(request.reason, prune=request.prune)
        return pb.StopRunResponse(state=getattr(pb, state.value))


BEATS = (f"/{SERVICE_NAME}/SendHeartbeat", f"/{SERVICE_NAME}/SendHostHeartbeats")
# Seconds a reply being built gives the event loop, at each of its pauses, while heartbeats
# are in flight: it then holds the GIL for at most a third of the time (see beats_first).
BEATS_FIRST_SECONDS = 0.002


def beats_first(in_flight: Mapping[str, int]) -> Callable[[], None]:
    """A pause for a reply being built on a thread (GetState), after each millisecond of its
    work: it lets the event loop have the GIL and, while heartbeats are in flight
    (``in_flight``: the budget's count by method), sleeps :data:`BEATS_FIRST_SECONDS` first.
    Heartbeats come before viewers: at 1,024 ranks and more a catch-up would otherwise share
    the GIL evenly with the loop that serves them. One sleep, not a wait that watches the
    count: a thread that wakes to look takes the GIL from the loop each time."""

    def pause() -> None:
        if any(in_flight.get(m, 0) for m in BEATS):
            time.sleep(BEATS_FIRST_SECONDS)
        else:
            time.sleep(0)

    return pause


STACKS_WAIT = 3.0  # seconds GetStacks waits for the ranks' stacks by default
MAX_STACKS_WAIT = 10.0

PRESERIALIZED = {"GetState"}  # methods whose behaviour returns its reply already serialized


def _add_servicer(servicer: OrchestratorServicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer``'s methods, as protoc's generated function does but for PRESERIALIZED."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Orchestrator"].methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=request.FromString,
            response_serializer=bytes if method.name in PRESERIALIZED else response.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]


class MasterServer:
    """A running gRPC master. ``start()`` binds and serves; ``stop()`` shuts it down."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        call_limits: Mapping[str, int] | None = None,
        expire_interval: float = 0.25,
        token: str | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        idle_timeout: float = IDLE_CONNECTION_SECONDS,
        port_option: str = "--port",
        local_socket: bool = False,
    ) -> None:
        if not is_loopback(host) and not token:
            raise ConfigError(
                f"refusing to serve on {host or 'all interfaces'} without a token: anyone who can "
                "reach it could join or stop the run. Pass --token (or set ORCH_TOKEN), or bind "
                "127.0.0.1"
            )
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        self.coordinator = coordinator
        self.host = host
        self.requested_port = port
        self.port_option = port_option  # how the caller names the port, for a port taken
        self.port = 0
        self.expire_interval = expire_interval
        self.idle_timeout = idle_timeout  # seconds a connection may carry no call before it is closed
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._grace = 1.0
        self.budget = CallBudget(
            CALL_LIMITS if call_limits is None else call_limits,
            OTHER_CALLS_LIMIT,
            read_timeout=REQUEST_READ_TIMEOUT,
        )
        self.token = token
        self.tls = (tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
        # local_socket: a second listener, a unix socket in a 0700 folder, for this user's own
        # processes on this machine (a local run's ranks and its panel): a stranger filling the
        # TCP listener's connections never reaches them.
        self._local_socket = local_socket
        self._local: PrivateSocket | None = None  # made by start(): nothing is left by a failed one
        self._trimming = False  # holds the process's trimmer (see _trim) while serving

    @property
    def local_address(self) -> str:
        """``unix:/path`` of the private listener, or "" when there is none."""
        return self._local.address if self._local is not None else ""

    @property
    def address(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"

    def start(self) -> MasterServer:
        raise_fd_limit()
        host = self.host if self.host not in ("", "::") else "0.0.0.0"
        port = choose_port(
            self.requested_port,
            DEFAULT_MASTER_PORT,
            what="orch master",
            option=self.port_option,
            host=host,
        )
        try:
            if self._local_socket:
                self._local = PrivateSocket("master")
            try:
                self._start_on(port)
            except PortInUseError:
                if self.requested_port is not None:
                    raise
                # The default port was free when looked at and taken before the bind (another
                # launch on this machine at the same moment): any free port does, as promised.
                self._start_on(free_port(host))
        except BaseException:
            if self._local is not None:
                self._local.remove()
            raise
        # What a connection flood made gRPC allocate goes back to the system once it is freed.
        _trim.hold()
        self._trimming = True
        log.info("orch master serving run %s on %s", self.coordinator.run_id, self.address)
        return self

    def _start_on(self, port: int) -> None:
        # An asyncio server on its own thread and event loop: one thread serves thousands of
        # heartbeats a second, where a thread-pool server spends its time switching threads.
        started: queue.Queue[BaseException | None] = queue.Queue()
        self._thread = threading.Thread(
            target=self._run_loop, args=(port, started), name="orch-master", daemon=True
        )
        self._thread.start()
        error = started.get()
        if error is not None:
            self._thread.join(5.0)
            raise error

    def _run_loop(self, port: int, started: queue.Queue[BaseException | None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(port, started))
        finally:
            loop.close()

    async def _serve(self, port: int, started: queue.Queue[BaseException | None]) -> None:
        server = grpc.aio.server(
            # The token first: a stranger's call ends on its headers, before it counts against a
            # budget. No global limit on calls in flight: strangers could fill it (each method
            # has its own, in the budget).
            interceptors=[*([TokenInterceptor(self.token)] if self.token else []), self.budget],
            options=[
                # gRPC sets SO_REUSEPORT by default: a second master would share the port silently.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
                # No window growth by bandwidth probing: with it, gRPC buffered a refused call's
                # body anyway (+150 MiB under 40 strangers sending 8 MiB calls in a loop; +5 MiB
                # without). A request being read still gets the window it needs to arrive.
                ("grpc.http2.bdp_probe", 0),
                # Room for a long token: the token check itself refuses headers past 64 KiB.
                ("grpc.max_metadata_size", MAX_METADATA_BYTES),
                ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
                idle_limit(self.idle_timeout),
                # Connections at once, per listener: past it a new one is closed at once, and
                # the master keeps its open files for the ones it serves (and its run dir).
                connection_limit(),
            ],
        )
        servicer = OrchestratorServicer(self.coordinator, self.budget.in_flight)
        _add_servicer(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        target = f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"
        try:
            if self.tls is not None:
                bound = server.add_secure_port(target, server_credentials(*self.tls))
            else:
                bound = server.add_insecure_port(target)
            if bound == 0:
                raise RuntimeError(f"could not bind {target}")
            if self._local is not None and not server.add_insecure_port(self._local.address):
                raise OSError(f"could not listen on {self._local.path}")
            await server.start()
            for name in ("", SERVICE_NAME):
                await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        except RuntimeError:
            started.put(PortInUseError(port, "orch master", self.port_option))
            await server.stop(None)
            servicer.close()
            return
        except BaseException as e:  # a bad certificate, ...: the caller of start() gets it
            started.put(e)
            await server.stop(None)
            servicer.close()
            return
        self.port = bound
        self._server = server
        self._stop_requested = asyncio.Event()
        started.put(None)
        expiry = asyncio.create_task(self._expire())
        await self._stop_requested.wait()
        expiry.cancel()
        await self._health.enter_graceful_shutdown()
        await server.stop(self._grace)
        servicer.close()  # after the last heartbeat's write

    async def _expire(self) -> None:
        """Every ``expire_interval``: declare silent ranks lost, watch progress, judge the
        stragglers and the memory (see Coordinator.expire), on a thread of its own: the event
        loop serves heartbeats meanwhile (they wait only for the coordinator's short lock)."""
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orch-expiry") as expiry:
            # Its looks come this often: one that comes late says the process could not run
            # (see Coordinator.watch_stalls).
            self.coordinator.watch_stalls(self.expire_interval)
            while True:
                await asyncio.sleep(self.expire_interval)
                await loop.run_in_executor(expiry, self.coordinator.expire)

    def stop(self, grace: float = 1.0) -> None:
        loop, stop_requested = self._loop, self._stop_requested
        if self._thread is not None and loop is not None and stop_requested is not None:
            self._grace = grace
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop_requested.set)
            self._thread.join(grace + 5.0)
        self._thread = None
        self._server = None
        if self._local is not None:
            self._local.remove()
        if self._trimming:
            self._trimming = False
            _trim.release()

    def __enter__(self) -> MasterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
