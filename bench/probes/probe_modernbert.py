"""ModernBERT-base on the GPU: sliding-window attention cost, engine == transformers through the
CUDA-graph path, and forward time next to transformers (random weights, bf16).

1. Attention alone (12 heads × 64, the shape of ModernBERT-base): FlashAttention-2 varlen
   unwindowed, varlen with ``window_size=(64, 64)`` (a local layer), and cuDNN SDPA unwindowed
   (what the global layers of an equal-length batch use), ms per call.
2. ``Engine`` against ``transformers.ModernBertModel`` (same weights, SDPA, one sequence at a time,
   mean pooling) on a mixed batch, an equal-length batch and one long sequence, each stepped three
   times: eager (first sight of the bucket), capture, replay. Min cosine per step.
3. Forward + pooling time per batch, bouquet ``Engine.step`` vs transformers on the same padded
   batch (no padding needed: equal lengths), ms.

Usage (GPU): python3 bench/probes/probe_modernbert.py OUT_JSON
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.varlen import varlen_attn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bouquet.engine.batch import Batch  # noqa: E402
from bouquet.engine.engine import Engine  # noqa: E402
from bouquet.modelspec import spec_from_config  # noqa: E402


def wall_ms(fn: Callable[[], object], n: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def attention_rows() -> list[dict]:
    rows = []
    H, D = 12, 64
    for B, L in [(32, 512), (100, 512), (8, 2048), (1, 8192)]:
        T = B * L
        q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.arange(0, T + 1, L, device="cuda", dtype=torch.int32)
        qp, kp, vp = (x.view(B, L, H, D).transpose(1, 2) for x in (q, k, v))  # [B, H, L, D]

        def cudnn() -> torch.Tensor:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qp, kp, vp)

        rows.append(dict(seqs=B, length=L,
                         varlen_full_ms=wall_ms(lambda: varlen_attn(q, k, v, cu, cu, L, L)),
                         varlen_window64_ms=wall_ms(lambda: varlen_attn(q, k, v, cu, cu, L, L, window_size=(64, 64))),
                         cudnn_full_ms=wall_ms(cudnn)))
        print(rows[-1], flush=True)
    return rows


@torch.inference_mode()
def model_rows() -> dict:
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.ModernBertConfig(global_attn_every_n_layers=3, local_attention=128)
    with torch.device("cuda"):
        model = tf.ModernBertModel._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    spec = spec_from_config(dict(cfg.to_dict(), architectures=["ModernBertModel"]), None, "modernbert-base")
    engine = Engine.from_state_dict(spec, model.state_dict(), device="cuda", dtype="bfloat16")
    gen = torch.Generator().manual_seed(1)

    def ids(lengths: list[int]) -> list[np.ndarray]:
        return [torch.randint(5, 50000, (n,), generator=gen, dtype=torch.int32).numpy() for n in lengths]

    def reference(seqs: list[np.ndarray]) -> np.ndarray:
        return np.stack([model(input_ids=torch.from_numpy(s).long().cuda()[None]).last_hidden_state[0].float()
                         .mean(0).cpu().numpy() for s in seqs])

    def cosine(a: np.ndarray, b: np.ndarray) -> float:
        return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())

    checks = []
    for name, lengths in [("mixed", [1, 60, 65, 129, 200, 700]), ("equal", [1000] * 4), ("one", [3000])]:
        seqs = ids(lengths)
        ref = reference(seqs)
        cos = [cosine(engine.step(Batch.pack(seqs)).wait(), ref) for _ in range(3)]  # eager, capture, replay
        checks.append(dict(batch=name, lengths=lengths, min_cosine_eager_capture_replay=cos))
        print(checks[-1], flush=True)
    assert engine.graph_replays > 0, "no CUDA-graph replay happened"

    timings = []
    for L, B in [(128, 1), (512, 32), (512, 100), (2048, 8), (8192, 1)]:
        seqs = ids([L] * B)
        batch = Batch.pack(seqs)
        dense = torch.from_numpy(np.stack(seqs)).long().cuda()
        hf = wall_ms(lambda: model(input_ids=dense).last_hidden_state.mean(1).float().cpu(), 10)
        ours = wall_ms(lambda: engine.step(batch).wait(), 10)
        timings.append(dict(length=L, seqs=B, bouquet_ms=ours, transformers_ms=hf))
        print(timings[-1], flush=True)
    return dict(checks=checks, timings=timings)


def main() -> None:
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, attention=attention_rows(), **model_rows())
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
