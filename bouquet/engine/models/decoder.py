"""The decoder families on packed sequences, one implementation parameterised by what differs:
Qwen3 (Qwen3-Embedding, bidirectional Qwen3 embedders, Qwen3-Reranker), Qwen2 (gte-Qwen2),
Mistral (e5-mistral) and Gemma3 (EmbeddingGemma, bidirectional); their scoring heads (cross-encoders,
Qwen3-Reranker's yes/no logits) are in ``decoder_heads.py``.

All are pre-norm decoders with RMSNorm, rotary positions, grouped-query attention (K/V are never
repeated here; the attention backend handles the grouping) and a gated MLP. Parameter names are
Hugging Face's, from ``transformers/models/{qwen3,qwen2,mistral,gemma3}/modeling_*.py``; what
differs between them is a ``DecoderFacts`` read from config.json by each family's class:

=========  ========  ==========  =====================  ===========  ======================
family     qkv bias  q/k norm    norms                  MLP act      windows
=========  ========  ==========  =====================  ===========  ======================
Qwen3      opt. all  RMSNorm     pre                    SiLU         refused
Qwen2      q, k, v   none        pre                    SiLU         refused
Mistral    none      none        pre                    SiLU         causal, every layer
Gemma3     none      (1+w) norm  pre + post, (1+w)      tanh-GELU    per ``layer_types``
=========  ========  ==========  =====================  ===========  ======================

Gemma3 also scales the embeddings by √hidden (rounded to the model dtype, as HF does) and uses a
second rope base on its sliding layers. Rotary positions come from the batch's ``position_ids``
so every packed sequence starts at 0. Whether attention is causal is ``modelspec.is_causal``'s
decision (``is_bidirectional`` / ``use_bidirectional_attention`` in config.json turn it off).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bouquet.engine.attention.backends import AttentionBackend, AttnMeta
from bouquet.families import architecture_of
from bouquet.engine.kernels.layers import RMSNorm, fuse_linears, rope_theta
from bouquet.engine.models.base import PackedModel, table
from bouquet.engine.kernels.rows import QRows, ScaledRows
from bouquet.engine.linear.base import Linear
from bouquet.engine.kernels.ops import add_rms_norm, qk_norm_rope, rope_tables
from bouquet.modelspec import is_causal


@dataclass(frozen=True)
class DecoderFacts:
    """What one decoder family does differently; built from config.json by ``facts``.

    qkv_bias / o_bias   biases on q/k/v and on o_proj (Qwen2: q/k/v only)
    qk_norm             per-head RMSNorm of q and k before rotary (Qwen3, Gemma3)
    sandwich_norms      Gemma3: ``post_attention_layernorm`` after attention,
                        ``pre_feedforward_layernorm`` before the MLP, ``post_feedforward_layernorm``
                        after it (elsewhere ``post_attention_layernorm`` is the pre-MLP norm)
    unit_offset         every RMSNorm scales by (1 + weight) (Gemma)
    gelu                tanh-GELU gate instead of SiLU
    embed_scale         multiplier of the token embeddings (Gemma: √hidden; 1 elsewhere)
    windows             per layer: the sliding-window half-width W handed to the attention
                        backend (keys with |i − j| ≤ W, j ≤ i when causal), None = global
    thetas              per layer: the rotary base
    q_scale             Gemma3's softmax scale ``query_pre_attn_scalar**-0.5`` relative to the
                        backend's head_dim**-0.5; folded into the q norm's weight at load (1 for
                        EmbeddingGemma, where the two agree)
    """

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    unit_offset: bool = False
    gelu: bool = False
    embed_scale: float = 1.0
    windows: tuple[int | None, ...] = ()
    thetas: tuple[float, ...] = ()
    q_scale: float = 1.0


def _mlp_is_gelu(cfg: dict[str, Any], key: str) -> bool:
    """Whether config.json's ``key`` names the tanh-GELU gate (else SiLU); ValueError otherwise."""
    act = cfg.get(key) or "silu"
    if act not in ("silu", "swish", "gelu_pytorch_tanh", "gelu_new"):
        raise ValueError(f"{architecture_of(cfg)}: MLP activation {act!r} is not supported; "
                         "supported: silu, gelu_pytorch_tanh")
    return act not in ("silu", "swish")


def _full_attention(cfg: dict[str, Any], name: str, **facts: Any) -> DecoderFacts:
    """Qwen2/Qwen3: every layer global, one rope base. Their sliding window is off unless
    ``use_sliding_window``, which is refused."""
    if cfg.get("use_sliding_window"):
        raise ValueError(f"{name} with use_sliding_window=true is not supported (every layer must be full attention)")
    n = cfg["num_hidden_layers"]
    return DecoderFacts(windows=(None,) * n, thetas=(rope_theta(cfg),) * n, gelu=_mlp_is_gelu(cfg, "hidden_act"),
                        **facts)


class DecoderAttention(nn.Module):
    qkv: Linear  # weight [(H + 2·Hkv)·D, hidden], bias: set by fuse()
    o: Linear  # o_proj, read by add + RMSNorm only; set by fuse()
    qk_weight: torch.Tensor | None  # [2, head_dim]: q_norm, k_norm weights (None: no q/k norm); set by fuse()

    def __init__(self, cfg: dict[str, Any], f: DecoderFacts) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads") or self.num_heads
        self.head_dim = cfg.get("head_dim") or h // self.num_heads
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=f.qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=f.qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=f.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=f.o_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        self.q_scale = f.q_scale
        if f.qk_norm:
            eps = cfg.get("rms_norm_eps", 1e-6)
            self.q_norm = RMSNorm(self.head_dim, eps, f.unit_offset)
            self.k_norm = RMSNorm(self.head_dim, eps, f.unit_offset)

    def fuse(self) -> None:
        self.qkv = Linear(*fuse_linears(self.q_proj, self.k_proj, self.v_proj), "qkv")
        self.o = Linear.of(self.o_proj, "o", readers="norm")
        self.qk_weight = None
        if self.q_norm is not None and self.q_scale != 1.0:
            # q · c with the default scale equals q with scale c·head_dim**-0.5: scale the norm's
            # output (rotary is linear) instead of passing a scale to every attention backend.
            w = self.q_norm.weight.detach().float()
            w = (1.0 + w) * self.q_scale - 1.0 if self.q_norm.unit_offset else w * self.q_scale
            self.q_norm.weight = nn.Parameter(w.to(self.q_norm.weight.dtype), requires_grad=False)
        if self.q_norm is not None and self.k_norm is not None:
            self.qk_weight = torch.stack((self.q_norm.weight.detach(), self.k_norm.weight.detach()))

    def forward(self, x: "torch.Tensor | QRows", cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend,
                meta: AttnMeta, window: int | None) -> "torch.Tensor | ScaledRows":
        """x [T, hidden] (QRows in fp8) → [T, hidden] (ScaledRows when o runs in fp8); cos/sin
        [T, head_dim/2] float32 (``ops.rope_tables``)."""
        T = x.shape[0]
        qkv = self.qkv(x)  # [T, (H + 2·Hkv)·D]
        q, k, v = qk_norm_rope(qkv, self.q_norm, self.k_norm, cos, sin, self.num_heads, self.num_kv_heads,
                               self.head_dim, self.qk_weight)
        a = attn.attend(q, k, v, meta, window).reshape(T, self.num_heads * self.head_dim)
        return self.o(self.o.rows(a))  # attention writes the model dtype: one cast pass where o reads fp8


class DecoderMLP(nn.Module):
    gate_up: Linear  # [2i, h]: gate rows, then up rows, with act(gate) · up; set by fuse()
    down: Linear  # down_proj, read by the next add + RMSNorm only; set by fuse()

    def __init__(self, cfg: dict[str, Any], f: DecoderFacts) -> None:
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act = "gelu_tanh" if f.gelu else "silu"

    def fuse(self) -> None:
        # down is read by the next add + RMSNorm (the next layer's, the final norm, or Gemma's
        # post-MLP norm), gate_up by its own gated activation
        self.gate_up = Linear(fuse_linears(self.gate_proj, self.up_proj)[0], None, "up", readers="act", gated=self.act)
        self.down = Linear.of(self.down_proj, "down", readers="norm")

    def forward(self, x: "torch.Tensor | QRows") -> "torch.Tensor | ScaledRows":
        """x [T, hidden] (QRows when gate_up reads fp8) → [T, hidden] (ScaledRows when down runs
        in fp8); the activation writes fp8 rows when down reads them."""
        return self.down(self.gate_up(x, quantize_out=self.down.reads_fp8(x.shape[0])))


class DecoderLayer(nn.Module):
    # --quantization fp8 runs the MLP (gate/up and down) in fp8, qkv and o in bf16: with qkv in fp8
    # too the vectors move more than the gate allows (docs/decisions.md, "the kernel plan")
    FP8_KINDS: tuple[str, ...] = ("up", "down")

    def __init__(self, cfg: dict[str, Any], f: DecoderFacts, window: int | None) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(h, eps, f.unit_offset)
        self.self_attn = DecoderAttention(cfg, f)
        self.post_attention_layernorm = RMSNorm(h, eps, f.unit_offset)
        self.sandwich = f.sandwich_norms
        if f.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(h, eps, f.unit_offset)
            self.post_feedforward_layernorm = RMSNorm(h, eps, f.unit_offset)
        self.mlp = DecoderMLP(cfg, f)
        self.window = window

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def linears(self) -> list[Linear]:
        a, m = self.self_attn, self.mlp
        return [a.qkv, a.o, m.gate_up, m.down]

    def forward(self, x: "torch.Tensor | ScaledRows", residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, attn: AttentionBackend, meta: AttnMeta) -> "tuple[torch.Tensor | ScaledRows, torch.Tensor]":
        """(x, residual) [T, hidden] → (this layer's MLP output, the residual stream before it).

        The residual add is deferred into the next norm (one fused kernel for add + RMSNorm);
        the sums are the same values HF's ``residual + hidden_states`` produces. In fp8 (linear/fp8.py)
        the norms before a GEMM write its fp8 rows directly."""
        T = x.shape[0]
        h, residual = add_rms_norm(x, residual, self.input_layernorm, self.self_attn.qkv.reads_fp8(T))
        h = self.self_attn(h, cos, sin, attn, meta, self.window)
        mlp8 = self.mlp.gate_up.reads_fp8(T)
        if not self.sandwich:
            h, residual = add_rms_norm(h, residual, self.post_attention_layernorm, mlp8)
            return self.mlp(h), residual
        h = add_rms_norm(h, None, self.post_attention_layernorm)[0]
        h, residual = add_rms_norm(h, residual, self.pre_feedforward_layernorm, mlp8)
        return add_rms_norm(self.mlp(h), None, self.post_feedforward_layernorm)[0], residual


class DecoderModel(PackedModel):
    """Embedding model: hidden states [T, hidden] after the final norm; identity head.

    Checkpoints saved from the base model (no prefix) and from ``*ForCausalLM`` (``model.``
    prefix, plus an ``lm_head`` an embedding model does not use) both load. Subclasses say their
    family's facts (``facts``). Raises ValueError at construction for a config the family cannot
    serve (scaled rope, an unsupported window or activation).
    """

    IGNORED_KEYS: tuple[str, ...] = (r"lm_head\..*",)
    PREFIXES: tuple[str, ...] = ("model.",)

    @classmethod
    def facts(cls, cfg: dict[str, Any]) -> DecoderFacts:
        raise NotImplementedError

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        f = self.facts(cfg)
        self.embed_tokens = table(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg, f, w) for w in f.windows)
        self.norm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6), f.unit_offset)
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.thetas = f.thetas
        self.layer_windows = f.windows
        self.embed_scale = f.embed_scale
        self.attn = attn
        self.causal = is_causal(cfg)

    def fuse(self) -> None:
        for layer in self.layers:
            layer.fuse()
        if self.embed_scale != 1.0:  # HF multiplies by the scale rounded to the weights' dtype
            self.embed_scale = torch.tensor(self.embed_scale, dtype=self.embed_tokens.weight.dtype).item()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        """ids/positions [T] int32 (token types ignored) → hidden [T, hidden] in the model dtype."""
        x = self.embed_tokens(input_ids)  # [T, hidden]
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        tables = {t: rope_tables(position_ids, self.head_dim, t) for t in set(self.thetas)}  # [T, head_dim/2] fp32
        residual = None
        for layer, theta in zip(self.layers, self.thetas):
            x, residual = layer(x, residual, *tables[theta], self.attn, meta)
        return add_rms_norm(x, residual, self.norm)[0]


class Qwen3Model(DecoderModel):
    @classmethod
    def facts(cls, cfg: dict[str, Any]) -> DecoderFacts:
        bias = bool(cfg.get("attention_bias", False))
        return _full_attention(cfg, "Qwen3", qkv_bias=bias, o_bias=bias, qk_norm=True)


class Qwen2Model(DecoderModel):
    @classmethod
    def facts(cls, cfg: dict[str, Any]) -> DecoderFacts:
        return _full_attention(cfg, "Qwen2", qkv_bias=True)  # q/k/v biases, o_proj none


class MistralModel(DecoderModel):
    @classmethod
    def facts(cls, cfg: dict[str, Any]) -> DecoderFacts:
        n, sw = cfg["num_hidden_layers"], cfg.get("sliding_window")
        # transformers' sliding_window_overlay: key j is visible from query i when j > i − sw, a
        # causal band of W = sw − 1 on every layer (e5-mistral: none)
        window = None if sw is None else int(sw) - 1
        return DecoderFacts(windows=(window,) * n, thetas=(rope_theta(cfg),) * n, gelu=_mlp_is_gelu(cfg, "hidden_act"))


class Gemma3TextModel(DecoderModel):
    @classmethod
    def facts(cls, cfg: dict[str, Any]) -> DecoderFacts:
        n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
        if cfg.get("attn_logit_softcapping") is not None:
            raise ValueError(f"Gemma3 with attn_logit_softcapping={cfg['attn_logit_softcapping']} is not supported")
        pattern = int(cfg.get("sliding_window_pattern", 6))  # the Hub's older form of layer_types
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                           for i in range(n)]
        if set(types) - {"sliding_attention", "full_attention"} or len(types) != n:
            raise ValueError(f"Gemma3 layer_types must be {n} of sliding_attention/full_attention, got {types}")
        sw = int(cfg.get("sliding_window") or 4096)
        # config.json keeps the window as written; transformers then lets a bidirectional model's
        # query see |i − j| < sw // 2 + 1 (Gemma3TextConfig + _bidirectional_window_overlay), a
        # causal one i − sw < j ≤ i
        local = sw // 2 if not is_causal(cfg) else sw - 1
        nested = cfg.get("rope_parameters") or {}
        default = {"full_attention": float(cfg.get("rope_theta", 1_000_000.0)),
                   "sliding_attention": float(cfg.get("rope_local_base_freq", 10_000.0))}

        def theta(kind: str) -> float:
            p = nested.get(kind)
            if p is None:  # older config.json: rope_theta / rope_local_base_freq (+ rope_scaling)
                return rope_theta({"rope_scaling": cfg.get("rope_scaling"), "rope_theta": default[kind]})
            return rope_theta({"rope_parameters": p, "rope_theta": default[kind]})

        head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
        return DecoderFacts(
            qk_norm=True, sandwich_norms=True, unit_offset=True, gelu=_mlp_is_gelu(cfg, "hidden_activation"),
            qkv_bias=bool(cfg.get("attention_bias")), o_bias=bool(cfg.get("attention_bias")), embed_scale=h ** 0.5,
            windows=tuple(local if t == "sliding_attention" else None for t in types),
            thetas=tuple(theta(t) for t in types),
            q_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5 * head_dim ** 0.5)

