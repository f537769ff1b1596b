"""Qwen3 on packed sequences: Qwen3-Embedding (causal, last-token pooling), bidirectional
Qwen3 embedders (mean pooling) and Qwen3-Reranker (a causal LM scored on "yes" vs "no").

Parameter names are Hugging Face's (``transformers/models/qwen3/modeling_qwen3.py``): a
pre-norm decoder with RMSNorm, q/k RMSNorm per head before rotary, grouped-query attention
(``num_key_value_heads`` < ``num_attention_heads``; K/V are never repeated here, the attention
backend handles the grouping) and a SiLU-gated MLP. Rotary positions come from the batch's
``position_ids`` so every packed sequence starts at 0. Whether attention is causal is decided by
``bouquet.modelspec.is_causal`` (``is_bidirectional: true`` in config.json turns it off).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bouquet.engine.attention import AttentionBackend, AttnMeta
from bouquet.engine.layers import RMSNorm, fuse_linears, rope_theta
from bouquet.engine.models.base import PackedModel
from bouquet.engine.ops import add_rms_norm, qk_norm_rope, rope_tables, silu_mul
from bouquet.modelspec import is_causal


class Qwen3Attention(nn.Module):
    qkv: tuple[torch.Tensor, torch.Tensor | None]  # weight [(H + 2·Hkv)·D, hidden], bias: set by fuse()
    qk_weight: torch.Tensor  # [2, head_dim]: q_norm, k_norm weights; set by fuse()

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads") or self.num_heads
        self.head_dim = cfg.get("head_dim") or h // self.num_heads
        bias = bool(cfg.get("attention_bias", False))
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)

    def fuse(self) -> None:
        self.qkv = fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        self.qk_weight = torch.stack((self.q_norm.weight.detach(), self.k_norm.weight.detach()))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend, meta: AttnMeta) -> torch.Tensor:
        """x [T, hidden] → [T, hidden]; cos/sin [T, head_dim/2] float32 (``ops.rope_tables``)."""
        T = x.shape[0]
        qkv = F.linear(x, *self.qkv)  # [T, (H + 2·Hkv)·D]
        q, k, v = qk_norm_rope(qkv, self.q_norm, self.k_norm, cos, sin, self.num_heads, self.num_kv_heads,
                               self.head_dim, self.qk_weight)
        return self.o_proj(attn.attend(q, k, v, meta).reshape(T, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    gate_up: torch.Tensor  # [2i, h]: gate rows, then up rows; set by fuse()

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ValueError(f"Qwen3 MLP activation {cfg.get('hidden_act')!r} is not supported; only silu")

    def fuse(self) -> None:
        self.gate_up = fuse_linears(self.gate_proj, self.up_proj)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(F.linear(x, self.gate_up)))  # gate_up [T, 2i] → [T, hidden]


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.self_attn = Qwen3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.mlp = Qwen3MLP(cfg)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend, meta: AttnMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) [T, hidden] → (this layer's MLP output, the residual stream before it).

        The residual add is deferred into the next norm (one fused kernel for add + RMSNorm);
        the sums are the same bf16 values HF's ``residual + hidden_states`` produces."""
        h, residual = add_rms_norm(x, residual, self.input_layernorm)
        h, residual = add_rms_norm(self.self_attn(h, cos, sin, attn, meta), residual, self.post_attention_layernorm)
        return self.mlp(h), residual


class Qwen3Model(PackedModel):
    """Embedding model: hidden states [T, hidden] after the final norm; identity head.

    Checkpoints saved from ``Qwen3Model`` (no prefix) and from ``Qwen3ForCausalLM`` (``model.``
    prefix, plus an ``lm_head`` an embedding model does not use) both load.
    Raises ValueError at construction for sliding-window attention or a scaled rope.
    """

    IGNORED_KEYS: tuple[str, ...] = (r"lm_head\..*",)
    PREFIXES: tuple[str, ...] = ("model.",)

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        if cfg.get("use_sliding_window"):
            raise ValueError("Qwen3 with use_sliding_window=true is not supported (every layer must be full attention)")
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6))
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.head_dim, self.rope_theta = head_dim, rope_theta(cfg)
        self.attn = attn
        self.causal = is_causal(cfg)

    def fuse(self) -> None:
        for layer in self.layers:
            layer.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        """ids/positions [T] int32 (token types ignored) → hidden [T, hidden] in the model dtype."""
        x = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = rope_tables(position_ids, self.head_dim, self.rope_theta)  # [T, head_dim/2] fp32
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, self.attn, meta)
        return add_rms_norm(x, residual, self.norm)[0]


class Qwen3ForCausalLM(PackedModel):
    """Qwen3-Reranker: the LM's next-token logits at the last position, restricted to the
    "yes" and "no" tokens. ``head`` returns [B, 1] float32 = logit(yes) − logit(no), so that
    sigmoid(score) = softmax([no, yes])[yes] = P("yes"), the model card's relevance score; the
    API layer applies that sigmoid as it does for cross-encoder logits.

    Only the two lm_head rows are used (sliced at ``fuse``). With ``tie_word_embeddings`` the
    rows come from ``embed_tokens`` and a stored ``lm_head.weight`` is skipped explicitly.
    Raises ValueError when ``yes_no_ids`` is missing or outside the vocabulary.
    """

    IGNORED_KEYS: tuple[str, ...] = ()  # per instance: (lm_head.weight,) when the head is tied
    PREFIXES: tuple[str, ...] = ()
    yes_no: torch.Tensor  # [2, hidden]: the "yes" and "no" rows of the LM head; set by fuse()

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend, yes_no_ids: tuple[int, int] | None = None) -> None:
        super().__init__()
        if yes_no_ids is None or not all(0 <= t < cfg["vocab_size"] for t in yes_no_ids):
            raise ValueError(f"Qwen3ForCausalLM scoring needs 'yes'/'no' token ids inside [0, {cfg['vocab_size']}), got {yes_no_ids}")
        self.model = Qwen3Model(cfg, attn)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.IGNORED_KEYS = (r"lm_head\.weight",) if self.tied else ()
        self.yes_no_ids = yes_no_ids
        self.causal = self.model.causal

    def fuse(self) -> None:
        self.model.fuse()
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        self.yes_no = w[list(self.yes_no_ids)].detach().clone()  # [2, hidden]: yes, no
        if not self.tied:
            del self.lm_head  # the other vocab rows are never read

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        return self.model(input_ids, position_ids, token_type_ids, meta)

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled last-token rows [B, hidden] float32 → [B, 1] float32 logit(yes) − logit(no)."""
        logits = F.linear(pooled.to(self.yes_no.dtype), self.yes_no).float()  # [B, 2]
        return (logits[:, 0] - logits[:, 1]).unsqueeze(1)
