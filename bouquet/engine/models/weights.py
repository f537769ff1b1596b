"""Weight loading from safetensors (single file or sharded index); pickled ``pytorch_model.bin``
only when the deployer passes ``--allow-pickle`` (``load_weights``), through
``torch.load(weights_only=True)``.

The loader returns every checkpoint entry; ``assign_weights`` then checks names against the
module's parameters, so a missing parameter is an error naming it, and an unused checkpoint entry
is skipped only when the architecture lists it in ``IGNORED_KEYS``.
"""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open


class WeightError(ValueError):
    """Checkpoint and architecture disagree; the message lists the offending names."""


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or ``model.safetensors.index.json`` (CPU tensors).

    Raises WeightError when neither file exists (``pytorch_model.bin`` is refused on purpose).
    """
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.exists():
        files = [single]
    elif index.exists():
        with open(index, encoding="utf-8") as f:
            files = sorted({path / v for v in json.load(f)["weight_map"].values()})
    else:
        raise WeightError(f"{path} has no model.safetensors (only safetensors weights are loaded; pickled "
                          "pytorch_model.bin needs --allow-pickle)")
    out: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
        except (SafetensorError, OSError) as e:  # truncated, corrupt or unreadable
            raise WeightError(f"{file}: not a readable safetensors file ({e})") from None
    return out


def load_weights(path: Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The checkpoint of model directory ``path`` (CPU tensors): safetensors when present, else,
    only with ``allow_pickle``, ``pytorch_model.bin`` (or its indexed shards) unpickled by
    ``torch.load(weights_only=True)``, which rebuilds tensors and plain containers only and refuses
    any other object, so a crafted pickle cannot run code. Raises WeightError naming
    ``--allow-pickle`` when only pickled weights exist and it is off, or naming the refused file."""
    from bouquet.hub import HubError, weight_files

    try:
        files, pickled = weight_files(path, allow_pickle)
    except HubError as e:
        raise WeightError(str(e)) from None
    if not pickled:
        return load_safetensors(path)
    out: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            out.update(torch.load(file, map_location="cpu", weights_only=True))
        except pickle.UnpicklingError as e:  # what weights_only refuses: objects other than tensors
            raise WeightError(f"{file}: refused by torch.load(weights_only=True): {str(e).splitlines()[0]}") from None
    return out


def assign_weights(
    module: torch.nn.Module,
    state: dict[str, torch.Tensor],
    ignored: tuple[str, ...] = (),
    prefixes: tuple[str, ...] = (),
) -> set[str]:
    """Load ``state`` into ``module`` (built on the meta device) by Hugging Face names.

    ``prefixes``: checkpoint name prefixes to strip when the module lacks them (e.g. ``bert.``).
    ``ignored``: regexes of checkpoint entries the architecture does not use.
    Returns the set of parameter names loaded. Raises WeightError naming missing or unexpected
    entries, or a shape mismatch.
    """
    wanted = dict(module.named_parameters())
    wanted.update(dict(module.named_buffers()))
    renamed: dict[str, torch.Tensor] = {}
    for k, t in state.items():
        name = k
        if name not in wanted:
            for p in prefixes:
                if name.startswith(p) and name[len(p):] in wanted:
                    name = name[len(p):]
                    break
        renamed[name] = t
    pats = [re.compile(p) for p in ignored]
    unexpected = [k for k in renamed if k not in wanted and not any(p.fullmatch(k) for p in pats)]
    missing = [k for k in wanted if k not in renamed]
    if missing or unexpected:
        raise WeightError(
            f"checkpoint does not match {type(module).__name__}: missing {sorted(missing)[:5]}"
            f" ({len(missing)} total), unexpected {sorted(unexpected)[:5]} ({len(unexpected)} total)"
        )
    loaded = {k: t for k, t in renamed.items() if k in wanted}
    for k, t in loaded.items():
        if tuple(t.shape) != tuple(wanted[k].shape):
            raise WeightError(f"{k}: checkpoint shape {tuple(t.shape)} != model shape {tuple(wanted[k].shape)}")
    module.load_state_dict(loaded, strict=True, assign=True)
    return set(loaded)
