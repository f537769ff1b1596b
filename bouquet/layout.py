"""The process layout of `bouquet serve` when the flags leave it open: how many gateway worker
processes, replica processes per GPU and tokenizer threads per worker, sized to the machine.

``choose_layout`` is a pure function of the machine's facts (CPU cores, GPUs, memory) and the
model's size; ``machine_facts`` and ``model_parameters`` read those facts without importing torch
or touching a GPU. Explicit flags always win. The launcher resolves the layout once, logs it, and
passes concrete numbers down in the config (the gateway's ``/info`` reports them).

What it does not own: which GPUs are used (``--gpus``; by default one, as the replica's ``auto``
device picks), the token budget (``config.batch_token_budget``).

Why these numbers (measured on an H200 host with 16 cores, docs/decisions.md 2026-12-04):
- A GPU replica keeps about two cores busy (its event loop with the IPC front end, and the thread
  that spins on the CUDA event); the gateway workers get the rest. Below that the engine starves.
- Small models (MiniLM, bge-base: at most ``SMALL_MODEL_PARAMS``) are host-bound at the rates of
  online queries: a second replica process per GPU adds a second Python host loop (64 clients:
  MiniLM 15,644 → 19,435 req/s, bge-base 10,368 → 17,770). Larger models are GPU-bound, and a
  second replica would only hold a second copy of the weights and graphs in GPU memory.
- Bulk work on a GPU's two replicas: for models above ``HOST_BOUND_BULK_PARAMS`` batch-priority
  chunks go to one of them and the other stays free for interactive requests (bge-base, 100 × 512
  tokens: 4,888 emb/s, against 4,640 spread over both; mixed lengths 9,667 vs 8,359); smaller
  models spread them over both (MiniLM, 100 × 256: 32,912 spread, 26,861 on one). With several
  models the layout is sized by the largest, and this is decided per model (launcher.serve).
- On the CPU the model itself takes every core; one gateway worker per eight cores keeps up.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

SMALL_MODEL_PARAMS = 200_000_000  # at most this many parameters: two replicas per GPU when cores allow
# Above this many parameters, replicas sharing a GPU leave batch work to one of them: a bulk step
# then keeps the GPU busy and two replicas only time-slice it; below, a bulk step is host-bound and
# both replicas' host loops help (docs/decisions.md, 2026-12-05).
HOST_BOUND_BULK_PARAMS = 50_000_000
CORES_PER_GPU_REPLICA = 2  # host cores one GPU replica keeps busy (event loop + spinning wait thread)
CORES_PER_CPU_WORKER = 8  # CPU device: one gateway worker per this many cores
MAX_TOKENIZER_THREADS = 8  # per gateway worker: the most shards one request's text is cut into (decisions 2026-12-05)
GATEWAY_WORKER_BYTES = 512 * 2**20  # memory budgeted per gateway worker (app, tokenizer, buffers)
MAX_GATEWAY_WORKERS = 32


@dataclass(frozen=True)
class Machine:
    """What the layout depends on. ``gpus``: GPUs this model's replicas use (0 = CPU replicas)."""

    cpus: int  # cores this process may run on (sched_getaffinity)
    gpus: int
    memory_bytes: int  # physical memory (0 = unknown: not limiting)
    local_replicas: bool = True  # False with --server: the replicas run elsewhere


@dataclass(frozen=True)
class Layout:
    gateway_workers: int
    replicas_per_gpu: int  # GPU replicas per GPU; on the CPU it multiplies --replicas (1 unless given)
    tokenizer_threads: int  # per gateway worker
    reason: str  # one line for the start-up log and /info
    batch_one_replica_per_gpu: bool = False  # batch-priority chunks go to one replica of each GPU (for the largest model)

    @property
    def tokenization_workers(self) -> int:
        """Threads that can tokenize at once, over all gateway workers (TEI's ``/info`` field)."""
        return self.gateway_workers * self.tokenizer_threads


def choose_layout(machine: Machine, parameters: int, gateway_workers: int = 0, replicas_per_gpu: int = 0,
                  tokenizer_threads: int = 0, models: int = 1) -> Layout:
    """The layout for ``machine`` and ``models`` served models of at most ``parameters`` weights
    each (each model has its own replicas); a non-zero argument is an explicit flag and is kept as
    given. Never returns a count below 1."""
    cpus = max(1, machine.cpus)
    if not machine.local_replicas:
        rpg, busy = max(1, replicas_per_gpu), 0
        why = "remote replicas: every core to the gateway"
    elif machine.gpus > 0:
        small = parameters <= SMALL_MODEL_PARAMS
        fits_two = cpus >= 2 * CORES_PER_GPU_REPLICA * machine.gpus * models + 4  # and >= 4 workers left
        rpg = replicas_per_gpu or (2 if small and fits_two else 1)
        busy = CORES_PER_GPU_REPLICA * rpg * machine.gpus * models
        why = (f"{parameters / 1e6:.0f}M parameters ({'small: host-bound' if small else 'GPU-bound'}), "
               f"{CORES_PER_GPU_REPLICA} cores per GPU replica")
    else:
        rpg = max(1, replicas_per_gpu)
        busy = cpus  # the model's threads take every core
        why = f"CPU replicas use every core; one gateway worker per {CORES_PER_CPU_WORKER} cores"
    if gateway_workers:
        workers = gateway_workers
    elif machine.local_replicas and machine.gpus == 0:
        workers = max(1, cpus // CORES_PER_CPU_WORKER)
    else:
        workers = max(1, cpus - busy)
        if machine.memory_bytes:
            workers = min(workers, max(1, machine.memory_bytes // 2 // GATEWAY_WORKER_BYTES))
        workers = min(workers, MAX_GATEWAY_WORKERS)
    # A large request (a 100-document rerank) is cut into one shard per tokenizer thread
    # (gateway/core.py run_sharded): threads past cores/workers let a lone one use the cores the
    # other workers leave idle; under load they only queue for the same cores.
    free = cpus // workers if machine.local_replicas and machine.gpus == 0 else cpus - busy
    threads = tokenizer_threads or max(1, min(MAX_TOKENIZER_THREADS, free))
    where = (f"{machine.gpus} GPU(s)" if machine.gpus else "CPU") if machine.local_replicas else "remote replicas"
    one_for_batch = bool(machine.local_replicas and machine.gpus and rpg > 1 and parameters > HOST_BOUND_BULK_PARAMS)
    reason = (f"{cpus} cores, {where}: {workers} gateway worker(s) × {threads} tokenizer thread(s), "
              f"{rpg} replica(s) per {'GPU' if machine.gpus else 'device'} ({why})"
              + (", batch work on one replica per GPU" if one_for_batch else "")
              # several models: the largest decides the line; each model's own size decides (launcher.serve)
              + (f" for models over {HOST_BOUND_BULK_PARAMS / 1e6:.0f}M parameters" if one_for_batch and models > 1 else ""))
    given = [f for f, v in (("--gateway-workers", gateway_workers), ("--replicas-per-gpu", replicas_per_gpu),
                            ("--tokenizer-threads", tokenizer_threads)) if v]
    if given:
        reason += "; as given: " + ", ".join(given)
    return Layout(workers, rpg, threads, reason, one_for_batch)


def visible_gpus(environ: dict[str, str] | None = None, proc: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """NVIDIA GPUs this process may use, without initialising CUDA: ``CUDA_VISIBLE_DEVICES`` when
    set (empty or "-1" = none), else the driver's per-GPU folders. 0 when neither says any."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = [x for x in env["CUDA_VISIBLE_DEVICES"].split(",") if x.strip()]
        return 0 if not ids or ids[0].strip() == "-1" else len(ids)
    try:
        return sum(1 for _ in proc.iterdir())
    except OSError:
        return 0


def machine_facts(device: str, gpus: tuple[int, ...], remote: bool) -> Machine:
    """This host's Machine for a deployment on ``device`` ("auto" | "cpu" | "cuda"), ``--gpus``
    and ``--server`` (``remote``). ``device`` auto with no GPU visible is the CPU, as the replica's
    own choice is; auto or cuda with GPUs visible and no ``--gpus`` uses one, as the replica does."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    if gpus:
        n = len(gpus)
    elif device == "cpu":
        n = 0
    else:
        n = min(1, visible_gpus())
    return Machine(cpus=cpus, gpus=n, memory_bytes=memory, local_replicas=not remote)


def model_parameters(model_dir: Path) -> int:
    """Weights in ``model_dir``'s safetensors files (read from their headers: 8 bytes of length,
    then JSON of shapes); 0 when it has none (pickled weights, or the no-op engine's bare spec)."""
    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            continue
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for d in entry.get("shape", []):
                    count *= int(d)
                total += count
    return total
