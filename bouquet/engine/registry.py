"""Maps config.json's ``architectures`` string to the class that implements it, lazily imported."""
from __future__ import annotations

import importlib

import torch

# architecture → (module under bouquet.engine.models, class name)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "BertModel": ("bert", "BertModel"),
    "BertForSequenceClassification": ("bert", "BertForSequenceClassification"),
    "XLMRobertaModel": ("xlm_roberta", "XLMRobertaModel"),
    "XLMRobertaForSequenceClassification": ("xlm_roberta", "XLMRobertaForSequenceClassification"),
    "Qwen3Model": ("qwen3", "Qwen3Model"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
}
# Checkpoints whose architecture names a head the task does not use: Qwen3-Embedding ships as
# Qwen3ForCausalLM, but embedding needs only the decoder (its lm_head is skipped explicitly).
TASK_OVERRIDES: dict[tuple[str, str], tuple[str, str]] = {
    ("Qwen3ForCausalLM", "embed"): ("qwen3", "Qwen3Model"),
}


class UnsupportedArchitecture(ValueError):
    pass


def model_class(architecture: str, task: str = "embed") -> type[torch.nn.Module]:
    """The class serving ``architecture`` for ``task`` ("embed" or "score").

    Raises UnsupportedArchitecture listing what is supported."""
    if architecture not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    mod, cls = TASK_OVERRIDES.get((architecture, task), ARCHITECTURES[architecture])
    try:
        return getattr(importlib.import_module(f"bouquet.engine.models.{mod}"), cls)
    except ModuleNotFoundError as e:  # registered but not yet implemented in this build
        raise UnsupportedArchitecture(f"architecture {architecture!r}: {e}") from e
