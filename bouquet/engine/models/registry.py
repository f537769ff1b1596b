"""Maps config.json's ``architectures`` string to the class that implements it, lazily imported.

The rows live in ``families.py`` (one per architecture, shared with ``bouquet.modelspec``).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from bouquet.families import FAMILIES, unsupported

if TYPE_CHECKING:
    from bouquet.engine.models.base import PackedModel

# The architectures this build serves (the keys of the family table).
ARCHITECTURES: tuple[str, ...] = tuple(FAMILIES)


class UnsupportedArchitecture(ValueError):
    pass


def model_class(architecture: str, task: str = "embed") -> "type[PackedModel]":
    """The class serving ``architecture`` for ``task`` ("embed" or "score"): the row's class, or
    its ``embed_cls`` for "embed" (a checkpoint whose head the embedding task does not use).

    Raises UnsupportedArchitecture listing what is supported."""
    row = FAMILIES.get(architecture)
    if row is None:
        raise UnsupportedArchitecture(unsupported(architecture))
    cls = row.embed_cls if task == "embed" and row.embed_cls else row.cls
    try:
        return getattr(importlib.import_module(f"bouquet.engine.models.{row.module}"), cls)
    except ModuleNotFoundError as e:  # registered but not yet implemented in this build
        raise UnsupportedArchitecture(f"architecture {architecture!r}: {e}") from e
