"""BERT encoder on packed sequences (all-MiniLM, bge, e5; ms-marco / bge cross-encoders).

Parameter names are Hugging Face's (``transformers/models/bert/modeling_bert.py``) so checkpoints
load by name. Input is flat: ``input_ids [T]``, ``position_ids [T]``, ``token_type_ids [T]``;
attention runs per sequence through the engine's backend (``cu_seqlens``). No padding, no masks,
no pooling here (``engine/pooling.py`` owns that); ``head`` maps pooled rows to the output.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bouquet.engine.attention import AttentionBackend, AttnMeta
from bouquet.engine.ops import add_layer_norm

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], position_offset: int = 0) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], h)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], h)
        self.token_type_embeddings = nn.Embedding(max(cfg.get("type_vocab_size", 1), 1), h)
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.get("layer_norm_eps", 1e-12))
        self.position_offset = position_offset  # XLM-R: positions start at padding_idx + 1

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids + self.position_offset)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)  # [T, hidden]


class BertSelfAttention(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)


class BertSelfOutput(nn.Module):
    def __init__(self, h: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(h, h)
        self.LayerNorm = nn.LayerNorm(h, eps=eps)


class BertAttention(nn.Module):
    def __init__(self, h: int, eps: float) -> None:
        super().__init__()
        self.self = BertSelfAttention(h)
        self.output = BertSelfOutput(h, eps)


class BertIntermediate(nn.Module):
    def __init__(self, h: int, i: int) -> None:
        super().__init__()
        self.dense = nn.Linear(h, i)


class BertOutput(nn.Module):
    def __init__(self, h: int, i: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(i, h)
        self.LayerNorm = nn.LayerNorm(h, eps=eps)


class BertLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, i, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg.get("layer_norm_eps", 1e-12)
        self.attention = BertAttention(h, eps)
        self.intermediate = BertIntermediate(h, i)
        self.output = BertOutput(h, i, eps)
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = h // self.num_heads
        self.act = ACTIVATIONS[cfg.get("hidden_act", "gelu")]
        self.qkv: tuple[torch.Tensor, torch.Tensor] | None = None  # fused after loading

    def fuse(self) -> None:
        """Concatenate q/k/v into one [3h, h] matmul (one GEMM instead of three)."""
        s = self.attention.self
        self.qkv = (
            torch.cat([s.query.weight, s.key.weight, s.value.weight]).detach(),
            torch.cat([s.query.bias, s.key.bias, s.value.bias]).detach(),
        )

    def forward(self, x: torch.Tensor, attn: AttentionBackend, meta: AttnMeta) -> torch.Tensor:
        T, h = x.shape
        s = self.attention.self
        if self.qkv is not None:
            q, k, v = F.linear(x, *self.qkv).view(T, 3, self.num_heads, self.head_dim).unbind(1)
        else:
            q, k, v = (m(x).view(T, self.num_heads, self.head_dim) for m in (s.query, s.key, s.value))
        a = attn.attend(q, k, v, meta).reshape(T, h)  # [T, hidden]
        o = self.attention.output
        x = add_layer_norm(o.dense(a), x, o.LayerNorm)  # one fused kernel on CUDA
        y = self.output.dense(self.act(self.intermediate.dense(x)))
        return add_layer_norm(y, x, self.output.LayerNorm)


class BertEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class BertPooler(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.dense = nn.Linear(h, h)


class BertModel(nn.Module):
    """Embedding model: hidden states [T, hidden] → (pooled outside) → identity head."""

    IGNORED_KEYS: tuple[str, ...] = (r"pooler\..*", r"embeddings\.position_ids", r"cls\..*", r"lm_head\..*")
    PREFIXES: tuple[str, ...] = ("bert.", "model.")
    position_offset = 0

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(cfg, self.position_offset)
        self.encoder = BertEncoder(cfg)
        self.attn = attn
        self.causal = False

    def fuse(self) -> None:
        for layer in self.encoder.layer:
            layer.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        x = self.embeddings(input_ids, position_ids, token_type_ids)  # [T, hidden]
        for layer in self.encoder.layer:
            x = layer(x, self.attn, meta)
        return x

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled  # [B, hidden]


class BertForSequenceClassification(nn.Module):
    """Cross-encoder: CLS → pooler (dense + tanh) → classifier → logits [B, num_labels]."""

    IGNORED_KEYS: tuple[str, ...] = (r"bert\.embeddings\.position_ids",)
    PREFIXES: tuple[str, ...] = ()
    encoder_cls = BertModel
    base_name = "bert"

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        base = self.encoder_cls(cfg, attn)
        setattr(self, self.base_name, base)
        base.pooler = BertPooler(cfg["hidden_size"])
        self.classifier = nn.Linear(cfg["hidden_size"], len(cfg.get("id2label") or {"0": 0}))
        self.causal = False

    def fuse(self) -> None:
        getattr(self, self.base_name).fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        return getattr(self, self.base_name)(input_ids, position_ids, token_type_ids, meta)

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        p = getattr(self, self.base_name).pooler.dense
        return self.classifier(torch.tanh(p(pooled.to(p.weight.dtype)))).float()  # [B, num_labels]


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
