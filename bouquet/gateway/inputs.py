"""Validation of request bodies, shared by the OpenAI and TEI routes.

Every check raises APIError(400) naming the field (``param``) and the offending value or index;
nothing here touches the network or the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bouquet.gateway.errors import APIError, bad_request, json_type, shown

LongInput = Literal["truncate", "error", "chunk_mean", "chunks"]
LONG_INPUT_MODES = ("truncate", "error", "chunk_mean", "chunks")


@dataclass(frozen=True)
class TextInputs:
    texts: list[str] | None  # either texts …
    token_ids: list[list[int]] | None  # … or pre-tokenized sequences
    single: bool  # the request sent one bare item (not a list)

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or [])


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _too_big(x: Any) -> bool:
    # orjson reads an integer past 64 bits as a float: name it out of range, not "a number"
    return isinstance(x, float) and abs(x) >= 2**63


def is_token_id(x: Any) -> bool:
    """True for a JSON integer: an int (not a bool), or one past 64 bits that orjson read as a float
    (``parse_inputs`` then names it out of range)."""
    return _is_int(x) or _too_big(x)


def parse_inputs(value: Any, param: str, max_inputs: int) -> TextInputs:
    """A string, a list of strings, a list of token ids, or a list of token-id lists.

    Raises APIError 400 for a missing/empty/mistyped value (naming the index) and 413 beyond
    ``max_inputs`` items (a bare list of token ids is one item, however many ids it holds).
    """
    if value is None:
        raise bad_request(f"'{param}' is required", param, "missing_required_parameter")
    if isinstance(value, str):
        if not value:
            raise bad_request(f"'{param}' is an empty string; every input needs at least one character", param, "empty_input")
        return TextInputs([value], None, True)
    if not isinstance(value, list):
        raise bad_request(f"'{param}' must be a string, a list of strings, or a list of token ids; got {json_type(value)}",
                          param, "invalid_type")
    if not value:
        raise bad_request(f"'{param}' is an empty list; send at least one input", param, "empty_input")
    first = value[0]
    # A bare list of token ids is one input (one sequence), whatever its length: its ids are
    # bounded by --max-request-tokens once truncated or cut into windows, not by --max-inputs.
    if len(value) > max_inputs and not (_is_int(first) or _too_big(first)):
        raise APIError(413, f"'{param}' has {len(value)} items; the limit is {max_inputs} per request (--max-inputs)",
                       param, "too_many_inputs")
    if isinstance(first, str):
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise bad_request(f"{param}[{i}] must be a string like the other items, got {json_type(v)}", f"{param}[{i}]", "invalid_type")
            if not v:
                raise bad_request(f"{param}[{i}] is an empty string; every input needs at least one character",
                                  f"{param}[{i}]", "empty_input")
        return TextInputs(list(value), None, False)
    if _is_int(first) or _too_big(first):
        _check_ids(value, param)
        return TextInputs(None, [value], True)
    if isinstance(first, list):
        for i, v in enumerate(value):
            if not isinstance(v, list):
                raise bad_request(f"{param}[{i}] must be a list of token ids, got {json_type(v)}", f"{param}[{i}]", "invalid_type")
            if not v:
                raise bad_request(f"{param}[{i}] is an empty list of token ids", f"{param}[{i}]", "empty_input")
            _check_ids(v, f"{param}[{i}]")
        return TextInputs(None, list(value), False)
    # "got a number" for 1.5 read as a contradiction (a token id is a number): show a float as written
    got = f"{shown(first)}, not an integer" if isinstance(first, float) else json_type(first)
    raise bad_request(f"{param}[0] must be a string, a token id or a list of token ids; got {got}",
                      f"{param}[0]", "invalid_type")


def _check_ids(ids: list[Any], param: str) -> None:
    # The common case checked at C speed: only ints (bool is its own type), all in int32 range.
    # A Python loop over each id cost ~13 ms per 100 × 512 ids (bench/results/*gateway-ids*).
    if set(map(type, ids)) == {int} and -(2**31) <= min(ids) and max(ids) < 2**31:
        return
    # ``param`` names the input (one sequence), the message the position in it, as the replica's
    # vocabulary check does ("input[1] has token id -1 at position 2"): a bare list of ids is one
    # input, ``input``, not ``input[j]``, which would read as the j-th input.
    for j, t in enumerate(ids):
        if _too_big(t):
            # the parser kept only a float of it (1.8446744073709552e+19 for 2**64): no number the client wrote
            raise bad_request(f"{param} has a token id past 64 bits at position {j}, out of range", param, "invalid_token_id")
        if not _is_int(t):
            raise bad_request(f"{param} has {json_type(t)} at position {j}; token ids are integers", param, "invalid_type")
        if not -(2**31) <= t < 2**31:
            raise bad_request(f"{param} has token id {t} at position {j}, out of range", param, "invalid_token_id")


# The field each of these names is elsewhere: a body written for one API and posted to another's route
# (TEI's {"inputs"} to /v1/embeddings, Cohere's {"documents"} to TEI's /rerank) is told which it is.
_OTHER_NAME = {"input": ("inputs", "TEI's name for it (POST /embed)"),
               "inputs": ("input", "the OpenAI API's name for it (POST /v1/embeddings)"),
               "documents": ("texts", "TEI's name for it (POST /rerank)"),
               "texts": ("documents", "the Cohere and Jina name for it (POST /v1/rerank)")}


def required_field(body: dict[str, Any], key: str) -> Any:
    """``body[key]`` (None when absent: the caller's parser says it is required). Raises APIError 400
    naming both fields when it is absent and the body holds another API's name for it."""
    v = body.get(key)
    other, where = _OTHER_NAME.get(key, ("", ""))
    if v is None and other and body.get(other) is not None:
        raise bad_request(f"'{key}' is required; this body has '{other}', {where}", key, "missing_required_parameter")
    return v


def opt_bool(body: dict[str, Any], key: str) -> bool | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise bad_request(f"'{key}' must be true or false, got {shown(v)}", key, "invalid_type")
    return v


def opt_int(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if _too_big(v):
        raise bad_request(f"'{key}' = {shown(v)} is out of range", key, "invalid_value")
    if not _is_int(v):
        raise bad_request(f"'{key}' must be an integer, got {shown(v)}", key, "invalid_type")
    return int(v)


def opt_str(body: dict[str, Any], key: str, choices: tuple[str, ...] | None = None) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_request(f"'{key}' must be a string, got {json_type(v)}", key, "invalid_type")
    if choices is not None and v not in choices:
        raise bad_request(f"'{key}' must be one of {list(choices)}, got {shown(v)}", key, "invalid_value")
    return v


def check_dimensions(dims: int | None, full: int, allowed: tuple[int, ...], param: str = "dimensions") -> int | None:
    """Matryoshka size: None, or 1 ≤ dims ≤ full (and among ``allowed`` when the model lists
    its sizes). Raises APIError 400 naming ``param``."""
    if dims is None:
        return None
    if dims <= 0 or dims > full:
        raise bad_request(f"'{param}' must be between 1 and {full} for this model, got {dims}", param, "invalid_value")
    if allowed and dims not in allowed and dims != full:
        raise bad_request(f"'{param}' must be one of {sorted(allowed)} for this model, got {dims}", param, "invalid_value")
    return None if dims == full else dims


def long_input_mode(body: dict[str, Any], default_truncate: bool) -> LongInput:
    """Resolve ``truncate`` and ``long_input`` into one mode. Raises 400 when they disagree."""
    truncate = opt_bool(body, "truncate")
    mode = opt_str(body, "long_input", LONG_INPUT_MODES)
    if mode is not None and truncate is not None:
        if (truncate and mode != "truncate") or (not truncate and mode == "truncate"):
            raise bad_request(f"'truncate': {str(truncate).lower()} contradicts 'long_input': {mode!r}", "long_input", "invalid_value")
    if mode is not None:
        return mode  # type: ignore[return-value]
    if truncate is None:
        truncate = default_truncate
    return "truncate" if truncate else "error"


def direction(body: dict[str, Any]) -> Literal["left", "right"]:
    """TEI's ``truncation_direction``: ``Left`` / ``Right`` in any case, "right" when absent.
    Raises APIError 400 for anything else ("" included)."""
    v = opt_str(body, "truncation_direction")
    if v is None:
        return "right"
    if v.lower() not in ("left", "right"):
        raise bad_request(f"'truncation_direction' must be 'Left' or 'Right', got {shown(v)}", "truncation_direction", "invalid_value")
    return "left" if v.lower() == "left" else "right"
