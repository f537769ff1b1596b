"""A model directory's sentence-transformers module list (``modules.json``), read without torch.

sentence-transformers runs a model as a chain of modules: the transformer, then ``Pooling``, then
optionally ``Dense`` layers and ``Normalize``. bouquet runs the transformer and pooling in
``engine/heads/pooling.py``, the steps after pooling (``Dense``, a ``Normalize`` between them) in
``engine/heads/st_head.py``, and a final ``Normalize`` in ``pooling.finalize``. Any other module would
change the vectors in a way bouquet does not reproduce, so it is refused at start-up by name
instead of being skipped.

Reference: sentence-transformers 6.2 (``sentence_transformer/modules/pooling.py``,
``base/modules/dense.py``, ``base/modules/normalize.py``; modules.json ``type`` strings name the
class, e.g. ``sentence_transformers.models.Dense`` or ``sentence_transformers.base.modules.dense.Dense``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# The Transformer module's config under the names sentence-transformers' versions wrote; it reads the first found
ST_TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                          "sentence_camembert_config.json", "sentence_albert_config.json",
                          "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")
# Pooling config modes (sentence-transformers' names) → bouquet's pooling names (engine/heads/pooling.py)
POOLING_NAMES = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len",
                 "weightedmean": "weightedmean", "lasttoken": "last"}
# The legacy boolean keys, in the order sentence-transformers concatenates their outputs.
_LEGACY_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# Dense activations bouquet runs: the torch.nn classes without parameters or arguments that
# sentence-transformers writes as ``activation_function`` (its ``fullname`` of the module).
ACTIVATIONS = {"Tanh": "tanh", "Identity": "identity", "ReLU": "relu", "GELU": "gelu", "Sigmoid": "sigmoid",
               "SiLU": "silu"}
# SpladePooling (pooling_strategy, activation_function) → bouquet's pooling name (engine/heads/pooling.py)
SPLADE_POOLINGS = {("max", "relu"): "splade", ("sum", "relu"): "splade_sum", ("max", "log1p_relu"): "splade_log1p",
                   ("sum", "log1p_relu"): "splade_sum_log1p"}


class ModuleError(ValueError):
    """modules.json declares a module, or a module setting, bouquet does not run."""


@dataclass(frozen=True)
class DenseSpec:
    """One ``Dense`` module: ``y = act(x @ W.T + b)`` (+ ``x`` or ``x @ R.T`` with ``use_residual``).

    ``path`` is the module folder (``2_Dense``) holding ``model.safetensors`` with ``linear.weight``
    [out, in], ``linear.bias`` [out] and, for a residual of another size, ``residual.weight``."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a value of ACTIVATIONS
    use_residual: bool = False


Step = DenseSpec | Literal["normalize"]


@dataclass(frozen=True)
class StModules:
    """What modules.json asks for after the transformer.

    pooling         "+"-joined bouquet pooling names (``"cls"``, ``"mean+max"``), None: no Pooling
    include_prompt  False: prompt tokens are left out of pooling (INSTRUCTOR-style)
    steps           run by the engine on pooled rows, in order: Dense layers and any Normalize
                    that a Dense follows
    normalize       the chain ends with Normalize (applied in ``pooling.finalize``)
    dimension       the output size after the last Dense (None: no Dense)
    sparse          a SPLADE chain (MLMTransformer, SpladePooling): vocabulary-sized rows
    """

    pooling: str | None = None
    include_prompt: bool = True
    steps: tuple[Step, ...] = field(default_factory=tuple)
    normalize: bool = False
    dimension: int | None = None
    sparse: bool = False


def _read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _class_name(kind: str) -> str:
    """The class of a modules.json ``type``, when it is one of sentence-transformers' own ("" else)."""
    return kind.rsplit(".", 1)[-1] if kind.startswith("sentence_transformers.") else ""


def pooling_modes(cfg: dict[str, Any], where: Path) -> tuple[str, ...]:
    """A ``1_Pooling/config.json`` → its modes in output order, sentence-transformers' names.

    Reads the current key (``pooling_mode``: a name or a list) or the legacy booleans
    (``pooling_mode_cls_token`` ...; none set means mean, as sentence-transformers reads them).
    Raises ModuleError naming an unknown mode."""
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(m for k, m in _LEGACY_KEYS.items() if cfg.get(k)) or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    for m in modes:
        if m not in POOLING_NAMES:
            raise ModuleError(f"{where}: unknown pooling mode {m!r}; supported: {sorted(POOLING_NAMES)}")
    return modes


def _dense(path: Path, cfg: dict[str, Any], in_dim: int) -> DenseSpec:
    act_ref = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))  # its default
    act = ACTIVATIONS.get(act_ref.rsplit(".", 1)[-1]) if act_ref.startswith("torch.nn.") else None
    if act is None:
        raise ModuleError(f"{path}: Dense activation_function {act_ref!r} is not supported; supported: "
                          f"torch.nn {sorted(ACTIVATIONS)}")
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, "sentence_embedding") not in ("sentence_embedding", None):
            raise ModuleError(f"{path}: Dense {key}={cfg[key]!r} is not supported (only the pooled sentence_embedding)")
    d = DenseSpec(path, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)), act,
                  bool(cfg.get("use_residual", False)))
    if d.in_features != in_dim:
        raise ModuleError(f"{path}: Dense in_features={d.in_features} but the vectors before it have {in_dim} floats")
    if not (path / "model.safetensors").exists():
        pickle = (path / "pytorch_model.bin").exists()
        raise ModuleError(f"{path}: no model.safetensors for this Dense module"
                          + (" (pytorch_model.bin is a pickle, which bouquet never loads; convert it with "
                             "safetensors)" if pickle else ""))
    return d


def read_modules(path: Path, modules: list[dict[str, Any]], hidden_size: int) -> StModules:
    """modules.json's entries (already read) of the directory ``path`` → StModules.

    ``hidden_size`` is the transformer's output width (the input of Pooling). Raises ModuleError
    naming the first module, mode, activation or setting bouquet does not run."""
    pooling: str | None = None
    include_prompt = True
    steps: list[Step] = []
    normalize = sparse = False
    dim = hidden_size
    dense_dim: int | None = None
    for i, m in enumerate(modules):
        kind = str(m.get("type", ""))
        name = _class_name(kind)
        where = path / str(m.get("path", ""))
        if normalize and name != "Normalize":
            # A module after Normalize would act on normalized vectors; finalize normalizes last.
            steps.append("normalize")
            normalize = False
        if name in ("Transformer", "MLMTransformer") and i == 0:
            sparse = name == "MLMTransformer"
            continue
        if name == "SpladePooling":
            cfg = _read_json(where / "config.json") if (where / "config.json").exists() else {}
            key = (cfg.get("pooling_strategy", "max"), cfg.get("activation_function", "relu"))
            if key not in SPLADE_POOLINGS:
                raise ModuleError(f"{where}: SpladePooling {key} is not supported; supported: {sorted(SPLADE_POOLINGS)}")
            pooling, sparse = SPLADE_POOLINGS[key], True
        elif name == "Pooling":
            cfg = _read_json(where / "config.json")
            modes = pooling_modes(cfg, where)
            pooling = "+".join(POOLING_NAMES[x] for x in modes)
            include_prompt = bool(cfg.get("include_prompt", True))
            dim = hidden_size * len(modes)
        elif name == "Dense":
            d = _dense(where, _read_json(where / "config.json"), dim)
            steps.append(d)
            dim = dense_dim = d.out_features
        elif name == "Normalize":
            cfg = _read_json(where / "config.json") if (where / "config.json").exists() else {}
            if cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
                raise ModuleError(f"{where}: Normalize of {cfg['module_input_name']!r} is not supported")
            normalize = True
        else:
            raise ModuleError(f"modules.json of {path} declares module {i} {kind!r} (path {m.get('path')!r}), which "
                              "bouquet does not run; supported: Transformer, Pooling, Dense, Normalize, and "
                              "MLMTransformer with SpladePooling")
    return StModules(pooling, include_prompt, tuple(steps), normalize, dense_dim, sparse)
