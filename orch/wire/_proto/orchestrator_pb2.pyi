from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    PENDING: _ClassVar[RunState]
    RUNNING: _ClassVar[RunState]
    SUCCEEDED: _ClassVar[RunState]
    FAILED: _ClassVar[RunState]
    STOPPED: _ClassVar[RunState]
    RESTARTING: _ClassVar[RunState]
    STOPPING: _ClassVar[RunState]
    PRUNED: _ClassVar[RunState]

class RankState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANK_STATE_UNSPECIFIED: _ClassVar[RankState]
    RANK_REGISTERED: _ClassVar[RankState]
    RANK_RUNNING: _ClassVar[RankState]
    RANK_SUCCEEDED: _ClassVar[RankState]
    RANK_FAILED: _ClassVar[RankState]
    RANK_STOPPED: _ClassVar[RankState]
    RANK_LOST: _ClassVar[RankState]

class Command(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_UNSPECIFIED: _ClassVar[Command]
    CONTINUE: _ClassVar[Command]
    STOP: _ClassVar[Command]
    ABORT: _ClassVar[Command]

class HostAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOST_CONTINUE: _ClassVar[HostAction]
    HOST_START: _ClassVar[HostAction]
    HOST_WAIT: _ClassVar[HostAction]
    HOST_EXIT: _ClassVar[HostAction]
RUN_STATE_UNSPECIFIED: RunState
PENDING: RunState
RUNNING: RunState
SUCCEEDED: RunState
FAILED: RunState
STOPPED: RunState
RESTARTING: RunState
STOPPING: RunState
PRUNED: RunState
RANK_STATE_UNSPECIFIED: RankState
RANK_REGISTERED: RankState
RANK_RUNNING: RankState
RANK_SUCCEEDED: RankState
RANK_FAILED: RankState
RANK_STOPPED: RankState
RANK_LOST: RankState
COMMAND_UNSPECIFIED: Command
CONTINUE: Command
STOP: Command
ABORT: Command
HOST_CONTINUE: HostAction
HOST_START: HostAction
HOST_WAIT: HostAction
HOST_EXIT: HostAction

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "host", "pid", "address", "rendezvous_port", "local_rank", "backend", "run_id", "rank", "world_size", "group", "local_world_size")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_PORT_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    host: str
    pid: int
    address: str
    rendezvous_port: int
    local_rank: int
    backend: str
    run_id: str
    rank: int
    world_size: int
    group: str
    local_world_size: int
    def __init__(self, worker_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., address: _Optional[str] = ..., rendezvous_port: _Optional[int] = ..., local_rank: _Optional[int] = ..., backend: _Optional[str] = ..., run_id: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., group: _Optional[str] = ..., local_world_size: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("rank", "world_size", "run_id", "fn", "config_json", "total_steps", "heartbeat_timeout", "attempt", "rendezvous_port", "seed")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FN_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_PORT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    run_id: str
    fn: str
    config_json: str
    total_steps: int
    heartbeat_timeout: float
    attempt: int
    rendezvous_port: int
    seed: int
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., run_id: _Optional[str] = ..., fn: _Optional[str] = ..., config_json: _Optional[str] = ..., total_steps: _Optional[int] = ..., heartbeat_timeout: _Optional[float] = ..., attempt: _Optional[int] = ..., rendezvous_port: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class CanStartTrainingRequest(_message.Message):
    __slots__ = ("run_id", "worker_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class CanStartTrainingResponse(_message.Message):
    __slots__ = ("ready", "registered", "world_size", "master_addr", "master_port", "backend")
    READY_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    registered: int
    world_size: int
    master_addr: str
    master_port: int
    backend: str
    def __init__(self, ready: _Optional[bool] = ..., registered: _Optional[int] = ..., world_size: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., backend: _Optional[str] = ...) -> None: ...

class Series(_message.Message):
    __slots__ = ("rank", "name", "steps", "values", "times")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TIMES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    name: str
    steps: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    times: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, rank: _Optional[int] = ..., name: _Optional[str] = ..., steps: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., times: _Optional[_Iterable[float]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("run_id", "worker_id", "step", "total_steps", "series", "dropped_points", "timing", "process", "stack", "dropped_reason", "note")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_POINTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    STACK_FIELD_NUMBER: _ClassVar[int]
    DROPPED_REASON_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    worker_id: str
    step: int
    total_steps: int
    series: _containers.RepeatedCompositeFieldContainer[Series]
    dropped_points: int
    timing: StepTiming
    process: ProcessStats
    stack: Stack
    dropped_reason: str
    note: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., series: _Optional[_Iterable[_Union[Series, _Mapping]]] = ..., dropped_points: _Optional[int] = ..., timing: _Optional[_Union[StepTiming, _Mapping]] = ..., process: _Optional[_Union[ProcessStats, _Mapping]] = ..., stack: _Optional[_Union[Stack, _Mapping]] = ..., dropped_reason: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class ProcessStats(_message.Message):
    __slots__ = ("rss_bytes", "cpu_percent", "cuda_allocated", "cuda_reserved", "cuda_peak", "cuda_total", "memory_limit", "limit_kind", "oom_kills", "limit_used")
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    CUDA_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    CUDA_RESERVED_FIELD_NUMBER: _ClassVar[int]
    CUDA_PEAK_FIELD_NUMBER: _ClassVar[int]
    CUDA_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_KIND_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_USED_FIELD_NUMBER: _ClassVar[int]
    rss_bytes: int
    cpu_percent: float
    cuda_allocated: int
    cuda_reserved: int
    cuda_peak: int
    cuda_total: int
    memory_limit: int
    limit_kind: str
    oom_kills: int
    limit_used: int
    def __init__(self, rss_bytes: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., cuda_allocated: _Optional[int] = ..., cuda_reserved: _Optional[int] = ..., cuda_peak: _Optional[int] = ..., cuda_total: _Optional[int] = ..., memory_limit: _Optional[int] = ..., limit_kind: _Optional[str] = ..., oom_kills: _Optional[int] = ..., limit_used: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("file", "line", "function", "code", "user")
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    file: str
    line: int
    function: str
    code: str
    user: bool
    def __init__(self, file: _Optional[str] = ..., line: _Optional[int] = ..., function: _Optional[str] = ..., code: _Optional[str] = ..., user: _Optional[bool] = ...) -> None: ...

class Stack(_message.Message):
    __slots__ = ("frames", "taken", "step", "note")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    TAKEN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    taken: float
    step: int
    note: str
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., taken: _Optional[float] = ..., step: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class StepTiming(_message.Message):
    __slots__ = ("steps", "step_seconds", "data_seconds", "collective_seconds", "other_seconds", "sections", "collectives", "timed_by")
    class SectionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DATA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OTHER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    TIMED_BY_FIELD_NUMBER: _ClassVar[int]
    steps: int
    step_seconds: float
    data_seconds: float
    collective_seconds: float
    other_seconds: float
    sections: _containers.ScalarMap[str, float]
    collectives: bool
    timed_by: str
    def __init__(self, steps: _Optional[int] = ..., step_seconds: _Optional[float] = ..., data_seconds: _Optional[float] = ..., collective_seconds: _Optional[float] = ..., other_seconds: _Optional[float] = ..., sections: _Optional[_Mapping[str, float]] = ..., collectives: _Optional[bool] = ..., timed_by: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("command", "stop_at_step", "send_stack", "reason", "interval", "hold_after_step")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_STEP_FIELD_NUMBER: _ClassVar[int]
    SEND_STACK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    HOLD_AFTER_STEP_FIELD_NUMBER: _ClassVar[int]
    command: Command
    stop_at_step: int
    send_stack: bool
    reason: str
    interval: float
    hold_after_step: int
    def __init__(self, command: _Optional[_Union[Command, str]] = ..., stop_at_step: _Optional[int] = ..., send_stack: _Optional[bool] = ..., reason: _Optional[str] = ..., interval: _Optional[float] = ..., hold_after_step: _Optional[int] = ...) -> None: ...

class HostHeartbeatsRequest(_message.Message):
    __slots__ = ("beats",)
    BEATS_FIELD_NUMBER: _ClassVar[int]
    beats: _containers.RepeatedCompositeFieldContainer[HeartbeatRequest]
    def __init__(self, beats: _Optional[_Iterable[_Union[HeartbeatRequest, _Mapping]]] = ...) -> None: ...

class BeatReply(_message.Message):
    __slots__ = ("reply", "code", "error")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reply: HeartbeatResponse
    code: int
    error: str
    def __init__(self, reply: _Optional[_Union[HeartbeatResponse, _Mapping]] = ..., code: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class HostHeartbeatsResponse(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[BeatReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[BeatReply, _Mapping]]] = ...) -> None: ...

class HostSyncRequest(_message.Message):
    __slots__ = ("host", "attempt", "worker_ids", "running", "failure")
    HOST_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    host: str
    attempt: int
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    running: bool
    failure: str
    def __init__(self, host: _Optional[str] = ..., attempt: _Optional[int] = ..., worker_ids: _Optional[_Iterable[str]] = ..., running: _Optional[bool] = ..., failure: _Optional[str] = ...) -> None: ...

class HostSyncResponse(_message.Message):
    __slots__ = ("action", "attempt", "run_id", "restarts", "heartbeat_timeout", "state", "interval")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    action: HostAction
    attempt: int
    run_id: str
    restarts: bool
    heartbeat_timeout: float
    state: RunState
    interval: float
    def __init__(self, action: _Optional[_Union[HostAction, str]] = ..., attempt: _Optional[int] = ..., run_id: _Optional[str] = ..., restarts: _Optional[bool] = ..., heartbeat_timeout: _Optional[float] = ..., state: _Optional[_Union[RunState, str]] = ..., interval: _Optional[float] = ...) -> None: ...

class CompletionRequest(_message.Message):
    __slots__ = ("run_id", "worker_id", "outcome", "error", "param_checksum", "step", "exit_code")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PARAM_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    worker_id: str
    outcome: RankState
    error: str
    param_checksum: str
    step: int
    exit_code: int
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., outcome: _Optional[_Union[RankState, str]] = ..., error: _Optional[str] = ..., param_checksum: _Optional[str] = ..., step: _Optional[int] = ..., exit_code: _Optional[int] = ...) -> None: ...

class CompletionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ("cursor", "skip_series", "max_points", "changed_ranks")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    SKIP_SERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_RANKS_FIELD_NUMBER: _ClassVar[int]
    cursor: bytes
    skip_series: bool
    max_points: int
    changed_ranks: bool
    def __init__(self, cursor: _Optional[bytes] = ..., skip_series: _Optional[bool] = ..., max_points: _Optional[int] = ..., changed_ranks: _Optional[bool] = ...) -> None: ...

class RankInfo(_message.Message):
    __slots__ = ("rank", "worker_id", "host", "pid", "state", "step", "total_steps", "steps_per_sec", "heartbeat_age", "loss", "param_checksum", "error", "exit_code", "dropped_points", "address", "has_loss", "timed", "step_ms", "data_ms", "compute_ms", "collective_ms", "other_ms", "relative_score", "individual_score", "slow_in", "progress_age", "stack", "rss_bytes", "cpu_percent", "cuda_allocated", "cuda_reserved", "cuda_peak", "cuda_total", "memory_limit", "limit_kind", "memory_note", "dropped_reason", "timed_by", "section_ms", "note")
    class SectionMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PARAM_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_POINTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HAS_LOSS_FIELD_NUMBER: _ClassVar[int]
    TIMED_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    DATA_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_MS_FIELD_NUMBER: _ClassVar[int]
    OTHER_MS_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_SCORE_FIELD_NUMBER: _ClassVar[int]
    INDIVIDUAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    SLOW_IN_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_AGE_FIELD_NUMBER: _ClassVar[int]
    STACK_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    CUDA_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    CUDA_RESERVED_FIELD_NUMBER: _ClassVar[int]
    CUDA_PEAK_FIELD_NUMBER: _ClassVar[int]
    CUDA_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_KIND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_NOTE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMED_BY_FIELD_NUMBER: _ClassVar[int]
    SECTION_MS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    worker_id: str
    host: str
    pid: int
    state: RankState
    step: int
    total_steps: int
    steps_per_sec: float
    heartbeat_age: float
    loss: float
    param_checksum: str
    error: str
    exit_code: int
    dropped_points: int
    address: str
    has_loss: bool
    timed: bool
    step_ms: float
    data_ms: float
    compute_ms: float
    collective_ms: float
    other_ms: float
    relative_score: float
    individual_score: float
    slow_in: str
    progress_age: float
    stack: str
    rss_bytes: int
    cpu_percent: float
    cuda_allocated: int
    cuda_reserved: int
    cuda_peak: int
    cuda_total: int
    memory_limit: int
    limit_kind: str
    memory_note: str
    dropped_reason: str
    timed_by: str
    section_ms: _containers.ScalarMap[str, float]
    note: str
    def __init__(self, rank: _Optional[int] = ..., worker_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., state: _Optional[_Union[RankState, str]] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., steps_per_sec: _Optional[float] = ..., heartbeat_age: _Optional[float] = ..., loss: _Optional[float] = ..., param_checksum: _Optional[str] = ..., error: _Optional[str] = ..., exit_code: _Optional[int] = ..., dropped_points: _Optional[int] = ..., address: _Optional[str] = ..., has_loss: _Optional[bool] = ..., timed: _Optional[bool] = ..., step_ms: _Optional[float] = ..., data_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ..., collective_ms: _Optional[float] = ..., other_ms: _Optional[float] = ..., relative_score: _Optional[float] = ..., individual_score: _Optional[float] = ..., slow_in: _Optional[str] = ..., progress_age: _Optional[float] = ..., stack: _Optional[str] = ..., rss_bytes: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., cuda_allocated: _Optional[int] = ..., cuda_reserved: _Optional[int] = ..., cuda_peak: _Optional[int] = ..., cuda_total: _Optional[int] = ..., memory_limit: _Optional[int] = ..., limit_kind: _Optional[str] = ..., memory_note: _Optional[str] = ..., dropped_reason: _Optional[str] = ..., timed_by: _Optional[str] = ..., section_ms: _Optional[_Mapping[str, float]] = ..., note: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("time", "kind", "rank", "message")
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    time: float
    kind: str
    rank: int
    message: str
    def __init__(self, time: _Optional[float] = ..., kind: _Optional[str] = ..., rank: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GetStateResponse(_message.Message):
    __slots__ = ("run_id", "state", "world_size", "registered", "total_steps", "elapsed", "ranks", "series", "events", "failure", "cursor", "full", "root_cause_rank", "attempt", "max_attempts", "root_cause_error", "root_cause_exit_code", "rendezvous", "more", "job", "stragglers_judged", "straggler_rank", "straggler_section", "straggler_note", "stalled_for", "progress_note", "stacks", "stacks_taken", "startup_note", "startup_seconds", "ranks_changed_only", "clock")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    ROOT_CAUSE_RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ROOT_CAUSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    ROOT_CAUSE_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_JUDGED_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_RANK_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_SECTION_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_NOTE_FIELD_NUMBER: _ClassVar[int]
    STALLED_FOR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_NOTE_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    STACKS_TAKEN_FIELD_NUMBER: _ClassVar[int]
    STARTUP_NOTE_FIELD_NUMBER: _ClassVar[int]
    STARTUP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_CHANGED_ONLY_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: RunState
    world_size: int
    registered: int
    total_steps: int
    elapsed: float
    ranks: _containers.RepeatedCompositeFieldContainer[RankInfo]
    series: _containers.RepeatedCompositeFieldContainer[Series]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    failure: str
    cursor: bytes
    full: bool
    root_cause_rank: int
    attempt: int
    max_attempts: int
    root_cause_error: str
    root_cause_exit_code: int
    rendezvous: str
    more: bool
    job: ClusterJob
    stragglers_judged: bool
    straggler_rank: int
    straggler_section: str
    straggler_note: str
    stalled_for: float
    progress_note: str
    stacks: str
    stacks_taken: float
    startup_note: str
    startup_seconds: float
    ranks_changed_only: bool
    clock: float
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., world_size: _Optional[int] = ..., registered: _Optional[int] = ..., total_steps: _Optional[int] = ..., elapsed: _Optional[float] = ..., ranks: _Optional[_Iterable[_Union[RankInfo, _Mapping]]] = ..., series: _Optional[_Iterable[_Union[Series, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., failure: _Optional[str] = ..., cursor: _Optional[bytes] = ..., full: _Optional[bool] = ..., root_cause_rank: _Optional[int] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., root_cause_error: _Optional[str] = ..., root_cause_exit_code: _Optional[int] = ..., rendezvous: _Optional[str] = ..., more: _Optional[bool] = ..., job: _Optional[_Union[ClusterJob, _Mapping]] = ..., stragglers_judged: _Optional[bool] = ..., straggler_rank: _Optional[int] = ..., straggler_section: _Optional[str] = ..., straggler_note: _Optional[str] = ..., stalled_for: _Optional[float] = ..., progress_note: _Optional[str] = ..., stacks: _Optional[str] = ..., stacks_taken: _Optional[float] = ..., startup_note: _Optional[str] = ..., startup_seconds: _Optional[float] = ..., ranks_changed_only: _Optional[bool] = ..., clock: _Optional[float] = ...) -> None: ...

class GetStacksRequest(_message.Message):
    __slots__ = ("wait",)
    WAIT_FIELD_NUMBER: _ClassVar[int]
    wait: float
    def __init__(self, wait: _Optional[float] = ...) -> None: ...

class RankStack(_message.Message):
    __slots__ = ("rank", "stack", "text")
    RANK_FIELD_NUMBER: _ClassVar[int]
    STACK_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    rank: int
    stack: Stack
    text: str
    def __init__(self, rank: _Optional[int] = ..., stack: _Optional[_Union[Stack, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class GetStacksResponse(_message.Message):
    __slots__ = ("ranks", "grouped")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    GROUPED_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedCompositeFieldContainer[RankStack]
    grouped: str
    def __init__(self, ranks: _Optional[_Iterable[_Union[RankStack, _Mapping]]] = ..., grouped: _Optional[str] = ...) -> None: ...

class ClusterJob(_message.Message):
    __slots__ = ("scheduler", "job_id", "state", "reason", "nodes")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    job_id: str
    state: str
    reason: str
    nodes: str
    def __init__(self, scheduler: _Optional[str] = ..., job_id: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., nodes: _Optional[str] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ("reason", "prune")
    REASON_FIELD_NUMBER: _ClassVar[int]
    PRUNE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    prune: bool
    def __init__(self, reason: _Optional[str] = ..., prune: _Optional[bool] = ...) -> None: ...

class StopRunResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: RunState
    def __init__(self, state: _Optional[_Union[RunState, str]] = ...) -> None: ...

class StateCursor(_message.Message):
    __slots__ = ("run_id", "offsets", "keys", "events", "epoch", "ranks_seen")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANKS_SEEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    offsets: _containers.RepeatedScalarFieldContainer[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    events: int
    epoch: int
    ranks_seen: int
    def __init__(self, run_id: _Optional[str] = ..., offsets: _Optional[_Iterable[int]] = ..., keys: _Optional[_Iterable[str]] = ..., events: _Optional[int] = ..., epoch: _Optional[int] = ..., ranks_seen: _Optional[int] = ...) -> None: ...

class MetricRecord(_message.Message):
    __slots__ = ("rank", "attempt", "series")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    attempt: int
    series: _containers.RepeatedCompositeFieldContainer[Series]
    def __init__(self, rank: _Optional[int] = ..., attempt: _Optional[int] = ..., series: _Optional[_Iterable[_Union[Series, _Mapping]]] = ...) -> None: ...
