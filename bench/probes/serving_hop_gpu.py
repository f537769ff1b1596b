"""Where a batch-1 request's time goes between a gRPC client and the engine (GPU).

For one shape and one length, sequential requests, p50 in ms:
  * ``engine``: ``Engine.step(batch).wait()`` in this process (the floor);
  * ``grpc-info``: the ``Info`` RPC of a real replica: gRPC's own round trip, no engine work;
  * ``grpc-embed``: ``Embed`` on that replica; ``server step`` = the replica's mean launch → rows
    time for those calls (from ``Info``'s step counters);
  * ``noop-embed``: ``Embed`` on a replica with ``--engine noop`` (everything but the model).

Usage (GPU): python3 bench/probes/serving_hop_gpu.py OUT_JSON [--shape bge-base] [--length 128] [-n 600]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bouquet.bench.meta import source_commit  # noqa: E402


def p50(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    for _ in range(50):
        fn()
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1e3)
    return round(float(np.percentile(xs, 50)), 4)


def replica(model_dir: Path, seqs: list[np.ndarray], n: int, engine: str, device: str) -> dict:
    from bouquet.bench.targets import GrpcTarget, ServerProcess

    srv = ServerProcess("grpc", model_dir, device, engine=engine)
    try:
        t = GrpcTarget(srv.address)
        t.wait_ready(300, srv.check)
        info0 = t._info(t.pb.InfoRequest())
        out = {"embed_p50_ms": p50(lambda: t.embed_ids(seqs), n)}
        info1 = t._info(t.pb.InfoRequest())
        steps = info1.batches - info0.batches
        if steps:
            out["server_step_mean_ms"] = round((info1.step_seconds_sum - info0.step_seconds_sum) / steps * 1e3, 4)
        out["info_p50_ms"] = p50(lambda: t._info(t.pb.InfoRequest()), n)
        t.close()
        return out
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_json")
    ap.add_argument("--shape", default="bge-base")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("-n", type=int, default=600)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the embedded MiniLM's)")
    a = ap.parse_args()
    import torch

    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    model_dir = make_model_dir(SHAPES[a.shape], Path("/tmp/models"), Path(a.tokenizer) if a.tokenizer else None)
    seqs = [np.random.default_rng(0).integers(1000, 30000, size=a.length, dtype=np.int32)]
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else None
    res: dict = {"commit": source_commit(REPO), "gpu": gpu, "shape": a.shape,
                 "length": a.length, "n": a.n}
    eng = Engine(load_spec(str(model_dir)), a.device, spin_wait=True)
    eng.warmup()
    batch = Batch.pack(seqs)
    res["engine_p50_ms"] = p50(lambda: eng.step(batch).wait(), a.n)
    del eng
    if a.device == "cuda":
        torch.cuda.empty_cache()
    res["torch"] = replica(model_dir, seqs, a.n, "torch", a.device)
    res["noop"] = replica(model_dir, seqs, a.n, "noop", a.device)
    print(json.dumps(res, indent=1), flush=True)
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
