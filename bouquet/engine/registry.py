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


class UnsupportedArchitecture(ValueError):
    pass


def model_class(architecture: str) -> type[torch.nn.Module]:
    """Raises UnsupportedArchitecture listing what is supported."""
    if architecture not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    mod, cls = ARCHITECTURES[architecture]
    try:
        return getattr(importlib.import_module(f"bouquet.engine.models.{mod}"), cls)
    except ModuleNotFoundError as e:  # registered but not yet implemented in this build
        raise UnsupportedArchitecture(f"architecture {architecture!r}: {e}") from e
