"""`bouquet embed --ray`: the batch embedding job on a Ray cluster, through Ray Data.

    files ──read tasks (one per file, streaming, rows of finished shards skipped)──►
    map_batches(actor pool: one Engine per actor, one GPU each) ──in input order──►
    this process: the in-process job's shard assembly, ShardWriter and manifest

The output folder is the in-process job's, file for file: the same shards (``part-NNNNN``), the
same ``_manifest.json`` with the same settings, so a run interrupted on either path is resumed by
either, finished shards are skipped, and a finished job run again does nothing. Ray Data keeps the
actors' output in input order (``preserve_order``); the vectors come back to this process, which
writes them (one writer thread: about 55,000 rows/s at D=768 float32, the cost of the identical
layout). Ray retries failed tasks and restarts failed actors itself.

Ray is an optional dependency (``pip install bouquet[ray]``); this module imports it lazily.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bouquet.config import batch_token_budget
from bouquet.jobs.embed_job import (EmbedJobConfig, JobStats, ShardAssembler, WriterThread, job_settings, progress_bar,
                                    pipeline_depth, start_output)
from bouquet.jobs.reader import InputError, InputFile, discover, iter_file, read_chunks, resolve_id_column
from bouquet.jobs.writer import Manifest

log = logging.getLogger(__name__)
_READ_ROWS = 1024  # rows per block handed from a read task to the actors


def exact_rows(f: InputFile, text_column: str, id_column: str | None) -> int:
    """Rows of one file as the reader sees them: one streaming pass over its columns, which also
    stops a bad row here, as one line naming its file and line, before the pipeline starts (a read
    task's error would come back inside Ray's traceback and log lines)."""
    return sum(len(c.texts) for c in iter_file(f, text_column, id_column, 0))


def _read_file(batch: dict[str, Any], text_column: str, id_column: str | None, shard_rows: int,
               skip: list[int]) -> Iterator[pa.Table]:
    """Ray Data read step: one input file (path, fmt, global start row) → blocks of (row, id, text),
    ``row`` the global index, rows of the shards in ``skip`` left out."""
    for path, fmt, start in zip(batch["path"], batch["fmt"], batch["start"]):
        f = InputFile(Path(str(path)), fmt)
        for chunk in read_chunks([f], text_column, id_column, _READ_ROWS, shard_rows, frozenset(skip), int(start)):
            yield pa.table({"row": pa.array(range(chunk.start, chunk.end), pa.int64()), "id": chunk.ids,
                            "text": pa.array(chunk.texts, pa.string())})


class EmbedActor:
    """Holds one Engine (one GPU, or the CPU) and embeds Arrow batches of (row, id, text) →
    (row, id, tokens, vector)."""

    def __init__(self, cfg: EmbedJobConfig, device: str) -> None:
        from bouquet.modelspec import load_spec, resolve_prompt
        from bouquet.tokenization import TextTokenizer

        import torch

        from bouquet.jobs.embed_job import build_job_engine, cpu_threads

        spec = load_spec(cfg.model)
        if device == "cpu":
            torch.set_num_threads(cpu_threads(cfg.threads))
        self.engine = build_job_engine(spec, device, cfg.dtype, cfg.max_batch_tokens, cfg.max_batch_seqs, cfg.quantization,
                                       cfg.triton_gemms)
        self.engine.warmup()
        self.spec, self.cfg = spec, cfg
        self.tokenizer = TextTokenizer(spec)
        self.prompt = resolve_prompt(spec, cfg.prompt)
        self.budget = batch_token_budget(cfg.max_batch_tokens, self.engine.device.type, spec.max_seq_length)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from bouquet.engine.heads.pooling import finalize
        from bouquet.jobs.packer import Group, Packer, drain, run_pipelined
        from bouquet.jobs.writer import vector_array

        texts = batch.column("text").to_pylist()
        if self.prompt:
            texts = [self.prompt + t for t in texts]
        group = Group(self.tokenizer.encode(texts, truncate=True).ids, None, self.spec.dimension)
        packer = Packer(self.budget, self.cfg.max_batch_seqs, self.tokenizer.prompt_skip(self.prompt))
        packer.add(group)
        depth = pipeline_depth(self.engine.device.type)
        for _ in run_pipelined(self.engine, drain(packer), lambda r: finalize(r, self.spec.normalize, None), depth):
            pass
        return pa.table({"row": batch.column("row"), "id": batch.column("id"), "tokens": np.diff(group.cum),
                         "vector": vector_array(group.vectors, self.cfg.output_dtype)})


def _ray_error(e: BaseException) -> InputError | None:
    """The InputError a read task raised, if ``e`` (Ray's wrapper of a task's exception) carries one."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e) is InputError:  # Ray's wrapper subclasses the cause's type but prints a traceback
            return e
        e = getattr(e, "cause", None) or e.__cause__
    return None


def run_ray_job(cfg: EmbedJobConfig, address: str | None = None, workers: int = 0) -> JobStats:
    """Run (or resume) the job on Ray: ``address`` None starts a local Ray on this machine.

    ``workers`` engine actors (0 = one per GPU of the cluster, else 2 on CPU). Raises ImportError
    when Ray is missing; InputError, ResumeError, ValueError as the in-process job does.
    """
    try:
        import ray
    except ImportError as e:
        raise ImportError("--ray needs Ray Data: pip install 'bouquet[ray]'") from e
    from bouquet.engine.runtime.engine import resolve_dtype
    from bouquet.modelspec import load_spec, resolve_prompt

    import torch

    cfg = cfg.validate()
    spec = load_spec(cfg.model)
    if spec.task != "embed":
        raise ValueError(f"{spec.model_id} is a scoring model; `bouquet embed` needs an embedding model")
    files = discover(cfg.input, exclude=cfg.output)
    id_column = resolve_id_column(files, cfg.text_column, cfg.id_column)
    started_here = not ray.is_initialized()

    def init() -> None:
        if started_here and not ray.is_initialized():
            if address is None:
                # Logical CPUs ≥ actors + 1, so read tasks still get scheduled beside CPU actors.
                n = max(os.cpu_count() or 1, max(workers, 2) + 1)
                ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)

    try:
        use_gpu = False
        if cfg.device != "cpu":  # the device decides the compute dtype, which the manifest records
            init()
            gpus = int(ray.cluster_resources().get("GPU", 0))
            use_gpu = gpus > 0
            if cfg.device.startswith("cuda") and not use_gpu:
                raise ValueError("--device cuda was requested but the Ray cluster has no GPUs")
        device = "cuda" if use_gpu else "cpu"
        compute_dtype = str(resolve_dtype(cfg.dtype, torch.device(device), cfg.quantization)).removeprefix("torch.")
        prompt = resolve_prompt(spec, cfg.prompt)
        manifest = Manifest.open(Path(cfg.output), job_settings(cfg, spec, files, id_column, compute_dtype, prompt),
                                 cfg.overwrite)
        skipped = len(manifest.done)
        if manifest.complete:
            log.info("embed: %s is already complete (%d shards); nothing to do", cfg.output, skipped)
            return JobStats(0, 0, 0.0, 0, skipped)
        starts, pos = [], 0
        for f in files:  # global row offsets: shards are ranges of global rows, as in the in-process job
            starts.append(pos)
            pos += exact_rows(f, cfg.text_column, id_column)
        init()
        n_workers = workers or (int(ray.cluster_resources().get("GPU", 0)) if use_gpu else 2)
        return _run(ray, cfg, files, starts, pos, id_column, manifest, device, n_workers)
    except Exception as e:  # noqa: BLE001 - a read task's InputError arrives wrapped by Ray
        if (inner := _ray_error(e)) is not None and inner is not e:
            raise inner from None
        raise
    finally:
        if started_here and ray.is_initialized():
            ray.shutdown()


def _run(ray: Any, cfg: EmbedJobConfig, files: list[InputFile], starts: list[int], total: int,
         id_column: str | None, manifest: Manifest, device: str, n_workers: int) -> JobStats:
    """The Ray Data pipeline, its output written here in input order."""
    skipped, S = len(manifest.done), cfg.shard_rows
    ends = starts[1:] + [total]
    items = [{"path": str(f.path.resolve()), "fmt": f.fmt, "start": s} for f, s, e in zip(files, starts, ends)
             if e > s and any(k not in manifest.done for k in range(s // S, (e - 1) // S + 1))]
    blocks: Iterator[pa.Table] = iter(())
    t0 = time.perf_counter()
    if items:
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        # Other resources than the actors, so Ray does not fuse reading into them: a big file's
        # blocks then spread over the whole actor pool instead of staying with one actor.
        ds = ds.map_batches(_read_file, batch_size=1, batch_format="numpy", num_cpus=0.5,
                            fn_kwargs={"text_column": cfg.text_column, "id_column": id_column, "shard_rows": S,
                                       "skip": sorted(manifest.done)})
        ds = ds.map_batches(
            EmbedActor, fn_constructor_kwargs={"cfg": cfg, "device": device},
            batch_size=max(cfg.chunk_rows, _READ_ROWS), batch_format="pyarrow", concurrency=n_workers,
            num_gpus=1 if device == "cuda" else 0, num_cpus=1,
        )
        blocks = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
    # The actors load the model before the first block comes back: a model they refuse leaves the
    # output folder as it was, as in the in-process job.
    first = next(blocks, None)
    writer_thread = WriterThread(start_output(cfg, manifest))
    assembler = ShardAssembler(S, writer_thread)
    bar = progress_bar(total, sum(manifest.done.values()), cfg.progress)
    rows = tokens = 0
    writer_thread.start()
    try:
        for block in itertools.chain([first] if first is not None else [], blocks):
            row = block.column("row").to_numpy()
            col = block.column("vector").combine_chunks()
            vectors = col.flatten().to_numpy(zero_copy_only=False).reshape(len(row), col.type.list_size)
            ids = block.column("id").combine_chunks()
            ids = ids.cast(pa.string()) if pa.types.is_large_string(ids.type) else ids
            # Cut where a shard ends (or rows of skipped shards were left out between).
            cuts = np.flatnonzero((np.diff(row // S) != 0) | (np.diff(row) != 1)) + 1
            for lo, hi in zip([0, *cuts], [*cuts, len(row)]):
                assembler.add(int(row[lo]), ids.slice(lo, hi - lo), vectors[lo:hi])
            rows, tokens = rows + len(row), tokens + int(pc.sum(block.column("tokens")).as_py() or 0)
            bar.update(len(row))
        assembler.flush()
    finally:
        writer_thread.inbox.put(None)
        writer_thread.join()
        bar.close()
    if writer_thread.error is not None:
        raise writer_thread.error
    writer_thread.writer.finish()
    return JobStats(rows, tokens, time.perf_counter() - t0, writer_thread.written, skipped)
