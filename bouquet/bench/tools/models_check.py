"""Full-size correctness check of every model family on the GPU: bouquet's engine against
transformers holding the very same random weights (bf16, SDPA), on a mixed-length batch.

    bouquet bench models-check OUT.json                      # H200: full shapes, cuda, bf16
    bouquet bench models-check OUT.json --tiny --device cpu  # seconds, on any machine

Shapes: Qwen3-Embedding-0.6B (hidden 1024, 28 layers, 16 q / 8 kv heads × 128, intermediate
3072, vocab 151669), Qwen3-Reranker-0.6B (same decoder, tied LM head) and its
``Qwen3ForSequenceClassification`` conversion (one-label ``score`` head), bge-base (BERT-base),
XLM-R-base, DistilBERT-base (msmarco-distilbert), RoBERTa-large (all-roberta-large-v1),
MPNet-base (all-mpnet-base-v2: relative position bias, the memory-efficient attention kernel on CUDA),
ModernBERT-base (gte-modernbert-base: 22 layers, local ±64 / global). Weights are created directly on the device by transformers' random init and handed
to ``Engine.from_state_dict`` (no disk round trip). transformers runs one sequence at a time
(no padding: the cleanest reference); bouquet runs the whole batch packed. The decoders:
gte-Qwen2-1.5B-instruct (Qwen2: q/k/v biases), e5-mistral-7b-instruct (Mistral-7B, 14 GB in bf16),
EmbeddingGemma-300m (bidirectional Gemma3: sliding ±256 / global layers, mean pooling).

Pass criteria: embeddings cosine ≥ 0.999 per sequence; reranker P(yes) and the sequence
classifier's sigmoid within 0.02. Where the cosine falls short in bf16, both runs are compared
with transformers in float32 (same weights): bouquet passes when, per sequence, it is as close to
float32 as transformers' bf16 run (within 5e-4) — the deep random-weight decoders' own bf16 noise
exceeds 1e-3. Prints a table and writes JSON {"ok": bool, "results": [...]}; exit code 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch


from bouquet.engine.runtime.batch import Batch  # noqa: E402
from bouquet.engine.runtime.engine import Engine  # noqa: E402
from bouquet.modelspec import spec_from_config  # noqa: E402

COSINE_MIN = 0.999
PROB_ATOL = 0.02
FP32_SLACK = 5e-4  # bouquet may be this much further from float32 than transformers' bf16 run, per sequence


@dataclass
class Result:
    model: str
    dtype: str
    lengths: list[int]
    metric: str
    worst: float  # min cosine, or max |ΔP(yes)|
    spread: float  # max cosine between different inputs (must stay < 1: outputs are not constant)
    ok: bool
    seconds: float
    # when the cosine criterion fails in bf16/fp16: min cosine to transformers in float32 (same
    # weights) of bouquet and of transformers' own low-precision run
    fp32: tuple[float, float] | None = None


def configs(tiny: bool) -> dict[str, tuple[str, dict]]:
    """name → (transformers class name, config kwargs)."""
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    qwen = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                intermediate_size=3072, vocab_size=151669, max_position_embeddings=32768, rope_theta=1000000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=True)
    bert = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                vocab_size=30522, max_position_embeddings=512, type_vocab_size=2)
    xlmr = dict(bert, vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    roberta = dict(xlmr, vocab_size=50265, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                   intermediate_size=4096)  # all-roberta-large-v1
    # all-mpnet-base-v2: BERT-base width, RoBERTa-style positions, relative position bias (32 buckets)
    mpnet = dict(bert, vocab_size=30527, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                 eos_token_id=2, layer_norm_eps=1e-5, relative_attention_num_buckets=32)
    del mpnet["type_vocab_size"]
    # DistilBERT's config names (msmarco-distilbert-base-v4: 6 layers of BERT-base width)
    distilbert = dict(dim=768, n_layers=6, n_heads=12, hidden_dim=3072, vocab_size=30522, max_position_embeddings=512)
    # ModernBERT-base (gte-modernbert-base): every third layer global, the others ±64 tokens; the
    # lengths above 129 (300 … 2048) are where a wrong window would show
    modernbert = dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
                      vocab_size=50368, max_position_embeddings=8192, local_attention=128,
                      global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0)
    # the other decoders (bouquet/bench/models.py SHAPES has the same shapes): gte-Qwen2-1.5B-instruct,
    # e5-mistral-7b-instruct (14 GB in bf16), EmbeddingGemma-300m (bidirectional, 5 sliding : 1 global)
    qwen2 = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151646, max_position_embeddings=131072, rope_theta=1000000.0,
                 rms_norm_eps=1e-6, use_sliding_window=False, tie_word_embeddings=False)
    mistral = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                   intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768, rope_theta=10000.0,
                   rms_norm_eps=1e-5, sliding_window=None)
    gemma = dict(hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1, head_dim=256,
                 intermediate_size=1152, vocab_size=262144, max_position_embeddings=2048, query_pre_attn_scalar=256,
                 sliding_window=512, use_bidirectional_attention=True, hidden_activation="gelu_pytorch_tanh",
                 rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if tiny:
        # decoder windows shorter than the longest tiny sequences: Mistral 32 (causal), Gemma ±8
        qwen2.update(small, num_key_value_heads=2, vocab_size=500, max_position_embeddings=256)
        mistral.update(small, num_key_value_heads=2, vocab_size=500, max_position_embeddings=256, sliding_window=32)
        gemma.update(small, num_hidden_layers=3, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
                     vocab_size=500, max_position_embeddings=128, sliding_window=16,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        # 3 layers: global, local (±8 tokens), global; pad id inside the small vocabulary
        modernbert.update(small, num_hidden_layers=3, global_attn_every_n_layers=2, local_attention=16,
                          vocab_size=500, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                          eos_token_id=2, cls_token_id=1, sep_token_id=2)
        qwen.update(small, num_key_value_heads=2, head_dim=32, vocab_size=500, max_position_embeddings=256)
        bert.update(small, vocab_size=500, max_position_embeddings=128)
        xlmr.update(small, vocab_size=500, max_position_embeddings=130)
        roberta.update(small, vocab_size=500, max_position_embeddings=130)
        mpnet.update(small, vocab_size=500, max_position_embeddings=202)  # distances past 128: every bucket
        distilbert.update(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=500, max_position_embeddings=128)
    return {
        "qwen3-embedding": ("Qwen3Model", qwen),
        "qwen3-reranker": ("Qwen3ForCausalLM", qwen),
        "qwen3-seq-cls": ("Qwen3ForSequenceClassification", dict(qwen, num_labels=1)),
        "bge-base": ("BertModel", bert),
        "xlm-r-base": ("XLMRobertaModel", xlmr),
        "gte-qwen2-1.5b": ("Qwen2Model", qwen2),
        "e5-mistral-7b": ("MistralModel", mistral),
        "embeddinggemma-300m": ("Gemma3TextModel", gemma),
        "distilbert": ("DistilBertModel", distilbert),
        "modernbert-base": ("ModernBertModel", modernbert),
        "roberta-large": ("RobertaModel", roberta),
        "mpnet-base": ("MPNetModel", mpnet),
    }


def lengths_for(max_len: int, tiny: bool) -> list[int]:
    base = [1, 13, 77, 128, 300, 512, 1000, 2048]
    if tiny:
        base = [1, 5, 13, 40, 77]
    return sorted({min(n, max_len) for n in base} | {max_len if tiny or max_len <= 512 else 2048})


def reference(model: torch.nn.Module, name: str, seqs: list[torch.Tensor], pooling: str, yes_no: tuple[int, int]) -> np.ndarray:
    rows = []
    for s in seqs:
        out = model(input_ids=s[None])
        if name == "qwen3-reranker":
            last = out.logits[0, -1].float()
            rows.append(torch.softmax(torch.stack([last[yes_no[1]], last[yes_no[0]]]), 0)[1:])
            continue
        if name == "qwen3-seq-cls":  # one sequence, so transformers pools its last token
            rows.append(torch.sigmoid(out.logits[0].float()))
            continue
        h = out.last_hidden_state[0].float()
        rows.append(h.mean(0) if pooling == "mean" else h[0] if pooling == "cls" else h[-1])
    return torch.stack(rows).cpu().numpy()


@torch.inference_mode()
def check(name: str, cls_name: str, kwargs: dict, device: str, dtype: torch.dtype, tiny: bool, seed: int) -> Result:
    import transformers as tf

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    cfg = getattr(tf, cls_name).config_class(**kwargs)
    with torch.device(device):  # random init straight on the device
        impl = "eager" if cls_name.startswith("MPNet") else "sdpa"  # transformers' MPNet has only eager
        model = getattr(tf, cls_name)._from_config(cfg, dtype=dtype, attn_implementation=impl).eval()
    cfg_dict = dict(cfg.to_dict(), architectures=[cls_name])
    yes_no = (9693, 2152) if not tiny else (7, 8)  # Qwen's "yes" / "no"
    if name == "qwen3-reranker":
        cfg_dict.update(bouquet={"task": "score"}, yes_token_id=yes_no[0], no_token_id=yes_no[1])
    if name == "bge-base":
        cfg_dict["bouquet"] = {"pooling": "cls"}  # bge pools on [CLS]
    spec = spec_from_config(cfg_dict, None, name)
    engine = Engine.from_state_dict(spec, model.state_dict(), device=device, dtype=str(dtype).removeprefix("torch."))
    gen = torch.Generator().manual_seed(seed)
    lens = lengths_for(spec.max_seq_length, tiny)
    seqs = [torch.randint(5, spec.vocab_size, (n,), generator=gen, dtype=torch.int32) for n in lens]
    got = engine.step(Batch.pack([s.numpy() for s in seqs])).wait()
    ref = reference(model, name, [s.to(device).long() for s in seqs], spec.pooling, yes_no)
    fp32: tuple[float, float] | None = None
    if spec.task == "score":
        p = 1.0 / (1.0 + np.exp(-got))
        worst = float(np.abs(p - ref).max())
        spread = float(np.abs(ref[:-1] - ref[1:]).max())
        ok = worst <= PROB_ATOL
        metric = "max |dP(yes)|" if name == "qwen3-reranker" else "max |dP|"
    else:
        norm = np.linalg.norm
        cos = (got * ref).sum(1) / (norm(got, axis=1) * norm(ref, axis=1))
        worst = float(cos.min())
        spread = float(((ref[:-1] * ref[1:]).sum(1) / (norm(ref[:-1], axis=1) * norm(ref[1:], axis=1))).max())
        ok = worst >= COSINE_MIN and bool(np.isfinite(got).all())
        metric = "min cosine"
        if not ok and dtype != torch.float32 and bool(np.isfinite(got).all()):
            # A deep random-weight model's bf16 rounding alone can move transformers' own output
            # further than 1 − COSINE_MIN from its float32 answer (e5-mistral-7b: 0.997), and two
            # bf16 runs then differ by about twice that; judge both against float32 instead.
            ref32 = reference(model.float(), name, [s.to(device).long() for s in seqs], spec.pooling, yes_no)
            ours, theirs = _cosines(got, ref32), _cosines(ref, ref32)
            fp32 = (float(ours.min()), float(theirs.min()))
            ok = bool((ours >= theirs - FP32_SLACK).all())
    del model, engine
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return Result(name, str(dtype).removeprefix("torch."), lens, metric, worst, spread, ok, time.perf_counter() - t0,
                  fp32)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of [N, D] arrays → [N]."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON output path")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                    help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU smoke test)")
    ap.add_argument("--only", nargs="*", default=None, help="subset of model names")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    results = []
    for name, (cls_name, kwargs) in configs(args.tiny).items():
        if args.only and name not in args.only:
            continue
        r = check(name, cls_name, kwargs, args.device, dtype, args.tiny, args.seed)
        results.append(r)
        print(f"{r.model:16s} {r.dtype:9s} {r.metric:14s} {r.worst:.6f}  spread {r.spread:.4f}  "
              f"{'OK' if r.ok else 'FAIL'}  {r.seconds:.1f}s  lengths {r.lengths}"
              + (f"  vs float32: bouquet {r.fp32[0]:.6f}, transformers {r.fp32[1]:.6f}" if r.fp32 else ""), flush=True)
    ok = all(r.ok for r in results)
    Path(args.out).write_text(json.dumps({"ok": ok, "device": args.device, "tiny": args.tiny,
                                          "torch": torch.__version__, "results": [asdict(r) for r in results]}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
