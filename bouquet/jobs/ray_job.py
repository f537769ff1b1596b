"""`bouquet embed --ray`: the batch embedding job on a Ray cluster, through Ray Data.

    files ──read tasks (one per file, streaming)──► map_batches(actor pool: one Engine per actor,
    one GPU each) ──► write_parquet

Rows carry the same ids as the in-process job (the id column, or the global row index: file
offsets are counted first), and vectors come from the same engine, tokenizer and packer, so the
output equals `bouquet embed` without --ray up to row order and file names. Unlike the in-process
job it is not resumable shard by shard: a failed run is re-run into an empty folder (Ray retries
failed tasks and restarts failed actors itself).

Ray is an optional dependency (``pip install bouquet[ray]``); this module imports it lazily.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from bouquet.config import batch_token_budget
from bouquet.jobs.embed_job import EmbedJobConfig, JobStats, pipeline_depth
from bouquet.jobs.reader import InputFile, discover, iter_file, resolve_id_column

log = logging.getLogger(__name__)
_READ_ROWS = 1024  # rows per block handed from a read task to the actors


def exact_rows(f: InputFile, text_column: str) -> int:
    """Rows of one file as the reader sees them (Parquet: metadata; others: one streaming pass)."""
    if f.fmt == "parquet":
        return pq.ParquetFile(f.path).metadata.num_rows
    return sum(len(c.texts) for c in iter_file(f, text_column, None, 0))


def _read_file(batch: dict[str, Any], text_column: str, id_column: str | None) -> Iterator[pa.Table]:
    """Ray Data read step: one input file (path, fmt, start offset) → blocks of (id, text)."""
    for path, fmt, start in zip(batch["path"], batch["fmt"], batch["start"]):
        f = InputFile(Path(str(path)), fmt)
        for chunk in iter_file(f, text_column, id_column, int(start)):
            for lo in range(0, len(chunk.texts), _READ_ROWS):
                texts = chunk.texts[lo:lo + _READ_ROWS]
                yield pa.table({"id": chunk.ids.slice(lo, len(texts)), "text": pa.array(texts, pa.string())})


class EmbedActor:
    """Holds one Engine (one GPU, or the CPU) and embeds Arrow batches of (id, text) → (id, vector)."""

    def __init__(self, cfg: EmbedJobConfig, device: str) -> None:
        from bouquet.tokenization import TextTokenizer, resolve_prompt
        from bouquet.modelspec import load_spec

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
        from bouquet.engine.pooling import finalize
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
        return pa.table({"id": batch.column("id"), "vector": vector_array(group.vectors, self.cfg.output_dtype)})


def run_ray_job(cfg: EmbedJobConfig, address: str | None = None, workers: int = 0) -> JobStats:
    """Run the job on Ray: ``address`` None starts a local Ray on this machine.

    ``workers`` engine actors (0 = one per GPU of the cluster, else 2 on CPU). Raises ImportError
    when Ray is missing, ValueError when the output folder is not empty (without --overwrite).
    """
    try:
        import ray
    except ImportError as e:
        raise ImportError("--ray needs Ray Data: pip install 'bouquet[ray]'") from e
    cfg = cfg.validate()
    files = discover(cfg.input, exclude=cfg.output)
    id_column = resolve_id_column(files, cfg.text_column, cfg.id_column)
    out = Path(cfg.output)
    if out.exists() and any(out.iterdir()):
        if not cfg.overwrite:
            raise ValueError(f"output folder {out} is not empty; the Ray job writes into an empty folder (or use --overwrite)")
        shutil.rmtree(out)
    if cfg.format != "parquet":
        raise ValueError("the Ray job writes Parquet only; drop --format npy or --ray")
    starts, pos = [], 0
    for f in files:
        starts.append(pos)
        pos += exact_rows(f, cfg.text_column) if id_column is None else 0

    started_here = not ray.is_initialized()
    if started_here:
        if address is None:
            # Logical CPUs ≥ actors + 1, so read tasks still get scheduled beside CPU actors.
            n = max(os.cpu_count() or 1, max(workers, 2) + 1)
            ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        use_gpu = cfg.device != "cpu" and gpus > 0
        if cfg.device.startswith("cuda") and not use_gpu:
            raise ValueError("--device cuda was requested but the Ray cluster has no GPUs")
        n_workers = workers or (gpus if use_gpu else 2)
        t0 = time.perf_counter()
        items = [{"path": str(f.path.resolve()), "fmt": f.fmt, "start": s} for f, s in zip(files, starts)]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        # Other resources than the actors, so Ray does not fuse reading into them: a big file's
        # blocks then spread over the whole actor pool instead of staying with one actor.
        ds = ds.map_batches(_read_file, batch_size=1, fn_kwargs={"text_column": cfg.text_column, "id_column": id_column},
                            batch_format="numpy", num_cpus=0.5)
        ds = ds.map_batches(
            EmbedActor, fn_constructor_kwargs={"cfg": cfg, "device": "cuda" if use_gpu else "cpu"},
            batch_size=max(cfg.chunk_rows, _READ_ROWS), batch_format="pyarrow", concurrency=n_workers,
            num_gpus=1 if use_gpu else 0, num_cpus=1,
        )
        ds.write_parquet(str(out))
        seconds = time.perf_counter() - t0
    finally:
        if started_here:
            ray.shutdown()
    written = sorted(out.glob("*.parquet"))
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in written)
    return JobStats(rows, 0, seconds, len(written), 0)
