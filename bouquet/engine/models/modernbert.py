"""ModernBERT on packed sequences (gte-modernbert-base, modernbert-embed-base; ModernBERT
cross-encoders through ``ModernBertForSequenceClassification``).

Parameter names are Hugging Face's (``transformers/models/modernbert/modeling_modernbert.py``,
followed for the math): token embeddings + LayerNorm (no position table: rotary positions), then
pre-norm layers (layer 0 has no ``attn_norm``: its input is the already normed embedding), a fused
``Wqkv`` projection, rotary q/k, attention, ``Wo``, and a GeGLU MLP (``Wi`` gives [input | gate],
act(input) · gate, ``Wo``), then ``final_norm``. LayerNorms carry no bias when ``norm_bias`` is
false, linears none unless ``attention_bias`` / ``mlp_bias`` say so.

Layers alternate global and local attention: layer i is global when i % ``global_attn_every_n_layers``
== 0 (or as ``layer_types`` lists), local layers see ±``local_attention // 2`` tokens of their own
sequence (the engine's attention ``window``) and use their own rotary base (``local_rope_theta``,
10,000, vs ``global_rope_theta``, 160,000). transformers' padded path and its former unpadded
(flash-attention varlen) path compute the same thing per sequence; here positions come from the
packed batch's ``position_ids``, restarting at 0 per sequence.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bouquet.engine.attention.backends import AttentionBackend, AttnMeta
from bouquet.engine.kernels.layers import activation
from bouquet.engine.linear.base import Linear
from bouquet.engine.models.base import PackedModel, table
from bouquet.engine.models.bert import num_labels
from bouquet.engine.kernels.ops import add_layer_norm_pre, qk_norm_rope, rope_tables

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer_types names


def layer_types(cfg: dict[str, Any]) -> list[str]:
    """Per layer ``full_attention`` or ``sliding_attention``: config.json's ``layer_types``
    (transformers ≥ 5) or, in Hub configs, every ``global_attn_every_n_layers``-th layer global."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        every = int(cfg.get("global_attn_every_n_layers", 3))
        types = [GLOBAL if i % every == 0 else LOCAL for i in range(n)]
    if len(types) != n or set(types) - {GLOBAL, LOCAL}:
        raise ValueError(f"ModernBERT layer_types must list {n} of {GLOBAL!r}/{LOCAL!r}, got {types}")
    return list(types)


def rope_thetas(cfg: dict[str, Any]) -> dict[str, float]:
    """Rotary base per layer type: ``rope_parameters[type]["rope_theta"]`` (transformers ≥ 5) or
    ``global_rope_theta`` / ``local_rope_theta`` (Hub configs). Raises ValueError for a scaled rope."""
    params = cfg.get("rope_parameters") or {}
    legacy = {GLOBAL: float(cfg.get("global_rope_theta", 160_000.0)), LOCAL: float(cfg.get("local_rope_theta", 10_000.0))}
    thetas = {}
    for kind in (GLOBAL, LOCAL):
        p = params.get(kind) or {}
        if p.get("rope_type", "default") != "default":
            raise ValueError(f"ModernBERT rope_type {p['rope_type']!r} ({kind}) is not supported; only 'default'")
        thetas[kind] = float(p.get("rope_theta", legacy[kind]))
    return thetas


def _layer_norm(cfg: dict[str, Any]) -> nn.LayerNorm:
    return nn.LayerNorm(cfg["hidden_size"], eps=cfg.get("norm_eps", 1e-5), bias=bool(cfg.get("norm_bias", False)))


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.tok_embeddings = table(cfg["vocab_size"], cfg["hidden_size"])
        self.norm = _layer_norm(cfg)


class ModernBertAttention(nn.Module):
    def __init__(self, cfg: dict[str, Any], window: int | None) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        bias = bool(cfg.get("attention_bias", False))
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = h // self.num_heads
        self.Wqkv = nn.Linear(h, 3 * h, bias=bias)
        self.Wo = nn.Linear(h, h, bias=bias)
        self.window = window  # half-width of a local layer's band; None: global

    def fuse(self) -> None:
        self.qkv = Linear.of(self.Wqkv, "qkv")  # [3·hidden, hidden]: read by rotary, then attention
        self.o = Linear.of(self.Wo, "o")  # read by add_layer_norm_pre (model-dtype rows only)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend,
                meta: AttnMeta) -> torch.Tensor:
        """x [T, hidden] → [T, hidden]; cos/sin [T, head_dim/2] float32 of this layer's rope base."""
        T, h = x.shape
        qkv = self.qkv(self.qkv.rows(x))  # [T, 3·hidden]: q, k, v rows, the layout qk_norm_rope reads
        # Rotary only (no q/k norm): one in-place kernel on CUDA, eager PyTorch elsewhere.
        q, k, v = qk_norm_rope(qkv, None, None, cos, sin, self.num_heads, self.num_heads, self.head_dim)
        a = attn.attend(q, k, v, meta, window=self.window)  # [T, H, D]
        return self.o(self.o.rows(a.reshape(T, h)))


# act(input) · gate of Wi's output [T, 2I] (input rows first), by ``hidden_activation``: the
# kernels' activation names (linear.Linear's ``gated``)
GATED = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "silu": "silu"}


class ModernBertMLP(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        bias = bool(cfg.get("mlp_bias", False))
        self.Wi = nn.Linear(h, 2 * i, bias=bias)  # rows: input, then gate
        self.Wo = nn.Linear(i, h, bias=bias)
        act = cfg.get("hidden_activation", "gelu")
        if act not in GATED:
            raise ValueError(f"ModernBERT hidden_activation {act!r} is not supported; supported: {sorted(GATED)}")
        self.act = GATED[act]

    def fuse(self) -> None:
        self.up = Linear(self.Wi.weight, self.Wi.bias, "up", readers="act", gated=self.act, module=self.Wi)
        self.down = Linear.of(self.Wo, "down")  # read by add_layer_norm_pre (model-dtype rows only)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] → Wo(act(input) · gate) [T, hidden]."""
        g = self.up(self.up.rows(x), quantize_out=self.down.reads_fp8(x.shape[0]))  # [T, I]
        return self.down(g)


class ModernBertEncoderLayer(nn.Module):
    # --quantization fp8 runs the GeGLU MLP (Wi, Wo) in fp8, as the decoders do theirs (accuracy-gated
    # at load like every family); their inputs are quantized by a pass of their own (the LayerNorm
    # kernel here writes the model dtype only) and their outputs scaled in the GEMM
    FP8_KINDS: tuple[str, ...] = ("up", "down")

    def __init__(self, cfg: dict[str, Any], index: int, kind: str) -> None:
        super().__init__()
        # Layer 0 reads the embedding LayerNorm's output directly (HF: nn.Identity, no weights).
        self.attn_norm: nn.Module = nn.Identity() if index == 0 else _layer_norm(cfg)
        self.attn = ModernBertAttention(cfg, int(cfg.get("local_attention", 128)) // 2 if kind == LOCAL else None)
        self.mlp_norm = _layer_norm(cfg)
        self.mlp = ModernBertMLP(cfg)
        self.kind = kind

    def linears(self) -> list[Linear]:
        return [self.attn.qkv, self.attn.o, self.mlp.up, self.mlp.down]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend, meta: AttnMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) [T, hidden]: this layer's input is x + residual (layer 0: the normed
        embedding x, residual None) → (this layer's MLP output, the residual stream before it).

        The residual add is deferred into the next norm (one fused kernel for add + LayerNorm,
        ``ops.add_layer_norm_pre``); the sums are the values HF's ``hidden + output`` rounds to."""
        if residual is None:  # layer 0: attn_norm is the identity
            h, residual = x, x
        else:
            h, residual = add_layer_norm_pre(x, residual, self.attn_norm)
        h, residual = add_layer_norm_pre(self.attn(h, cos, sin, attn, meta), residual, self.mlp_norm)
        return self.mlp(h), residual


class ModernBertModel(PackedModel):
    """Embedding model: hidden states [T, hidden] after ``final_norm``; identity head.

    Loads checkpoints of ``ModernBertModel`` (no prefix) and of its task models (``model.``
    prefix; a masked-LM or classifier head an embedder does not use is skipped).
    Raises ValueError for a scaled rope, unknown layer types or an unknown activation.
    """

    IGNORED_KEYS: tuple[str, ...] = (r"head\..*", r"decoder\..*", r"classifier\..*")
    PREFIXES: tuple[str, ...] = ("model.",)
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            raise ValueError(f"ModernBERT hidden_size {cfg['hidden_size']} is not a multiple of "
                             f"num_attention_heads {cfg['num_attention_heads']}")
        kinds = layer_types(cfg)
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i, kind) for i, kind in enumerate(kinds))
        self.final_norm = _layer_norm(cfg)
        self.head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.thetas = rope_thetas(cfg)
        self.attn = attn
        self.layer_windows = tuple(layer.attn.window for layer in self.layers)

    def fuse(self) -> None:
        for layer in self.layers:
            layer.attn.fuse()
            layer.mlp.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                meta: AttnMeta) -> torch.Tensor:
        """ids/positions [T] int32 (token types ignored) → hidden [T, hidden] in the model dtype."""
        emb = self.embeddings
        x = emb.norm(emb.tok_embeddings(input_ids))  # [T, hidden]
        # One (cos, sin) pair [T, head_dim/2] fp32 per rope base, shared by the layers of that kind.
        tables = {kind: rope_tables(position_ids, self.head_dim, theta) for kind, theta in self.thetas.items()}
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer(x, residual, *tables[layer.kind], self.attn, meta)
        assert residual is not None, "ModernBERT needs at least one layer"
        return add_layer_norm_pre(x, residual, self.final_norm)[0]


class ModernBertPredictionHead(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.dense = nn.Linear(h, h, bias=bool(cfg.get("classifier_bias", False)))
        self.norm = _layer_norm(cfg)
        self.act = activation(cfg.get("classifier_activation", "gelu"))


class ModernBertForSequenceClassification(PackedModel):
    """Cross-encoder: pooled row (CLS or mean, config.json's ``classifier_pooling``, chosen by the
    family row's ``pooling_key``) → head (dense, activation, LayerNorm) → classifier → logits
    [B, num_labels] float32; the API layer applies the sigmoid (HF
    ``ModernBertForSequenceClassification``, dropout is identity at inference)."""

    IGNORED_KEYS: tuple[str, ...] = ()
    PREFIXES: tuple[str, ...] = ()
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        self.model = ModernBertModel(cfg, attn)
        # Registered under the checkpoint's name "head" directly in ``_modules`` (``add_module``
        # refuses a name the class already has): the attribute ``self.head`` stays the
        # PackedModel method, since a class attribute wins over nn.Module's submodule lookup.
        self._modules["head"] = ModernBertPredictionHead(cfg)
        self.classifier = nn.Linear(cfg["hidden_size"], num_labels(cfg))

    def fuse(self) -> None:
        self.model.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                meta: AttnMeta) -> torch.Tensor:
        return self.model(input_ids, position_ids, token_type_ids, meta)

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled rows [B, hidden] float32 → logits [B, num_labels] float32."""
        hd = self._modules["head"]
        assert isinstance(hd, ModernBertPredictionHead)
        x = hd.dense(pooled.to(hd.dense.weight.dtype))  # [B, hidden] model dtype
        return self.classifier(hd.norm(hd.act(x))).float()
