"""Models from the Hugging Face Hub: which files a model needs, fetching them, finding its weights.

``--model ORG/NAME[@REVISION]`` is fetched with ``huggingface_hub.snapshot_download`` restricted to
the files bouquet reads (``allow_patterns``): safetensors weights and their index, config.json,
the tokenizer, and the sentence-transformers files (modules.json, its numbered module folders'
configs and weights). ONNX, OpenVINO, TF/Flax and pickled weights in the same repository are never
fetched; pickled ``pytorch_model.bin`` only with ``--allow-pickle`` and only when the repository has
no safetensors weights. ``huggingface_hub`` itself honours HF_HOME / HF_HUB_CACHE (where the cache
lives), HF_HUB_OFFLINE (no network: cache only), HF_TOKEN (private and gated models), HF_ENDPOINT
(a mirror) and HF_HUB_DISABLE_PROGRESS_BARS; nothing here reads the environment. Progress bars are
huggingface_hub's (tqdm, on stderr).

The launcher downloads once, before replicas start (launcher.localize_model); replicas and gateway
workers get the snapshot directory and only ever look in the cache. Every failure becomes a
HubError: one line naming the model id. Torch-free.
"""
from __future__ import annotations

import json
import logging
from fnmatch import fnmatch
from pathlib import Path

from bouquet.st_modules import ST_TRANSFORMER_CONFIGS

log = logging.getLogger("bouquet.hub")

# Files at the repository's root that bouquet (or a tokenizer built from the directory) reads.
CONFIG_FILES = (
    "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "modules.json", "config_sentence_transformers.json", *ST_TRANSFORMER_CONFIGS,
)
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")
# sentence-transformers modules live in numbered folders (1_Pooling/, 2_Dense/, 3_Normalize/).
MODULE_FILES = ("[0-9]*_*/*.json", "[0-9]*_*/*.safetensors")
MODULE_PICKLES = ("[0-9]*_*/*.bin",)
# bge-m3's lexical and ColBERT heads (modelspec.M3_HEAD_FILES): small pickled state dicts, fetched
# with --allow-pickle only.
HEAD_PICKLES = ("sparse_linear.pt", "colbert_linear.pt")


class HubError(ValueError):
    """A model could not be found or fetched; the one-line message names the id (and revision)."""


def split_revision(model: str, revision: str | None = None) -> tuple[str, str | None]:
    """``ORG/NAME@REV`` → (``ORG/NAME``, ``REV``); ``revision`` (``--revision``) is used when the id has
    none. A revision may hold '/' (``refs/pr/1``); a repository id never holds '@'.

    Raises HubError when both name a revision and they differ."""
    repo_id, at, rev = model.partition("@")
    if not at:
        return model, revision
    if not rev:
        raise HubError(f"model {model!r}: empty revision after '@'")
    if revision is not None and revision != rev:
        raise HubError(f"model {model!r} names revision {rev!r} but --revision is {revision!r}")
    return repo_id, rev


def fetch_model(model: str, revision: str | None = None, *, download: bool, allow_pickle: bool = False,
                weights: bool = True) -> Path:
    """The local snapshot directory of Hub model ``model`` (``ORG/NAME[@REVISION]``).

    ``download``: fetch what is missing (the launcher); False looks in the local cache only (a
    replica given an id). Pickled weights are fetched only with ``allow_pickle`` and when the
    repository has no safetensors weights for the model (or a Dense module). ``weights`` False:
    configs and tokenizer only (a gateway whose replicas run elsewhere, the no-op engine).
    Raises HubError (one line, naming the id) when the id is invalid, unknown, gated, the revision
    does not exist, or the files are neither cached nor downloadable (offline, Hub unreachable).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import validate_repo_id

    repo_id, rev = split_revision(model, revision)
    patterns = [*CONFIG_FILES, *SAFETENSORS_WEIGHTS, *MODULE_FILES] if weights else [*CONFIG_FILES, "[0-9]*_*/*.json"]
    if weights and allow_pickle:
        patterns += HEAD_PICKLES
    try:
        validate_repo_id(repo_id)
        if download:
            log.info("fetching %s%s from the Hugging Face Hub (or its cache)", repo_id, f"@{rev}" if rev else "")
        path = Path(snapshot_download(repo_id, revision=rev, allow_patterns=patterns, local_files_only=not download))
        if weights and allow_pickle and _needs_pickles(path):
            path = Path(snapshot_download(repo_id, revision=rev, allow_patterns=patterns + [*PICKLE_WEIGHTS, *MODULE_PICKLES],
                                          local_files_only=not download))
    except Exception as e:  # noqa: BLE001 - each huggingface_hub failure is translated by _hub_error
        raise _hub_error(e, model, repo_id, rev, download) from None
    return path


def _needs_pickles(path: Path) -> bool:
    """Whether the snapshot lacks safetensors weights for the model or for a Dense module."""
    if not any(_matching(path, SAFETENSORS_WEIGHTS)):
        return True
    modules = json.loads((path / "modules.json").read_text()) if (path / "modules.json").exists() else []
    return any(str(m.get("type", "")).endswith("Dense") and not list((path / m.get("path", "")).glob("*.safetensors"))
               for m in modules)


def _matching(path: Path, patterns: tuple[str, ...]) -> list[Path]:
    return sorted(f for f in path.iterdir() if f.is_file() and any(fnmatch(f.name, p) for p in patterns))


def weight_files(path: Path, allow_pickle: bool = False) -> tuple[list[Path], bool]:
    """The checkpoint files of model directory ``path`` and whether they are pickled.

    safetensors first: ``model.safetensors`` or the shards its ``model.safetensors.index.json``
    names. Only without them, and only with ``allow_pickle``: ``pytorch_model.bin`` or its indexed
    shards (engine/models/weights.py loads those with ``torch.load(weights_only=True)``).
    Raises HubError naming ``--allow-pickle`` when only pickled weights are present and it is off,
    or saying that no weights were found.
    """
    for single, index, pickled in (("model.safetensors", "model.safetensors.index.json", False),
                                   ("pytorch_model.bin", "pytorch_model.bin.index.json", True)):
        if (path / single).exists():
            files = [path / single]
        elif (path / index).exists():
            weight_map = json.loads((path / index).read_text())["weight_map"]
            files = sorted({path / f for f in weight_map.values()})
        else:
            continue
        if pickled and not allow_pickle:
            raise HubError(f"{path} has no safetensors weights (model.safetensors), only pickled ones ({files[0].name}), "
                           "which can run code when loaded: pass --allow-pickle to load them with "
                           "torch.load(weights_only=True), or convert them to safetensors")
        return files, pickled
    raise HubError(f"{path} has no safetensors weights (model.safetensors or its index); a model with only pickled "
                   "weights (pytorch_model.bin) is fetched and loaded only with --allow-pickle")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _hub_error(e: Exception, model: str, repo_id: str, rev: str | None, download: bool) -> HubError:
    """One line for each way a fetch fails (huggingface_hub's own messages span several lines)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import (
        GatedRepoError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
    )

    if isinstance(e, HubError):
        return e
    name = f"{repo_id!r}" + (f" (revision {rev!r})" if rev else "")
    endpoint, cache = constants.ENDPOINT, constants.HF_HUB_CACHE
    if isinstance(e, HFValidationError):
        return HubError(f"model {model!r} is neither a directory nor a Hugging Face model id (ORG/NAME[@REVISION])")
    if isinstance(e, GatedRepoError):
        return HubError(f"model {name} is gated on the Hugging Face Hub ({endpoint}): accept its terms on its page "
                        "and set HF_TOKEN")
    if isinstance(e, RepositoryNotFoundError):
        return HubError(f"model {name} is not a local directory and was not found on the Hugging Face Hub ({endpoint}); "
                        "a private model needs HF_TOKEN")
    if isinstance(e, RevisionNotFoundError):
        return HubError(f"model {repo_id!r} has no revision {rev!r} on the Hugging Face Hub ({endpoint})")
    if isinstance(e, LocalEntryNotFoundError):
        cached = f"(completely) in the local Hugging Face cache ({cache})"
        if not download:
            return HubError(f"model {name} is not {cached}; `bouquet serve` downloads it before starting replicas")
        # The launcher's --model may also be a mistyped relative path ("models/minilm"): say it is none.
        where = f"is not a local directory, nor {cached},"
        offline = getattr(constants, "is_offline_mode", lambda: constants.HF_HUB_OFFLINE)()
        if offline:
            return HubError(f"model {name} {where} and HF_HUB_OFFLINE is set, so it cannot be downloaded")
        return HubError(f"model {name} {where} and the Hugging Face Hub ({endpoint}) could not be reached "
                        f"({_first_line(e.__cause__ or e)})")
    return HubError(f"fetching model {name} from the Hugging Face Hub ({endpoint}) failed: {_first_line(e)}")
