"""What the gateway's tokenization returns and raises (bouquet/tokenization.py makes them): the
ids of a batch (``Encoded``), the refusals of an input (``BadTokenId``, ``TooLong``, ``NoRoom``),
and the model's tokenizer.json read once (``read_tokenizer``). A module of its own so the routes
and the launcher name these without the tokenizers' fast paths behind them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from bouquet.modelspec import ModelError, ModelSpec


class BadTokenId(ValueError):
    """Pre-tokenized input ``index`` holds an id outside the vocabulary (or no id at all).
    ``detail``: the message without the input's name, for callers that name it their way
    (the gateway: ``input`` or ``input[3]``)."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"input {index} {detail}")
        self.index, self.detail = index, detail


class TooLong(ValueError):
    """Input ``index`` has ``count`` tokens (``at_least``: that many in its start alone), more than
    the model's ``limit``; ``detail`` as BadTokenId's."""

    def __init__(self, index: int, count: int, limit: int, at_least: bool = False) -> None:
        counted = f"at least {count} tokens (counted in its start only)" if at_least else f"{count} tokens"
        self.detail = f"has {counted}, more than the model's maximum of {limit} (truncation is off)"
        super().__init__(f"input {index} {self.detail}")
        self.index, self.count, self.limit, self.at_least = index, count, limit, at_least


class NoRoom(ValueError):
    """Pair ``index``'s first text leaves its second no token within the model's limit."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"pair {index}: {detail}")
        self.index, self.detail = index, detail


@dataclass(frozen=True)
class Encoded:
    ids: list[np.ndarray]  # int32 [len_i] each, special tokens included
    type_ids: list[np.ndarray] | None  # only for pairs (cross-encoders)
    num_tokens: int

    @staticmethod
    def joined(parts: list[Encoded]) -> Encoded:
        """Consecutive parts of one batch (shards tokenized apart) as one, in order."""
        if len(parts) == 1:
            return parts[0]
        types = None if parts[0].type_ids is None else [t for p in parts for t in p.type_ids or []]
        return Encoded([x for p in parts for x in p.ids], types, sum(p.num_tokens for p in parts))


def read_tokenizer(spec: ModelSpec) -> Tokenizer:
    """The model's tokenizer.json as a ``tokenizers`` Tokenizer. Raises ModelError naming the file
    when ``tokenizers`` cannot read it."""
    try:
        return Tokenizer.from_file(str(spec.tokenizer_path))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise ModelError(f"{spec.tokenizer_path} cannot be read by tokenizers: {e}") from None


def appended_tokens(spec: ModelSpec, base: Tokenizer) -> int:
    """Tokens the gateway adds after ``base``'s (the model's tokenizer.json) own post-processor:
    1 where the model pools on an EOS (``spec.append_eos_id``, Qwen3-Embedding's <|endoftext|>)
    that the file does not append itself, else 0. ``base`` without padding and truncation
    (``no_padding``, ``no_truncation``): a padded encoding ends in the pad id."""
    eos = spec.append_eos_id
    return 1 if eos is not None and base.encode("a").ids[-1:] != [eos] else 0
