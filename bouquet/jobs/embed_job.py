"""`bouquet embed`: files in, vectors out, streaming and resumable, in one process.

Pipeline (threads, bounded queues, so memory stays bounded whatever the input size)::

    reader thread ──chunks──► tokenizer pool (encode_batch releases the GIL) ──futures, in order──►
    main thread: Packer → engine.step (next batch launched before the previous is awaited) →
    finalize → shard assembly ──► writer thread (Parquet / .npy, atomic rename, manifest)

Shards are fixed ranges of global input rows (``shard_rows`` each), so a re-run after an
interruption skips the shards the manifest lists and rewrites the others identically.

What this module does not own: file formats (reader.py, writer.py), batching (packer.py), model
math (engine/), the Ray variant (ray_job.py).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from bouquet.config import DEVICES, DTYPES, MAX_BATCH_SEQS, QUANTIZATIONS, batch_token_budget
from bouquet.jobs.packer import Group, Packer, run_pipelined
from bouquet.jobs.reader import (InputFile, RowChunk, discover, estimate_rows, fingerprint, read_chunks,
                                 resolve_id_column)
from bouquet.jobs.writer import Manifest, OutputFormat, ShardWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbedJobConfig:
    """Everything one `bouquet embed` run needs. Units: rows, tokens. ``validate`` raises
    ValueError naming the offending value."""

    input: str
    output: str
    model: str | None = None  # None = the embedded all-MiniLM-L6-v2
    text_column: str = "text"
    id_column: str | None = None  # None = 'id' when present, else the global row index
    format: OutputFormat = "parquet"
    dtype: str = "auto"  # compute dtype: auto (bf16 GPU, fp32 CPU) | float32 | float16 | bfloat16
    output_dtype: str = "float32"  # float32 | float16
    quantization: str = "none"  # none | fp8 | int8 (engine/linear/fp8.py, engine/linear/cpu.py; ServeConfig.quantization)
    triton_gemms: bool = True  # ServeConfig.triton_gemms: the engine's Triton GEMMs on Hopper (False: none)
    device: str = "auto"
    max_batch_tokens: int = 0  # 0 = auto, as the server (config.batch_token_budget)
    max_batch_seqs: int = MAX_BATCH_SEQS
    shard_rows: int = 10_000  # input rows per output shard (the unit of resumption)
    chunk_rows: int = 1024  # rows per tokenizer call
    tokenizer_threads: int = 0  # Python threads calling the tokenizer (0 = auto, see tokenizer_threads())
    threads: int = 0  # CPU engine: torch intra-op threads (0 = auto: half the cores, at least 1)
    prompt: str | None = None  # prefixed to every text (instruction models); None = model default
    overwrite: bool = False  # start afresh even if the output folder holds another job
    progress: bool = True

    def validate(self) -> "EmbedJobConfig":
        if self.format not in ("parquet", "npy"):
            raise ValueError(f"--format must be parquet or npy, got {self.format!r}")
        if self.output_dtype not in ("float32", "float16"):
            raise ValueError(f"--output-dtype must be float32 or float16, got {self.output_dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"--quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.dtype not in DTYPES:  # as `serve` words it (the engine's own check names no flag)
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        # Checked here, not by torch: torch.device("gpu") raised a RuntimeError with a traceback.
        kind, colon, index = self.device.partition(":")
        if kind not in DEVICES or (colon and (kind != "cuda" or not index.isdigit())):
            raise ValueError(f"--device must be one of {', '.join(DEVICES)} (or cuda:N), got {self.device!r}")
        for name in ("threads", "tokenizer_threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be ≥ 0 (0 = auto), got {getattr(self, name)}")
        for name in ("shard_rows", "chunk_rows", "max_batch_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.max_batch_tokens < 0:
            raise ValueError(f"--max-batch-tokens must be ≥ 0 (0 = auto), got {self.max_batch_tokens}")
        return self


@dataclass(frozen=True)
class JobStats:
    rows: int  # rows embedded by this run (skipped shards excluded)
    tokens: int
    seconds: float  # wall time of the pipeline, model loading excluded
    shards_written: int
    shards_skipped: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class _Tokenized:
    chunk: RowChunk
    seqs: list[np.ndarray]


def pipeline_depth(device_type: str) -> int:
    """Batches kept in flight besides the newest: on CUDA two, so the device still has queued work
    when the launching thread is descheduled by tokenization; on the CPU steps are synchronous."""
    return 2 if device_type == "cuda" else 0


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; a container's cpuset, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2


def cpu_threads(requested: int) -> int:
    """Torch intra-op threads for a CPU engine that shares the machine with tokenizer threads.

    OpenMP workers spin at barriers; when tokenization takes a core they stall each other, and on
    2 cores one torch thread runs the whole job ~6x faster than two (measured on the CI shape)."""
    return requested or max(1, usable_cores() // 2)


def tokenizer_threads(requested: int) -> int:
    """Python threads calling ``encode_batch``: ``requested``, or (0) two.

    Each call already fans out over all cores in Rust (rayon); the Python threads only keep that
    pool fed while one of them turns ids into arrays under the GIL, so two suffice, and more slow
    the job down. Measured: on 2 cores, 1-2 threads ≈ 930 rows/s, 4 threads 514; on an H200 host
    (16 cores, bge-base, 100,000 mixed rows) job/engine 0.928 with 2 threads, 0.896 with 4,
    0.774 with 8, 0.666 with 16 (6603f18:bench/results/h200-2026-11-30/)."""
    return requested or 2


def reserve_cores_for_engine(reserved: int = 2) -> None:
    """Size the tokenizer's Rust thread pool (rayon) to the usable cores minus ``reserved``, unless
    RAYON_NUM_THREADS is already set. Call before the first tokenization: rayon reads it once.

    Why: with one rayon thread per core, the thread that launches GPU work is preempted by
    tokenization and the device idles. Measured on an H200 host (16 cores), 100,000 mixed rows:
    tokenization alone ran at 1.4x the engine's rate, yet the job reached only 0.67-0.79 of it."""
    if "RAYON_NUM_THREADS" not in os.environ and usable_cores() > reserved + 1:
        os.environ["RAYON_NUM_THREADS"] = str(usable_cores() - reserved)


def build_job_engine(spec: Any, device: str, dtype: str, max_batch_tokens: int, max_batch_seqs: int,
                     quantization: str = "none", triton_gemms: bool = True) -> Any:
    """The engine a job runs on. On CUDA every batch up to the job's token budget is a CUDA-graph
    replay (so is the server's by default, whose budget and graph limit are both 16,384 tokens,
    but a job's budget may be larger): a job's batches are all near the budget,
    so a few buckets cover them, and a replay costs the launching thread microseconds instead of
    the ~100 kernel launches of an eager step, while tokenization keeps every other core busy."""
    from bouquet.engine.runtime.engine import Engine, GraphOptions, resolve_device

    dev = resolve_device(device)
    budget = batch_token_budget(max_batch_tokens, dev.type, spec.max_seq_length)
    return Engine(spec, device, dtype, graphs=GraphOptions(max_tokens=budget, max_seqs=max_batch_seqs),
                  quantization=quantization, triton_gemms=triton_gemms)


class _Producer(threading.Thread):
    """Reads chunks and submits them to the tokenizer pool; puts the futures, in input order, on a
    bounded queue (None at the end, or the exception that stopped it)."""

    def __init__(self, chunks: Iterator[RowChunk], tokenize: Any, threads: int, stop: threading.Event) -> None:
        super().__init__(name="embed-reader", daemon=True)
        self.chunks, self.tokenize, self.stop = chunks, tokenize, stop
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="embed-tok")
        self.out: queue.Queue[Future[_Tokenized] | BaseException | None] = queue.Queue(maxsize=2 * threads + 1)

    def _put(self, item: Future[_Tokenized] | BaseException | None) -> bool:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        handed_over = False
        try:
            for chunk in self.chunks:
                if not self._put(self.pool.submit(self.tokenize, chunk)):
                    return
            handed_over = self._put(None)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which re-raises
            handed_over = self._put(e)
        finally:
            # At the end of the input, or at a bad row, the queued futures are still to be consumed
            # (the rows before a bad row finish their shards): cancelling them would fail the job
            # whenever tokenization, not the engine, is the bottleneck. Only a job the main thread
            # aborted (an engine error, Ctrl-C) drops the work not yet started.
            self.pool.shutdown(wait=False, cancel_futures=not handed_over)


def job_settings(cfg: EmbedJobConfig, spec: Any, files: list[InputFile], id_column: str | None, compute_dtype: str,
                 prompt: str) -> dict[str, Any]:
    """What a resumed job must share with the run that wrote the folder (the manifest's settings);
    the same for the in-process and the Ray job, so either resumes the other."""
    return {
        "model": str(spec.path), "text_column": cfg.text_column, "id_column": id_column, "format": cfg.format,
        "output_dtype": cfg.output_dtype, "compute_dtype": compute_dtype, "quantization": cfg.quantization, "shard_rows": cfg.shard_rows,
        "prompt": prompt, "normalize": spec.normalize, "dimension": spec.dimension, "input": fingerprint(files),
    }


def start_output(cfg: EmbedJobConfig, manifest: Manifest) -> ShardWriter:
    """Create the output folder and the manifest (before any shard, so an --overwrite that is
    interrupted leaves no stale list of done shards); with --overwrite, drop the old shards."""
    out_dir = Path(cfg.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest.save()
    if cfg.overwrite:
        for old in out_dir.glob("part-*"):
            old.unlink()
    return ShardWriter(out_dir, cfg.format, cfg.output_dtype, manifest)


class WriterThread(threading.Thread):
    """Writes finished shards off the main thread (compression costs CPU); keeps the first error."""

    def __init__(self, writer: ShardWriter) -> None:
        super().__init__(name="embed-writer", daemon=True)
        self.writer = writer
        self.inbox: queue.Queue[tuple[int, pa.Array, np.ndarray] | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.written = 0

    def run(self) -> None:
        while (item := self.inbox.get()) is not None:
            if self.error is None:
                try:
                    self.writer.write(*item)
                    self.written += 1
                except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
                    self.error = e

    def submit(self, shard: int, ids: pa.Array, vectors: np.ndarray) -> None:
        if self.error is not None:
            raise self.error
        self.inbox.put((shard, ids, vectors))


def run_embed_job(cfg: EmbedJobConfig, engine: Any = None) -> JobStats:
    """Run the job to completion (or resume it). ``engine`` may be passed in (benchmarks reuse one).

    Raises InputError (bad input), ResumeError (output holds another job), ModelError, ValueError.
    """
    import torch

    from bouquet.engine.runtime.engine import resolve_device, resolve_dtype
    from bouquet.engine.heads.pooling import finalize
    from bouquet.modelspec import load_spec, resolve_prompt
    from bouquet.tokenization import TextTokenizer

    cfg = cfg.validate()
    spec = load_spec(cfg.model) if engine is None else engine.spec
    if spec.task != "embed":
        raise ValueError(f"{spec.model_id} is a scoring model; `bouquet embed` needs an embedding model")
    files = discover(cfg.input, exclude=cfg.output)
    id_column = resolve_id_column(files, cfg.text_column, cfg.id_column)
    device = engine.device if engine is not None else resolve_device(cfg.device)
    compute_dtype = str(engine.dtype if engine is not None else resolve_dtype(cfg.dtype, device, cfg.quantization)).removeprefix("torch.")
    prompt = resolve_prompt(spec, cfg.prompt)
    out_dir = Path(cfg.output)
    manifest = Manifest.open(out_dir, job_settings(cfg, spec, files, id_column, compute_dtype, prompt), cfg.overwrite)
    skipped = len(manifest.done)
    if manifest.complete:
        log.info("embed: %s is already complete (%d shards); nothing to do", out_dir, skipped)
        return JobStats(0, 0, 0.0, 0, skipped)
    if engine is None:  # loaded only when there is work left, and before anything is written: a model
        # the engine refuses (fp8 probe, device) leaves the output folder as it was
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads(cfg.threads))  # process-wide: this job owns its process
        engine = build_job_engine(spec, cfg.device, cfg.dtype, cfg.max_batch_tokens, cfg.max_batch_seqs, cfg.quantization,
                                  cfg.triton_gemms)
        engine.warmup()
    writer = start_output(cfg, manifest)
    budget = batch_token_budget(cfg.max_batch_tokens, engine.device.type, spec.max_seq_length)
    tokenizer = TextTokenizer(spec)

    def tokenize(chunk: RowChunk) -> _Tokenized:
        texts = [prompt + t for t in chunk.texts] if prompt else chunk.texts
        return _Tokenized(chunk, tokenizer.encode(texts, truncate=True).ids)

    stop = threading.Event()
    chunks = read_chunks(files, cfg.text_column, id_column, min(cfg.chunk_rows, cfg.shard_rows), cfg.shard_rows,
                         frozenset(manifest.done))
    producer = _Producer(chunks, tokenize, tokenizer_threads(cfg.tokenizer_threads), stop)
    writer_thread = WriterThread(writer)
    total = estimate_rows(files) if cfg.progress else None
    bar = progress_bar(total, sum(manifest.done.values()), cfg.progress)
    assembler = ShardAssembler(cfg.shard_rows, writer_thread)
    packer = Packer(budget, cfg.max_batch_seqs, tokenizer.prompt_skip(prompt))
    open_groups: list[Group] = []
    t0 = time.perf_counter()
    rows = tokens = 0

    def batches() -> Iterator[Any]:
        eof, error = False, None
        while True:
            while not eof and packer.pending_tokens < budget:
                item = producer.out.get()
                if item is None:
                    eof = True
                elif isinstance(item, BaseException):  # raised once the rows read before it are embedded
                    eof, error = True, item
                else:
                    tok = item.result()
                    group = Group(tok.seqs, tok.chunk, spec.dimension)
                    open_groups.append(group)
                    packer.add(group)
            if not packer:
                if error is not None:
                    raise error
                return
            yield packer.take()

    producer.start()
    writer_thread.start()
    try:
        post = lambda r: finalize(r, spec.normalize, None)  # noqa: E731
        depth = pipeline_depth(engine.device.type)
        for n, t in run_pipelined(engine, batches(), post, depth):
            rows, tokens = rows + n, tokens + t
            done = 0
            while done < len(open_groups) and open_groups[done].filled == open_groups[done].rows:
                chunk = open_groups[done].owner
                assembler.add(chunk.start, chunk.ids, open_groups[done].vectors)
                done += 1
            del open_groups[:done]
            bar.update(n)
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - t0, 1e-9):,.0f} tok/s", refresh=False)
        assembler.flush()
    finally:
        stop.set()
        writer_thread.inbox.put(None)
        writer_thread.join()
        bar.close()
    if writer_thread.error is not None:
        raise writer_thread.error
    writer.finish()
    stats = JobStats(rows, tokens, time.perf_counter() - t0, writer_thread.written, skipped)
    log.info("embed: %s", asdict(stats))
    return stats


class ShardAssembler:
    """Collects finished rows (in input order) into shards and submits each complete shard."""

    def __init__(self, shard_rows: int, sink: WriterThread) -> None:
        self.shard_rows, self.sink = shard_rows, sink
        self.shard = -1
        self.ids: list[pa.Array] = []
        self.vectors: list[np.ndarray] = []
        self.rows = 0

    def add(self, start: int, ids: pa.Array, vectors: np.ndarray) -> None:
        """Rows [start, start + n) of the input: ids [n], vectors [n, D]; within one shard."""
        shard = start // self.shard_rows
        if shard != self.shard:
            self.flush()
            self.shard = shard
        self.ids.append(ids)
        self.vectors.append(vectors)
        self.rows += len(ids)
        if self.rows == self.shard_rows:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            ids = pa.concat_arrays(self.ids) if len(self.ids) > 1 else self.ids[0]
            self.sink.submit(self.shard, ids, np.concatenate(self.vectors))
        self.ids, self.vectors, self.rows = [], [], 0


def progress_bar(total: int | None, initial: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="rows", unit_scale=False, disable=not enabled,
                dynamic_ncols=True, mininterval=0.5, smoothing=0.1)
