"""BERT encoder on packed sequences (all-MiniLM, bge, e5; ms-marco / bge cross-encoders).

Parameter names are Hugging Face's (``transformers/models/bert/modeling_bert.py``) so checkpoints
load by name. Input is flat: ``input_ids [T]``, ``position_ids [T]``, ``token_type_ids [T]``;
attention runs per sequence through the engine's backend (``cu_seqlens``). No padding, no masks,
no pooling here (``engine/pooling.py`` owns that); ``head`` maps pooled rows to the output.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from bouquet.engine.attention import AttentionBackend, AttnMeta
from bouquet.engine.families import architecture_of, family, num_labels
from bouquet.engine.layers import activation, fuse_linears
from bouquet.engine.models.base import PackedModel
from bouquet.engine.fp8_rows import QRows, dense_rows, materialize
from bouquet.engine.fused_gemms import small_linear
from bouquet.engine.ops import FP8_ACTS, act_quant, add_layer_norm, linear_gelu, quantize_rows
from bouquet.engine.quant import Projection



class BertEmbeddings(nn.Module):
    """word + position (+ token type) embeddings, then LayerNorm: ids [T] → [T, hidden].

    ``type_vocab_size`` 0 builds no token-type table (DistilBERT, MPNet); ``position_offset`` is
    the row holding position 0 (RoBERTa-style tables reserve ``padding_idx + 1`` rows first)."""

    def __init__(self, vocab_size: int, hidden: int, max_positions: int, type_vocab_size: int, eps: float,
                 position_offset: int = 0) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        if type_vocab_size:
            self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.position_offset = position_offset

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "BertEmbeddings":
        """BERT / XLM-R names; the offset comes from the family row's ``positions_after_padding``."""
        return cls(cfg["vocab_size"], cfg["hidden_size"], cfg["max_position_embeddings"],
                   max(cfg.get("type_vocab_size", 1), 1), cfg.get("layer_norm_eps", 1e-12),
                   family(architecture_of(cfg)).position_offset(cfg))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids + self.position_offset)
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)  # [T, hidden]


@dataclass(frozen=True)
class LayerParts:
    """The modules of one post-norm encoder layer, whatever the checkpoint calls them."""

    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    attn_norm: nn.LayerNorm
    up: nn.Linear
    down: nn.Linear
    out_norm: nn.LayerNorm


class PostNormLayer(nn.Module):
    """BERT's post-norm encoder layer (HF ``BertLayer``), the one copy of its math:
    ``x = LN(x + o(attn(q, k, v)))``, then ``LN(x + down(act(up(x))))``. DistilBERT and MPNet
    layers are the same computation under other parameter names: each subclass builds its
    submodules with the checkpoint's names and says which is which in ``parts()``.
    """

    p: LayerParts  # the submodules, set by fuse() (plain attribute: not registered twice)
    # --quantization fp8 runs only qkv in fp8 here: on the H200 it is the one matmul whose fp8
    # version makes a bge-base step faster (64 × 512 tokens: 11.5 ms vs 12.2 bf16; with the MLP in
    # fp8 too 12.0 ms, as the GELU leaves the GEMM epilogue for a separate pass) and it moves the
    # vectors least (cosine vs bf16 ≥ 0.9996; bench/results/h200-2026-11-30e/).
    # fp8 on q/k/v only. The MLP too was measured (bench/results/h200-2026-12-01c): with the faster
    # activation + cast kernel a bge-base step is no faster (16k-token graph replay 5.74 vs 6.14 ms
    # bf16, but throughput 5,273 vs 5,290 emb/s; batch 1 +1-4% GPU time), the cosine to bf16 falls
    # from 0.9996 to 0.9974, and the real all-MiniLM-L6-v2 misses the load check (0.9943 < 0.995).
    FP8_KINDS: tuple[str, ...] = ("qkv",)
    # the layer's four matmuls (qkv fused: weight [3h, h], bias [3h]); set by fuse()
    qkv: Projection
    o: Projection
    up: Projection
    down: Projection
    small_gemms = False  # the engine's choice (Engine(small_gemms=...)): small steps' up + bias + act as one GEMM

    def __init__(self, hidden: int, num_heads: int, act_name: str) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden // num_heads
        self.act_name = act_name
        activation(act_name)  # unknown activations fail at load time

    def parts(self) -> LayerParts:
        raise NotImplementedError

    def fuse(self) -> None:
        """Concatenate q/k/v into one [3h, h] matmul (one GEMM instead of three)."""
        self.p = self.parts()
        w, b = fuse_linears(self.p.q, self.p.k, self.p.v)
        assert b is not None  # these encoders' projections always carry biases
        self.qkv = Projection(w, b, "qkv")
        # o and down are read by add + LayerNorm only (fp8 scales deferred, split-K parts added
        # there: quant.py, splitk.py), up by the activation (fp8 scales deferred)
        self.o, self.up, self.down = (Projection.of(m, k, defer=True, split_k=k != "up")
                                      for m, k in ((self.p.o, "o"), (self.p.up, "up"), (self.p.down, "down")))

    def projections(self) -> list[Projection]:
        return [self.qkv, self.o, self.up, self.down]

    def forward(self, x: "torch.Tensor | QRows", attn: AttentionBackend, meta: AttnMeta,
                bias: torch.Tensor | None = None) -> "torch.Tensor | QRows":
        """x [T, hidden] → [T, hidden] in the model dtype; ``bias`` [H, L, L]: an additive score
        bias by in-sequence positions (MPNet's relative positions; ``AttentionBackend.attend``).

        fp8 (quant.py): each kernel that writes a matmul's input writes it in fp8 when that
        matmul runs in fp8 for this step's size. The output is then QRows whose ``dense`` is the
        model-dtype output, so the next layer's qkv GEMM reads the fp8 rows the last norm kernel
        wrote; a model-dtype input is quantized here (the first layer's)."""
        T, h = x.shape
        p = self.p
        if self.qkv.use_fp8(T) and not isinstance(x, QRows):
            x = replace(quantize_rows(x), dense=x)
        elif not self.qkv.use_fp8(T):
            x = dense_rows(x)
        q, k, v = self.qkv(x).view(T, 3, self.num_heads, self.head_dim).unbind(1)  # [T, H, D] each
        a = attn.attend(q, k, v, meta, bias=bias).reshape(T, h)  # [T, hidden]
        a = quantize_rows(a) if self.o.use_fp8(T) else a  # FlashAttention / cuDNN write bf16: one cast pass
        x = add_layer_norm(self.o(a), dense_rows(x), p.attn_norm, self.up.use_fp8(T))  # one fused kernel on CUDA
        down8 = self.down.use_fp8(T)
        if self.up.use_fp8(T):  # up GEMM (bias in its epilogue), then the activation and the fp8 cast in one kernel
            u = self.up(x)
            g = act_quant(u, FP8_ACTS[self.act_name]) if down8 else activation(self.act_name)(materialize(u))
        else:
            xd = dense_rows(x)
            g = small_linear(xd, p.up.weight, p.up.bias, self.act_name) if self.small_gemms else None  # ≤ 128 tokens
            if g is None and self.up.cpu is not None:  # the engine's CPU kernel (cpu_linear.py)
                g = activation(self.act_name)(self.up(xd))
            g = linear_gelu(xd, p.up, self.act_name) if g is None else g  # [T, intermediate]
            g = quantize_rows(g) if down8 else g
        return add_layer_norm(self.down(g), dense_rows(x), p.out_norm, self.qkv.use_fp8(T))


def modules(**children: nn.Module) -> nn.ModuleDict:
    """A container whose children carry the checkpoint's names (``attention.self.query``): the
    Hugging Face layout by name, without a class per container. Children read as attributes."""
    return nn.ModuleDict(children)


def dense_norm(i: int, h: int, eps: float) -> nn.ModuleDict:
    """``dense`` [i → h] + ``LayerNorm`` [h]: BERT's attention output and FFN output blocks, and the
    MLM head's transform."""
    return modules(dense=nn.Linear(i, h), LayerNorm=nn.LayerNorm(h, eps=eps))


class BertLayer(PostNormLayer):
    def __init__(self, cfg: dict[str, Any]) -> None:
        h, i, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg.get("layer_norm_eps", 1e-12)
        super().__init__(h, cfg["num_attention_heads"], cfg.get("hidden_act", "gelu"))
        self.attention = modules(self=modules(query=nn.Linear(h, h), key=nn.Linear(h, h), value=nn.Linear(h, h)),
                                 output=dense_norm(h, h, eps))
        self.intermediate = modules(dense=nn.Linear(h, i))
        self.output = dense_norm(i, h, eps)

    def parts(self) -> LayerParts:
        s, o = self.attention.self, self.attention.output
        return LayerParts(s.query, s.key, s.value, o.dense, o.LayerNorm, self.intermediate.dense,
                          self.output.dense, self.output.LayerNorm)


class BertEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class BertPooler(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.dense = nn.Linear(h, h)


class BertModel(PackedModel):
    """Embedding model: hidden states [T, hidden] → (pooled outside) → identity head."""

    IGNORED_KEYS: tuple[str, ...] = (r"pooler\..*", r"embeddings\.position_ids", r"cls\..*", r"lm_head\..*")
    PREFIXES: tuple[str, ...] = ("bert.", "model.")
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings.from_config(cfg)
        self.encoder = BertEncoder(cfg)
        self.attn = attn

    def fuse(self) -> None:
        for layer in self.encoder.layer:
            layer.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        """Packed ids/positions/types [T] int32 → hidden [T, hidden] in the model dtype."""
        x = self.embeddings(input_ids, position_ids, token_type_ids)  # [T, hidden]
        for layer in self.encoder.layer:
            x = layer(x, self.attn, meta)
        return dense_rows(x)



class BertForSequenceClassification(PackedModel):
    """Cross-encoder (ms-marco MiniLM, bge-reranker on BERT): CLS row → pooler (dense + tanh) →
    classifier → logits [B, num_labels] float32. The engine returns raw logits; the API layer
    applies the sigmoid. Follows HF ``BertForSequenceClassification`` (dropout is identity at
    inference).

    Subclasses change the encoder (``encoder_cls``), its attribute name (``base_name``, the
    checkpoint prefix) and the head (``build_head``/``head``).
    """

    IGNORED_KEYS: tuple[str, ...] = (r"bert\.embeddings\.position_ids",)
    PREFIXES: tuple[str, ...] = ()
    encoder_cls: type[PackedModel] = BertModel
    base_name = "bert"
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        setattr(self, self.base_name, self.encoder_cls(cfg, attn))
        self.build_head(cfg)

    def build_head(self, cfg: dict[str, Any]) -> None:
        self.base.pooler = BertPooler(cfg["hidden_size"])
        self.classifier = nn.Linear(cfg["hidden_size"], num_labels(cfg))

    @property
    def base(self) -> PackedModel:
        return getattr(self, self.base_name)

    def fuse(self) -> None:
        self.base.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        """Packed ids/positions/types [T] int32 → hidden [T, hidden] in the model dtype."""
        return self.base(input_ids, position_ids, token_type_ids, meta)

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled CLS rows [B, hidden] float32 → logits [B, num_labels] float32."""
        p = self.base.pooler.dense
        return self.classifier(torch.tanh(p(pooled.to(p.weight.dtype)))).float()
