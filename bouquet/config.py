"""The one configuration object of a bouquet deployment.

Built once from the command line (and ``BOUQUET_*`` environment variables, read by the CLI, never
at import time), validated here, then passed down explicitly: to the gateway in-process and to each
server process as JSON on its command line. No module reads the environment on its own.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Literal

from bouquet.engine.runtime.buckets import Bucket  # bucket arithmetic only: no torch

# Every process's log lines (launcher, gateway workers, replicas): time, level, logger, message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "float16", "bfloat16"]
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
DTYPES: tuple[str, ...] = ("auto", "float32", "float16", "bfloat16")
EngineKind = Literal["torch", "noop"]
ENGINES: tuple[str, ...] = ("torch", "noop")
Transport = Literal["auto", "grpc"]
TRANSPORTS: tuple[str, ...] = ("auto", "grpc")
Quantization = Literal["none", "fp8", "int8"]
QUANTIZATIONS: tuple[str, ...] = ("none", "fp8", "int8")
LOG_LEVELS: tuple[str, ...] = ("critical", "error", "warning", "info", "debug")  # Python logging's names

# Default sizes, written here only (the server, the offline job and the CLI read them from here).
MAX_BATCH_SEQS = 512  # sequence slots per engine step
# the gateway polls each healthy replica's Info this often (s): its /metrics per replica are that old at most
REPLICA_POLL_S = 1.0
CHUNK_TOKENS = 8192  # the gateway splits a large request into chunks of about this many tokens
INTERACTIVE_MAX_TOKENS = 2048  # requests without 'priority' of at most this many tokens are interactive
# Batches with more tokens run eagerly, not as a CUDA-graph replay: the GPU step budget, so every full
# step of a bulk request replays too. An eager 16,384-token step of a small encoder is host-bound: its
# Python launches take longer than its kernels (H200: bge-base 7.9 ms of launches for 5.6 ms of kernels,
# all-MiniLM-L6-v2's shape 4.4 for 1.4; 6603f18:bench/results/h200-2026-12-01c).
GRAPH_MAX_TOKENS = 16384
# Token budget per engine step when none is given: on the CPU smaller batches keep activations in
# cache (measured: ~15% faster on 2 cores than 16,384).
GPU_BATCH_TOKENS = 16384
CPU_BATCH_TOKENS = 2048
# fp8 is refused for a model whose outputs on a probe batch fall below this cosine against its
# own bf16 outputs (engine.py, at load).
FP8_MIN_COSINE = 0.995
# --quantization int8 (CPU) is refused for a model whose outputs on the probe batch fall below this
# cosine against its own unquantized outputs (engine/runtime/cpu_plan.py, at load). Looser than fp8's bar:
# int8's uniform levels lose more than e4m3 on the few outlier channels encoders carry. all-MiniLM-L6-v2
# passes it (probe 0.9965; STSb test worst vector 0.9924, Spearman 0.8195 vs fp32 0.8203:
# docs/decisions.md); ONNX Runtime's naive int8 of the same model (0.80) would not.
INT8_MIN_COSINE = 0.99
# Request limits (gateway). Tokens per request: the tokens the model runs for one request, all its
# inputs together (after tokenization and truncation: usage.prompt_tokens); 100 × 4,096 by default.
MAX_REQUEST_TOKENS = 100 * 4096
# The body limit, unless --max-request-bytes sets one, follows from the token limit: a token id
# takes up to 8 bytes of JSON ("151643, ": 6 digits and a separator), text about as much per
# token; the headroom covers the other fields.
BODY_BYTES_PER_TOKEN = 8
BODY_HEADROOM_BYTES = 1 << 20
# Per-token outputs (/embed_all, multi_vector, bge-m3's heads) grow with tokens × vector width:
# a request whose output would exceed this many bytes is refused before it runs.
MAX_OUTPUT_BYTES = 64 << 20


def batch_token_budget(max_batch_tokens: int, device_type: str, longest: int = 0) -> int:
    """Tokens per engine step: ``max_batch_tokens`` when > 0, else GPU_BATCH_TOKENS on "cuda" and
    CPU_BATCH_TOKENS otherwise; never below ``longest`` (tokens of the longest sequence a caller
    wants to fit a batch whole, e.g. the model's maximum length)."""
    budget = max_batch_tokens or (GPU_BATCH_TOKENS if device_type == "cuda" else CPU_BATCH_TOKENS)
    return max(budget, longest)


class ConfigError(ValueError):
    """A configuration value is out of its allowed range; the message names it."""


# Lower bounds of the integer options (flag = field name with dashes).
MINIMUMS = (("max_batch_seqs", 1), ("replicas", 1), ("replicas_per_gpu", 0), ("gateway_workers", 0), ("tokenizer_threads", 0),
            ("max_inputs", 1), ("interactive_max_tokens", 0), ("max_queue_tokens", 1),
            ("chunk_tokens", 1), ("max_request_tokens", 1), ("max_output_bytes", 1024),
            ("max_header_bytes", 1024), ("max_header_count", 1), ("max_connections", 1))


@dataclass(frozen=True)
class ServeConfig:
    """Everything `bouquet serve` needs. Units: tokens, bytes, ms, seconds as named.

    Raises ConfigError (from ``validate``) on any value outside its range.
    """

    model: str | None = None  # path or Hugging Face id; None = the embedded all-MiniLM-L6-v2
    # A Hub id's branch, tag or commit (``--model ORG/NAME@REV`` says the same). The launcher
    # downloads the model, then passes its snapshot directory down as ``model`` (bouquet/hub.py).
    revision: str | None = None
    # Pickled weights (pytorch_model.bin) are refused unless set, and then loaded with
    # torch.load(weights_only=True) only: unpickling an arbitrary file can run code.
    allow_pickle: bool = False
    # Several models behind one endpoint (`serve --model A --model B`): every model, in order
    # (``model`` is then the first); empty when one model is served. ``per_model`` splits them.
    models: tuple[str, ...] = ()
    # One model: its aliases, the first being the public id. Several: one public id per model, in order.
    served_model_name: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 0  # 0 = pick a free port
    device: Device = "auto"
    dtype: DType = "auto"
    # "fp8": the layers' matmuls in e4m3 (engine/linear/fp8.py) on every step (engine/plan.py FP8_MIN_TOKENS)
    quantization: Quantization = "none"
    max_batch_tokens: int = 0  # token budget per engine step; 0 = auto (batch_token_budget)
    max_batch_seqs: int = MAX_BATCH_SEQS
    # Scheduling (server): a request with at most this many tokens is `interactive` by default.
    interactive_max_tokens: int = INTERACTIVE_MAX_TOKENS
    max_queue_tokens: int = 4_000_000  # pending tokens per replica before 429
    # Gateway
    replicas: int = 1
    servers: tuple[str, ...] = ()  # external replicas host:port; when set no server is started
    gpus: tuple[int, ...] = ()
    # replica processes sharing each GPU (each has its own CUDA context); 0 = sized to the machine
    # and the model by `serve` (bouquet/layout.py), which passes the chosen number down
    replicas_per_gpu: int = 0
    # How the gateway reaches replicas: "auto" = a Unix socket to the replicas `serve` starts on
    # this host (proto/ipc.py), gRPC to `--server` ones; "grpc" = gRPC to every replica.
    transport: Transport = "auto"
    # Set by the launcher, parallel to ``servers``: each local replica's Unix socket ("" = none).
    ipc_paths: tuple[str, ...] = ()
    # Set by the launcher, parallel to ``servers``: the GPU each local replica runs on ("cuda:0";
    # "" = unknown or not a GPU).
    replica_gpus: tuple[str, ...] = ()
    # Set by the launcher: ``servers`` are the replicas it started, whose start-up failures it reports
    # itself (one error line); the gateway then logs their not answering before any was ready at INFO.
    own_replicas: bool = False
    # Set by the launcher from the layout (bouquet/layout.py) and this model's size: batch-priority
    # chunks go to one replica of each GPU (replicas sharing a GPU time-slice it).
    batch_one_replica_per_gpu: bool = False
    gateway_workers: int = 0  # gateway processes; 0 = sized to the machine (bouquet/layout.py)
    tokenizer_threads: int = 0  # per gateway worker; 0 = sized to the machine (bouquet/layout.py)
    layout: str = ""  # how `serve` chose the three above, one line (logged, and in /info); set by the launcher
    chunk_tokens: int = CHUNK_TOKENS
    # Request limits (413 beyond them, naming the flag). Bytes: 0 = derived from the token limit
    # (request_bytes_limit); an explicit value wins.
    max_request_tokens: int = MAX_REQUEST_TOKENS
    max_request_bytes: int = 0
    max_output_bytes: int = MAX_OUTPUT_BYTES
    # Idle keep-alive connections are closed after this many seconds. It must exceed the clients'
    # own idle expiry (httpx 5 s, aiohttp 15 s): with equal timers (uvicorn's default is 5 s, the
    # same as httpx's) a client can send on a connection at the moment the server closes it, and
    # that request gets no reply (ReadError). 75 s is nginx's default.
    timeout_keep_alive: float = 75.0
    # The HTTP front end's own limits (gateway/limits.py, docs/deploy.md), all per connection but the
    # last: a new connection that sends nothing for timeout_connect_idle s is closed unanswered; a
    # request's head must arrive within timeout_headers s of its first byte and its body within
    # timeout_body s of the head's end, with at most timeout_read_gap s between two reads (else 408,
    # then close); its head holds at most max_header_bytes (request line and fields) and
    # max_header_count field lines (else 431, or 414 for a long target; a chunked body's extensions
    # and trailers get one more max_header_bytes). Past max_connections open
    # connections in one gateway process, a new one's request is answered 503 with Retry-After.
    timeout_connect_idle: float = 10.0
    timeout_headers: float = 10.0
    timeout_body: float = 60.0
    timeout_read_gap: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_header_count: int = 100
    max_connections: int = 2048
    # SIGTERM: requests in flight get this many seconds to finish (new ones are answered 503), then
    # those still running are answered 503 too (gateway/drain.py). Kubernetes' default grace is 30 s.
    drain_timeout: float = 30.0
    max_inputs: int = 4096
    api_key: str | None = field(default=None, repr=False)  # a secret: kept out of reprs and replicas
    # Browser origins allowed to call the API (CORS, gateway/app.py); empty = no CORS headers at all.
    cors_allow_origins: tuple[str, ...] = ()
    truncate: bool = True  # default for requests that do not say
    # "noop": a benchmarking aid that runs no model and answers zero vectors (engine/runtime/noop.py)
    engine: EngineKind = "torch"
    # Engine fast path (GPU)
    enforce_eager: bool = False
    # The thread that waits for a batch's result spins (GIL released) instead of sleeping until
    # the device interrupts: measured on an H200, batch-1 waits 0.22–0.24 ms shorter, for one busy
    # core per replica while batches run (6603f18:bench/results/h200-2026-11-30/).
    spin_wait: bool = True
    graph_max_tokens: int = GRAPH_MAX_TOKENS
    # The engine's Triton GEMMs where measured faster on Hopper (split-K for steps of ≤ 256 tokens,
    # qkv / MLP-in for ≤ 128, gate/up with the activation from 2,048: 6603f18:bench/results/h200-2026-12-01e,
    # -01h, -12-02);
    # False = none of them
    triton_gemms: bool = True
    capture_buckets: tuple[str, ...] = ()  # "seqs:tokens:max_seqlen" captured at start-up
    bucket_stats_path: str | None = None
    log_level: str = "info"
    extra: dict[str, str] = field(default_factory=dict)

    def validate(self) -> "ServeConfig":
        if self.api_key is not None and not self.api_key.strip():
            # an empty secret (an unset Kubernetes secret, `BOUQUET_API_KEY=`) must not mean "no auth"
            raise ConfigError("the API key is empty (--api-key or BOUQUET_API_KEY); unset it to serve without "
                              "authentication, or give a key")
        if self.api_key is not None and not all("!" <= c <= "~" for c in self.api_key):
            # A key with a newline, space or control character (`BOUQUET_API_KEY=$'KEY\n'`) can never
            # arrive in an HTTP header or gRPC metadata value: every request would be refused 401.
            # The key itself is not printed (it is a secret); the first bad character's position is.
            at = next(i for i, c in enumerate(self.api_key) if not "!" <= c <= "~")
            raise ConfigError(f"the API key has a whitespace, control or non-ASCII character at position {at} "
                              f"(e.g. a trailing newline); a key must be printable ASCII without spaces")
        if self.revision is not None and not self.revision.strip():
            raise ConfigError("--revision must be a branch, tag or commit, got an empty string")
        if self.revision is not None and self.models:
            raise ConfigError("--revision is ambiguous with several --model: give each its revision as ORG/NAME@REVISION")
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.quantization == "int8" and self.device == "cuda":
            raise ConfigError("--quantization int8 runs on the CPU only (--device cpu); on a GPU use fp8")
        if self.quantization == "int8" and self.dtype == "float16":
            raise ConfigError("--quantization int8 needs --dtype auto, float32 or bfloat16 (its CPU kernels take fp32 or bf16 "
                              "activations), got float16")
        if self.engine == "noop" and self.quantization != "none":
            raise ConfigError(f"--quantization {self.quantization} needs a model: --engine noop runs none")
        for name in ("port", "grpc_port"):
            v = getattr(self, name)
            if not 0 <= v <= 65535:
                raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 65535], got {v}")
        for name, low in MINIMUMS:
            if getattr(self, name) < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        if self.max_request_bytes != 0 and self.max_request_bytes < 1024:
            raise ConfigError(f"--max-request-bytes must be >= 1024 (or 0: {BODY_BYTES_PER_TOKEN} bytes per token of "
                              f"--max-request-tokens, plus {BODY_HEADROOM_BYTES} bytes), got {self.max_request_bytes}")
        if self.max_batch_tokens < 0:
            raise ConfigError(f"--max-batch-tokens must be >= 1 (or 0 for auto), got {self.max_batch_tokens}")
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"--transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.models:
            if len(self.models) < 2 or self.model != self.models[0]:
                raise ConfigError(f"models {self.models} must list two or more models, the first being model {self.model!r}")
            if self.served_model_name and len(self.served_model_name) != len(self.models):
                raise ConfigError(f"with {len(self.models)} models give one --served-model-name per model, in the order "
                                  f"of --model, or none; got {len(self.served_model_name)}")
            if self.servers:
                raise ConfigError("--server serves one model; with several --model let `serve` start the replicas")
        if self.ipc_paths and len(self.ipc_paths) != len(self.servers):
            raise ConfigError(f"ipc_paths has {len(self.ipc_paths)} entries for {len(self.servers)} servers")
        if self.replica_gpus and len(self.replica_gpus) != len(self.servers):
            raise ConfigError(f"replica_gpus has {len(self.replica_gpus)} entries for {len(self.servers)} servers")
        for name in ("timeout_keep_alive", "timeout_connect_idle", "timeout_headers", "timeout_body", "timeout_read_gap"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 (seconds), got {getattr(self, name)}")
        if not self.drain_timeout >= 0:
            raise ConfigError(f"--drain-timeout must be >= 0 (seconds), got {self.drain_timeout}")
        if self.graph_max_tokens < 64:
            raise ConfigError(f"--graph-max-tokens must be >= 64 (the smallest bucket), got {self.graph_max_tokens}")
        for b in self.capture_buckets:
            try:
                bucket = Bucket.parse(b)
            except ValueError as e:
                raise ConfigError(f"--capture-bucket: {e}") from None
            if bucket.tokens > self.graph_max_tokens:
                raise ConfigError(f"--capture-bucket {b!r} has {bucket.tokens} tokens once rounded, above "
                                  f"--graph-max-tokens {self.graph_max_tokens}")
        return self

    @property
    def request_bytes_limit(self) -> int:
        """The request body limit in force, bytes: ``max_request_bytes`` when set, else
        BODY_BYTES_PER_TOKEN per token of ``max_request_tokens`` plus BODY_HEADROOM_BYTES (the
        default: 4,325,376, which admits 100 × 4,096 token ids of a 151,669-token vocabulary)."""
        return self.max_request_bytes or BODY_BYTES_PER_TOKEN * self.max_request_tokens + BODY_HEADROOM_BYTES

    def per_model(self) -> "list[ServeConfig]":
        """One single-model config per served model, in order (``[self]`` for one model): model i
        gets ``models[i]``, its own ``--served-model-name`` and the replica options unchanged (each
        model has its own replicas); a fixed ``grpc_port`` continues after the previous models' replicas."""
        if not self.models:
            return [self]
        per_model_replicas = (len(self.gpus) or self.replicas) * max(1, self.replicas_per_gpu)
        return [self.replace(model=m, models=(), served_model_name=self.served_model_name[i:i + 1],
                             grpc_port=self.grpc_port + i * per_model_replicas if self.grpc_port else 0)
                for i, m in enumerate(self.models)]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ServeConfig":
        raw = json.loads(text)
        for k in ("models", "served_model_name", "servers", "gpus", "capture_buckets", "ipc_paths", "replica_gpus", "cors_allow_origins"):
            raw[k] = tuple(raw.get(k) or ())
        return cls(**raw).validate()

    def replace(self, **changes: object) -> "ServeConfig":
        return dataclasses.replace(self, **changes).validate()  # type: ignore[arg-type]
