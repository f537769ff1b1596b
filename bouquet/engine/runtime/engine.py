"""The engine: one model on one device, stepping packed batches.

``Engine.step(batch)`` returns a ``PendingResult`` at once. On CUDA the inputs go up in one copy
from pinned memory (a replay's first node), the forward pass, pooling and the head are enqueued (a
CUDA-graph replay for batches up to ``GraphOptions.max_tokens``, see graphs.py), then an
asynchronous device→host copy into pinned memory and a CUDA event; nothing in ``step`` waits for
the device, except that a replay's inputs wait for the replay before it to have started (graphs.py:
the staging buffer). ``wait()`` blocks
only the calling (helper) thread. On the CPU the work runs inside ``step`` on the same packed
inputs and through the same forward function, and the handle is already complete. ``Engine``
implements ``contract.StepEngine``; the model classes implement ``models/base.PackedModel``.

What the engine does not own: request bookkeeping, batching policy (server/scheduler.py),
tokenization (gateway), per-request normalization/truncation (pooling.finalize, in the server).
"""
from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from bouquet.config import FP8_MIN_COSINE, GRAPH_MAX_TOKENS, INT8_MIN_COSINE, MAX_BATCH_SEQS, ServeConfig
from bouquet.engine.attention.backends import AttentionBackend, VarlenBackend, select_backend
from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.buckets import bucket_for, load_hot, startup_buckets
from bouquet.engine.runtime import cpu_plan
from bouquet.engine.runtime.host_memory import keep_freed_memory
from bouquet.engine.runtime.contract import EngineInfo
from bouquet.engine.linear.cpu import BF16_FLAGS, cpu_dtype, cpu_flags, padded_rows
from bouquet.engine.linear.fp8_checkpoint import split_fp8_checkpoint
from bouquet.engine.runtime.graphs import GraphManager, input_views, pack_inputs
from bouquet.engine.heads.m3_heads import M3Heads
from bouquet.engine.heads.pooling import pooler
from bouquet.engine.linear.base import GatedTritonLinear, linears
from bouquet.engine.linear.select import assign_methods
from bouquet.engine.models.base import PackedModel
from bouquet.engine.linear.fp8 import agreement_name, enable_fp8, fp8_linears, output_cosines, set_fp8_min_tokens
from bouquet.engine.linear.triton_gemms import compile_now
from bouquet.engine.plan import FP8_MIN_TOKENS, WARM_TOKENS, KernelPlan, profile_of
from bouquet.engine.heads.st_head import build_head
from bouquet.engine.models.registry import model_class
from bouquet.engine.models.weights import assign_weights, load_safetensors
from bouquet.modelspec import ModelSpec

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
RESULT_EVENTS = 64  # the ring of completion events Engine.step records (far above the steps in flight)


def resolve_device(device: str) -> torch.device:
    """'auto' → cuda when available, else cpu. Raises ValueError when cuda is asked but absent."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"{device} was requested (--device cuda or --gpus) but torch sees no CUDA device; "
                         "use --device cpu (or auto) on a machine without a GPU")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device, quantization: str = "none") -> torch.dtype:
    """'auto' → bfloat16 on CUDA; on the CPU float32 with ``quantization`` "int8" (its linears
    take fp32 rows: bf16 ones only add conversions; docs/decisions.md, 2026-12-05), else bfloat16
    where the CPU has native bf16 dot products (AVX512-BF16 / AMX, read from /proc/cpuinfo:
    ``linear.cpu.cpu_dtype``), else float32. Raises ValueError for an unknown name."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        return torch.float32 if quantization == "int8" else _DTYPES[cpu_dtype(cpu_flags())]
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or auto, got {dtype!r}")
    return _DTYPES[dtype]


def auto_dtype_reason(device: torch.device, quantization: str, flags: frozenset[str]) -> str:
    """Why ``resolve_dtype("auto", ...)`` chose what it chose, for the start-up log; ``flags``: the
    CPU's (``linear.cpu.cpu_flags``), unused on CUDA."""
    if device.type == "cuda":
        return "the GPU's dtype: bf16 tensor cores"
    if quantization == "int8":
        return "int8's kernels take fp32 rows"
    found = sorted(BF16_FLAGS & flags)
    if found:
        return f"this CPU has native bf16 dot products: {', '.join(found)}"
    return "this CPU has no native bf16 dot products (avx512_bf16 or amx_bf16); bf16 would run slower"


class PendingResult:
    """A batch's output rows, [B, out_dim] float32, available after ``wait()`` (blocking, no GIL
    held while the CUDA event is pending). Implements ``contract.ResultHandle``."""

    def __init__(self, host: np.ndarray, event: "torch.cuda.Event | None" = None, keepalive: object = None) -> None:
        self._host = host
        self._event = event
        self._keepalive = keepalive  # pinned buffer (and inputs) that must outlive the copy

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self) -> np.ndarray:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host


@dataclass(frozen=True)
class GraphOptions:
    """CUDA-graph settings (ServeConfig's ``enforce_eager``, ``graph_max_tokens``,
    ``capture_buckets``, ``bucket_stats_path``). Ignored on the CPU."""

    enabled: bool = True
    max_tokens: int = GRAPH_MAX_TOKENS  # batches whose bucket has more tokens run eagerly
    max_seqs: int = MAX_BATCH_SEQS  # sequence slots of the largest bucket
    capture: tuple[str, ...] = ()  # "seqs:tokens:max_seqlen" captured at start-up
    stats_path: str | None = None  # bucket-hit histogram: read at start, written at shutdown
    debug: bool = False  # assert static buffers never move

    @classmethod
    def from_config(cls, cfg: ServeConfig) -> "GraphOptions":
        return cls(enabled=not cfg.enforce_eager, max_tokens=cfg.graph_max_tokens, max_seqs=cfg.max_batch_seqs,
                   capture=tuple(cfg.capture_buckets), stats_path=cfg.bucket_stats_path)


class Engine:
    """One model on one device. Raises WeightError/UnsupportedArchitecture/ValueError at
    construction on a bad model.

    ``state``: an in-memory checkpoint (Hugging Face names, tensors on any device) used instead
    of reading ``spec.path``; see ``from_state_dict``. ``graphs``: CUDA-graph options (GPU only).
    ``triton_gemms``: False runs none of the engine's Triton GEMMs (``--no-triton-gemms``: cuBLAS
    throughout); True lets the kernel plan choose them where they were measured (plan.KernelPlan).
    Implements ``contract.StepEngine``.
    """

    inline_step = False  # a step can run a whole forward pass: the replica calls it off its loop

    def __init__(self, spec: ModelSpec, device: str = "auto", dtype: str = "auto", attention: str | None = None,
                 state: dict[str, torch.Tensor] | None = None, graphs: GraphOptions | None = None,
                 spin_wait: bool = False, quantization: str = "none", fp8_min_cosine: float = FP8_MIN_COSINE,
                 triton_gemms: bool = True, int8_min_cosine: float = INT8_MIN_COSINE,
                 int8_kinds: tuple[str, ...] = cpu_plan.INT8_KINDS) -> None:
        t0 = time.perf_counter()
        self.spin_wait = spin_wait
        self.spec = spec
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device, quantization)
        if dtype == "auto":
            log.info("engine: --dtype auto: %s (%s)", str(self.dtype).removeprefix("torch."),
                     auto_dtype_reason(self.device, quantization, cpu_flags() if self.device.type == "cpu" else frozenset()))
        self.attn: AttentionBackend = select_backend(self.device, self.dtype, attention)
        cls = model_class(spec.architecture, spec.task)
        extra = {"yes_no_ids": spec.yes_no_ids} if spec.yes_no_ids is not None else {}
        with torch.device("meta"):
            model = cls(spec.config, self.attn, **extra)
        if state is None:
            state = load_safetensors(spec.path)
        state, self.stored_fp8 = split_fp8_checkpoint(state, spec.config)
        if self.stored_fp8.description:
            log.info("weights: %s; dequantized to %s for steps that run in it%s", self.stored_fp8.description,
                     str(self.dtype).removeprefix("torch."),
                     "" if quantization == "fp8" else " (all of them: add --quantization fp8 to run the fp8 rows)")
        # Instance attributes: what a model skips can depend on its config (tied embeddings).
        self.loaded = assign_weights(model, state, model.IGNORED_KEYS, model.PREFIXES)
        model = model.to(device=self.device, dtype=self.dtype).eval()
        model.fuse()
        self.model = model
        self.profile = profile_of(self.device)
        self.plan = KernelPlan.for_profile(self.profile, triton_gemms)
        assign_methods(model, self.plan)  # every projection's kernel, chosen once
        self.causal = bool(model.causal)
        # layers with different attention windows (Gemma3's sliding / global): a windowed layer can
        # leave padding rows unwritten, so no attention may read a whole padded bucket (AttnMeta.whole_rows)
        self.mixed_windows = len({w for m in model.modules() if isinstance(m, PackedModel) for w in m.layer_windows}) > 1
        cfg = spec.config  # attention's head dim: config's head_dim, else width / heads (DistilBERT: dim / n_heads)
        heads, hidden = cfg.get("num_attention_heads", cfg.get("n_heads")), cfg.get("hidden_size", cfg.get("dim"))
        self.head_dim = int(cfg.get("head_dim") or (hidden // heads if heads and hidden else 0))
        # graphs capture uniform buckets (equal lengths filling the bucket) only where such batches
        # run another attention kernel than ragged ones: cuDNN, as eager steps of equal lengths do
        self.uniform_buckets = isinstance(self.attn, VarlenBackend) and self.head_dim > 0 \
            and self.attn.uniform_kernel(self.head_dim)
        self.pool = pooler(spec.pooling)  # chosen once: the same function on every step
        self.st_head = build_head(spec.head_steps, self.device)  # sentence-transformers Dense layers
        # per-token outputs (step_tokens): bge-m3's sparse and ColBERT heads when the folder has them
        self.token_head: M3Heads | None = None
        if spec.token_heads:
            self.token_head = M3Heads(spec.path, int(spec.config["hidden_size"])).to(self.device).eval()
        self.out_dim = spec.dimension
        # BERT-style models always get token types (zeros = type 0) so one graph serves pairs and
        # single texts alike; models without them (Qwen3) get None.
        self.use_types = "type_vocab_size" in spec.config
        self.graph_options = graphs or GraphOptions()
        self.graphs: GraphManager | None = None
        # spin_wait: the waiting thread spins (GIL released) instead of sleeping until the device
        # interrupts; it wakes sooner at batch 1 and costs one busy core while a batch runs.
        self._events = [torch.cuda.Event(blocking=not spin_wait) for _ in range(RESULT_EVENTS)] \
            if self.device.type == "cuda" else []
        self._next_event = 0
        if self.device.type == "cuda" and self.graph_options.enabled and not self.attn.graph_safe:
            # fp32 on CUDA: length-grouped SDPA sizes its groups on the host, which graph capture
            # forbids (it failed every capture and left the caching allocator broken): eager steps
            log.info("engine: CUDA graphs off: %s attention (%s) cannot be captured", self.attn.name, self.dtype)
        elif self.device.type == "cuda" and self.graph_options.enabled:
            o = self.graph_options
            self.graphs = GraphManager(self._forward_packed, self.device, o.max_tokens, o.max_seqs,
                                       self.use_types, debug=o.debug,
                                       blocks=model.blocks())
        self.quantization = quantization
        if quantization == "int8" and self.device.type != "cpu":
            raise ValueError(f"--quantization int8 runs on the CPU only, not on {self.device}; on a GPU use fp8")
        if quantization == "fp8":
            self._enable_fp8(fp8_min_cosine)
        elif quantization == "int8":
            self.int8_cosine = cpu_plan.quantize_int8(model, self.forward, cpu_plan.probe_batch(
                self.spec.vocab_size, self.spec.max_seq_length), int8_min_cosine, int8_kinds)
        elif quantization != "none":
            raise ValueError(f"quantization must be none, fp8 or int8, got {quantization!r}")
        if self.device.type == "cpu":  # after quantization: the kernels that run
            log.info("engine: CPU linears (model dtype %s): %s", str(self.dtype).removeprefix("torch."),
                     cpu_plan.describe(model))
            log.info("engine: CPU allocator: %s", keep_freed_memory())
        self.stored_fp8.rows.clear()  # the projections hold what they use (on the device)
        self.info = EngineInfo(str(self.device), str(self.dtype).removeprefix("torch."), self.attn.name,
                               self.out_dim, time.perf_counter() - t0)
        log.info("engine: %s on %s (%s), %d tensors loaded in %.2fs", spec.architecture, self.device,
                 self.info.dtype, len(self.loaded), self.info.load_seconds)
        if self.device.type == "cuda":
            for line in self.plan.log_lines():
                log.info("engine: %s", line)

    def _enable_fp8(self, min_cosine: float) -> None:
        """Quantize the layers (quant.enable_fp8), then check the outputs of a probe batch (32
        random-token sequences of 8–128 tokens, fixed seed) in fp8 against bf16: refused with
        ValueError below ``min_cosine`` (FP8_MIN_COSINE; benchmarks pass 0 to time any model), so
        fp8 never serves vectors far from the model's own."""
        n = enable_fp8(self.model, self.device, FP8_MIN_TOKENS, stored=self.stored_fp8)
        batch = cpu_plan.probe_batch(self.spec.vocab_size, self.spec.max_seq_length)  # the same probe as int8's
        with torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext():
            set_fp8_min_tokens(self.model, 0)
            fp8 = self.forward(batch)
            set_fp8_min_tokens(self.model, None)
            ref = self.forward(batch)
            set_fp8_min_tokens(self.model, FP8_MIN_TOKENS)
        cos = output_cosines(fp8, ref)
        dt = str(self.dtype).removeprefix("torch.")  # the model dtype: bfloat16 on the GPU by default, float32 on the CPU
        if not np.isfinite(cos).all() or cos.min() < min_cosine:
            raise ValueError(f"--quantization fp8 is refused for this model: on a probe batch its fp8 outputs reach "
                             f"only {agreement_name(ref.shape[1])} {cos.min():.4f} against its own {dt} outputs (the "
                             f"bar is {min_cosine}); run it without --quantization")
        chosen = fp8_linears(self.model)
        kinds = {p.kind: p for p in chosen}  # one projection per kind: the same settings in every layer
        how = ", ".join(f"{k}: {'scales applied by the next kernel' if p.fp8_method.deferred else 'row-wise scaled GEMM'}"
                        for k, p in kinds.items())
        kept = sum(p.fp8_method.from_checkpoint for p in chosen)
        log.info("quantization: fp8 e4m3 for %d matmuls (%s of every layer, on every step; per-channel weight and "
                 "per-token activation scales; %d with the checkpoint's own fp8 weights, the others quantized at "
                 "load; %s); %s for the other matmuls, embeddings, norms, attention, pooling and heads; probe batch "
                 "%s vs %s min %.5f mean %.5f (bar %s)",
                 n, "+".join(kinds), kept, how, dt, agreement_name(ref.shape[1]), dt, cos.min(), cos.mean(), min_cosine)
        self.fp8_cosine = (float(cos.min()), float(cos.mean()))

    @classmethod
    def from_state_dict(cls, spec: ModelSpec, state: dict[str, torch.Tensor], device: str = "auto",
                        dtype: str = "auto", attention: str | None = None,
                        graphs: GraphOptions | None = None, **options: object) -> "Engine":
        """Build from tensors already in memory (e.g. a transformers model's ``state_dict()`` on
        the GPU: no disk round trip). Tensors already on ``device`` in ``dtype`` are used without
        a copy. Same checks and errors as loading from disk; ``options``: the constructor's other
        keywords (quantization, triton_gemms, …)."""
        return cls(spec, device, dtype, attention, state=state, graphs=graphs, **options)  # type: ignore[arg-type]

    def _forward_packed(self, ids: torch.Tensor, pos: torch.Tensor, tt: torch.Tensor | None, seg: torch.Tensor,
                        cu: torch.Tensor, max_seqlen: int, uniform: bool = False) -> torch.Tensor:
        """Device-only forward: int32 [T] ids/pos/types/segment ids, cu [S+1] → [S, out_dim] float32.
        No host syncs and no data-dependent shapes (CUDA-graph safe with the varlen backend).
        ``uniform``: every sequence is ``max_seqlen`` long (eager batches only; cuDNN attention)."""
        if self.causal and cu.shape[0] == 2 and isinstance(self.attn, VarlenBackend) \
                and not self.attn.triton_takes(self.head_dim) and not self.mixed_windows:
            # one causal sequence + trailing padding: cuDNN over the whole bucket is exact and beats
            # FlashAttention-2 (head dims the Triton kernel does not take; for those it takes,
            # attention.VarlenBackend decides by length)
            uniform, max_seqlen = True, ids.shape[0]
        meta = self.attn.prepare(cu, max_seqlen, self.causal, uniform, whole_rows=not self.mixed_windows)
        hidden = self.model(ids, pos, tt, meta)  # [T, hidden]
        out = self.model.head(self.pool(hidden, seg, cu)).float()
        return out if self.st_head is None else self.st_head(out)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Eager forward of a packed batch → [B, out_dim] float32 on the engine's device. CPU and
        CUDA alike: the graph path's packed int32 inputs (``graphs.pack_inputs``, no padding
        here) through ``_forward_packed``; on the CPU ``.to`` is a no-op."""
        cpu = self.device.type == "cpu"
        # The CPU steps at one of padded_rows' token counts, the padding in the discarded segment as in
        # a graph bucket: its oneDNN kernels keep a primitive per row count, and one pad here costs
        # less than one in each of the model's linears (~5% of a 2,048-token MiniLM step)
        tokens = padded_rows(batch.num_tokens) if cpu else batch.num_tokens
        host = pack_inputs(batch, tokens, batch.num_seqs, pin=not cpu)
        ids, pos, tt, seg, cu = input_views(host.to(self.device, non_blocking=True), tokens, batch.num_seqs)
        uniform = batch.max_seqlen * batch.num_seqs == batch.num_tokens == tokens  # host ints; no padding
        return self._forward_packed(ids, pos, tt if self.use_types else None, seg, cu, batch.max_seqlen, uniform)

    @torch.inference_mode()
    def step_tokens(self, batch: Batch) -> PendingResult:
        """The token outputs of a packed batch, eager (no graphs): [T, 1 + C] float32 for bge-m3
        (``m3_heads.M3Heads``: lexical weight, ColBERT vector), else the last hidden states
        [T, hidden] as float32 (MLM logits for a masked LM)."""
        with torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext():
            host = pack_inputs(batch, batch.num_tokens, batch.num_seqs, pin=self.device.type == "cuda")
            ids, pos, tt, _, cu = input_views(host.to(self.device, non_blocking=True), batch.num_tokens, batch.num_seqs)
            uniform = batch.max_seqlen * batch.num_seqs == batch.num_tokens
            meta = self.attn.prepare(cu, batch.max_seqlen, self.causal, uniform, whole_rows=not self.mixed_windows)
            hidden = self.model(ids, pos, tt if self.use_types else None, meta)  # [T, hidden]
            out = (self.token_head(hidden) if self.token_head is not None else hidden).float()
            if self.device.type != "cuda":
                return PendingResult(out.numpy())
            rows = torch.empty(out.shape, dtype=torch.float32, pin_memory=True)
            rows.copy_(out, non_blocking=True)
            return PendingResult(rows.numpy(), self._record_event(), keepalive=(rows, host, out))

    def replays(self, batch: Batch) -> bool:
        """True when ``step(batch)`` replays an already captured CUDA graph: a small, bounded host
        cost (pack, one H2D copy, replay, D2H copy, event), cheap enough for the server to call on its
        event loop. False on the CPU, with graphs off, and for eager or not yet captured buckets."""
        if self.graphs is None:
            return False
        o = self.graph_options
        bucket = bucket_for(batch.num_seqs, batch.num_tokens, batch.max_seqlen, o.max_tokens, o.max_seqs,
                            self.uniform_buckets)
        return bucket is not None and bucket in self.graphs.lazy.graphs

    @property
    def graph_captures(self) -> int:
        """CUDA graphs captured so far (start-up and lazy captures); 0 without graphs."""
        return 0 if self.graphs is None else len(self.graphs.lazy.graphs)

    @property
    def graph_replays(self) -> int:
        """Batches answered by a CUDA-graph replay so far; 0 without graphs."""
        return 0 if self.graphs is None else self.graphs.replayed

    def step(self, batch: Batch) -> PendingResult:
        """Enqueue a batch; returns at once on CUDA (see the module docstring)."""
        if self.device.type != "cuda":
            return PendingResult(self.forward(batch).numpy())
        # The current CUDA device is per host thread and the server steps from a worker thread:
        # Triton kernels and graph capture would otherwise target cuda:0 for a replica on cuda:1.
        # Entering the device context costs ~6 µs of host time on the H200 host, on batch 1's
        # latency path: skipped where the thread is on this device already.
        if self.device.index is None or torch.cuda.current_device() == self.device.index:
            return self._step_cuda(batch)
        with torch.cuda.device(self.device):
            return self._step_cuda(batch)

    def _step_cuda(self, batch: Batch) -> PendingResult:
        # No inference_mode here: a replay records no autograd (the graph path's host time is
        # batch 1's latency); the eager forward and the captures enter it themselves.
        o = self.graph_options
        bucket = None
        if self.graphs is not None:
            bucket = bucket_for(batch.num_seqs, batch.num_tokens, batch.max_seqlen, o.max_tokens, o.max_seqs,
                                self.uniform_buckets)
        if bucket is not None:
            assert self.graphs is not None
            out = self.graphs.run(bucket, batch)  # [S, D]; the inputs travel in the graph's first node
        else:
            out = self.forward(batch)  # [B, D]
        b = batch.num_seqs
        host = torch.empty((b, out.shape[1]), dtype=torch.float32, pin_memory=True)
        host.copy_(out[:b], non_blocking=True)
        return PendingResult(host.numpy(), self._record_event(), keepalive=(host, out))

    def _record_event(self) -> "torch.cuda.Event":
        # One of a ring of events (creating one costs ~10 µs of host time): re-recording an event
        # that an older, unread handle still holds only makes that handle wait for later work,
        # whose results come after its own in stream order; RESULT_EVENTS exceeds any steps in flight.
        ev = self._events[self._next_event]
        self._next_event = (self._next_event + 1) % RESULT_EVENTS
        ev.record()
        return ev

    def start_graphs(self) -> None:
        """Capture the configured buckets and the hot ones of the saved histogram (start-up)."""
        if self.graphs is None:
            o = self.graph_options
            if o.capture or o.stats_path:
                log.info("engine: no CUDA graphs on %s: --capture-bucket and --bucket-stats are ignored", self.device)
            return
        o = self.graph_options
        texts = list(o.capture) + ([str(b) for b in load_hot(o.stats_path)] if o.stats_path else [])
        wanted = list(dict.fromkeys(b for t in texts for b in startup_buckets(t, self.uniform_buckets)))
        if wanted:
            with torch.inference_mode():
                self.graphs.precapture(wanted)
            log.info("engine: captured %d buckets at start-up: %s", len(wanted), " ".join(map(str, wanted)))

    def shutdown(self) -> None:
        """Save the bucket-hit histogram (when configured) so the next start pre-captures it."""
        if self.graphs is not None and self.graph_options.stats_path:
            self.graphs.lazy.save_stats(self.graph_options.stats_path)
            log.info("engine: bucket histogram saved to %s", self.graph_options.stats_path)

    def warmup(self) -> None:
        """One small batch through the whole path, so /health turns green only on a working model;
        then the small steps' Triton GEMMs compiled for each tile set (eager forwards of
        ``plan.WARM_TOKENS`` tokens) and the large steps' Triton GEMM (``fused_gemms.compile_now``)."""
        n = min(8, self.spec.max_seq_length)
        ids = np.full(n, min(100, self.spec.vocab_size - 1), dtype=np.int32)
        rows = self.step(Batch.pack([ids, ids[:1]])).wait()
        if not np.isfinite(rows).all():
            raise RuntimeError("warm-up produced non-finite outputs; check --dtype and the weights")
        if self.plan.small_gemms or self.plan.split_k:
            # their tiles differ by step length: compile each set now, not in the first such request
            # (eager forwards: no bucket sighting, so the graph histogram stays the requests')
            # Steps pack several sequences, so a model of short sequences meets these lengths too:
            # each warm-up step is as many sequences of at most max_seq_length tokens as it takes
            longest = self.spec.max_seq_length
            with torch.cuda.device(self.device):  # as step(): Triton launches on this replica's GPU
                for t in WARM_TOKENS:
                    full, rest = divmod(t, longest)
                    seqs = [np.resize(ids, longest)] * full + ([np.resize(ids, rest)] if rest else [])
                    self.forward(Batch.pack(seqs))
            torch.cuda.synchronize(self.device)
        if self.plan.gate_up_act:  # every layer's MLP has the same shapes: one compile serves them all
            gated = next((p for p in linears(self.model) if isinstance(p.method, GatedTritonLinear)), None)
            if gated is not None:
                compile_now(gated.weight, gated.gated)
        self.start_graphs()
