"""BERT encoder on packed sequences (all-MiniLM, bge, e5; ms-marco / bge cross-encoders).

Parameter names are Hugging Face's (``transformers/models/bert/modeling_bert.py``) so checkpoints
load by name. Input is flat: ``input_ids [T]``, ``position_ids [T]``, ``token_type_ids [T]``;
attention runs per sequence through the engine's backend (``cu_seqlens``). No padding, no masks,
no pooling here (``engine/heads/pooling.py`` owns that); ``head`` maps pooled rows to the output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bouquet.engine.attention.backends import AttentionBackend, AttnMeta
from bouquet.families import architecture_of, family, num_labels
from bouquet.engine.kernels.rows import QRows, dense_rows
from bouquet.engine.kernels.layers import activation, fuse_linears
from bouquet.engine.linear.base import Linear
from bouquet.engine.models.base import PackedModel, table
from bouquet.engine.kernels.ops import add_layer_norm


class BertEmbeddings(nn.Module):
    """word + position (+ token type) embeddings, then LayerNorm: ids [T] → [T, hidden].

    ``type_vocab_size`` 0 builds no token-type table (DistilBERT, MPNet); ``position_offset`` is
    the row holding position 0 (RoBERTa-style tables reserve ``padding_idx + 1`` rows first)."""

    def __init__(self, vocab_size: int, hidden: int, max_positions: int, type_vocab_size: int, eps: float,
                 position_offset: int = 0) -> None:
        super().__init__()
        self.word_embeddings = table(vocab_size, hidden)
        self.position_embeddings = table(max_positions, hidden)
        if type_vocab_size:
            self.token_type_embeddings = table(type_vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.position_offset = position_offset

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "BertEmbeddings":
        """BERT / XLM-R names; the offset comes from the family row's ``positions_after_padding``."""
        return cls(cfg["vocab_size"], cfg["hidden_size"], cfg["max_position_embeddings"],
                   max(cfg.get("type_vocab_size", 1), 1), cfg.get("layer_norm_eps", 1e-12),
                   family(architecture_of(cfg)).position_offset(cfg))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        pos = position_ids + self.position_offset if self.position_offset else position_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)
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
    # --quantization fp8 runs only qkv in fp8 here (docs/decisions.md, "the kernel plan": the MLP in
    # fp8 too was no faster and moved the vectors more)
    FP8_KINDS: tuple[str, ...] = ("qkv",)
    # the layer's four matmuls (qkv fused: weight [3h, h], bias [3h]); set by fuse()
    qkv: Linear
    o: Linear  # read by add + LayerNorm only
    up: Linear  # with the activation: read by the down projection
    down: Linear  # read by add + LayerNorm only

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
        self.qkv = Linear(w, b, "qkv")
        self.o = Linear.of(self.p.o, "o", readers="norm")
        self.up = Linear.of(self.p.up, "up", readers="act", act=self.act_name)
        self.down = Linear.of(self.p.down, "down", readers="norm")

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o, self.up, self.down]

    def forward(self, x: "torch.Tensor | QRows", attn: AttentionBackend, meta: AttnMeta,
                bias: torch.Tensor | None = None) -> "torch.Tensor | QRows":
        """x [T, hidden] → [T, hidden] in the model dtype; ``bias`` [H, L, L]: an additive score
        bias by in-sequence positions (MPNet's relative positions; ``AttentionBackend.attend``).

        Each kernel that writes a matmul's input writes it in the form that matmul reads (fp8 rows
        where it runs in fp8: linear/base.py); the output is QRows whose ``dense`` is the model-dtype
        output when the next layer's qkv reads fp8."""
        T, h = x.shape
        p = self.p
        x = self.qkv.rows(x)
        q, k, v = self.qkv(x).view(T, 3, self.num_heads, self.head_dim).unbind(1)  # [T, H, D] each
        a = attn.attend(q, k, v, meta, bias=bias).reshape(T, h)  # [T, hidden]
        x = add_layer_norm(self.o(self.o.rows(a)), dense_rows(x), p.attn_norm, self.up.reads_fp8(T))
        g = self.up(x, quantize_out=self.down.reads_fp8(T))  # [T, intermediate]
        return add_layer_norm(self.down(g), dense_rows(x), p.out_norm, self.qkv.reads_fp8(T))


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
