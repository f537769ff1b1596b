from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_AUTO: _ClassVar[Priority]
    PRIORITY_INTERACTIVE: _ClassVar[Priority]
    PRIORITY_BATCH: _ClassVar[Priority]
PRIORITY_AUTO: Priority
PRIORITY_INTERACTIVE: Priority
PRIORITY_BATCH: Priority

class Tensor(_message.Message):
    __slots__ = ("data", "dtype", "shape")
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, data: _Optional[bytes] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("input_ids", "lengths", "token_type_ids", "priority", "normalize", "dimensions", "request_id", "per_token", "pool_skip")
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TYPE_IDS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POOL_SKIP_FIELD_NUMBER: _ClassVar[int]
    input_ids: bytes
    lengths: bytes
    token_type_ids: bytes
    priority: Priority
    normalize: bool
    dimensions: int
    request_id: str
    per_token: bool
    pool_skip: int
    def __init__(self, input_ids: _Optional[bytes] = ..., lengths: _Optional[bytes] = ..., token_type_ids: _Optional[bytes] = ..., priority: _Optional[_Union[Priority, str]] = ..., normalize: _Optional[bool] = ..., dimensions: _Optional[int] = ..., request_id: _Optional[str] = ..., per_token: _Optional[bool] = ..., pool_skip: _Optional[int] = ...) -> None: ...

class EmbedReply(_message.Message):
    __slots__ = ("output", "num_tokens")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    output: Tensor
    num_tokens: int
    def __init__(self, output: _Optional[_Union[Tensor, _Mapping]] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoReply(_message.Message):
    __slots__ = ("model_id", "architecture", "task", "dimension", "max_seq_length", "device", "dtype", "ready", "attention", "pending_tokens", "max_batch_tokens", "inflight_requests", "batches", "batch_sequences", "batch_tokens", "cancelled_sequences", "graph_captures", "graph_replays", "batch_tokens_le", "batch_tokens_cumulative", "batch_sequences_le", "batch_sequences_cumulative", "step_seconds_sum", "pid", "completed_requests")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    PENDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_CAPTURES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_REPLAYS_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_LE_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_CUMULATIVE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SEQUENCES_LE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SEQUENCES_CUMULATIVE_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_SUM_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    architecture: str
    task: str
    dimension: int
    max_seq_length: int
    device: str
    dtype: str
    ready: bool
    attention: str
    pending_tokens: int
    max_batch_tokens: int
    inflight_requests: int
    batches: int
    batch_sequences: int
    batch_tokens: int
    cancelled_sequences: int
    graph_captures: int
    graph_replays: int
    batch_tokens_le: _containers.RepeatedScalarFieldContainer[float]
    batch_tokens_cumulative: _containers.RepeatedScalarFieldContainer[int]
    batch_sequences_le: _containers.RepeatedScalarFieldContainer[float]
    batch_sequences_cumulative: _containers.RepeatedScalarFieldContainer[int]
    step_seconds_sum: float
    pid: int
    completed_requests: int
    def __init__(self, model_id: _Optional[str] = ..., architecture: _Optional[str] = ..., task: _Optional[str] = ..., dimension: _Optional[int] = ..., max_seq_length: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., ready: _Optional[bool] = ..., attention: _Optional[str] = ..., pending_tokens: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., inflight_requests: _Optional[int] = ..., batches: _Optional[int] = ..., batch_sequences: _Optional[int] = ..., batch_tokens: _Optional[int] = ..., cancelled_sequences: _Optional[int] = ..., graph_captures: _Optional[int] = ..., graph_replays: _Optional[int] = ..., batch_tokens_le: _Optional[_Iterable[float]] = ..., batch_tokens_cumulative: _Optional[_Iterable[int]] = ..., batch_sequences_le: _Optional[_Iterable[float]] = ..., batch_sequences_cumulative: _Optional[_Iterable[int]] = ..., step_seconds_sum: _Optional[float] = ..., pid: _Optional[int] = ..., completed_requests: _Optional[int] = ...) -> None: ...
