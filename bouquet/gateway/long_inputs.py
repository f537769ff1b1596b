"""Inputs longer than the model allows: overlapping windows (``long_input`` ``chunk_mean`` / ``chunks``).

Each input is cut into windows that fit the model (special tokens added to each); consecutive
windows share ``overlap_for(max_len)`` tokens so that no sentence is seen only cut in half. Every
window is embedded as a request would embed it (same ``normalize`` and ``dimensions``); then

- ``chunk_mean``: one vector per input, the mean of its window vectors weighted by each window's
  token count (special tokens excluded), L2-normalized again when normalization is on;
- ``chunks``: the same mean as the input's ``embedding``, plus one entry per window with its
  vector and offsets (see docs/api.md, "Long inputs").

A prompt (``prompt`` / ``prompt_name``) is prepended to the text before it is cut, so only the
first window carries it; offsets stay in the input's own coordinates (the prompt's tokens and
characters are not counted). Inputs that fit in one window give exactly their ordinary embedding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bouquet.gateway.core import Gateway, item_param
from bouquet.gateway.errors import bad_request
from bouquet.gateway.inputs import TextInputs
from bouquet.proto import bouquet_pb2 as pb
from bouquet.tokenized import BadTokenId



def overlap_for(max_len: int) -> int:
    """Tokens shared by consecutive windows: 1/8 of the window, at most 128."""
    return min(128, max_len // 8)


@dataclass(frozen=True)
class Window:
    """One window of an input. Token offsets count the input's own tokens (no special tokens),
    end exclusive; character offsets index the text (None for token-id inputs)."""

    vector: np.ndarray  # float32 [D]
    tokens: tuple[int, int]
    chars: tuple[int, int] | None

    def to_json(self, encoded_vector: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"embedding": encoded_vector, "tokens": list(self.tokens)}
        if self.chars is not None:
            out["chars"] = list(self.chars)
        return out


def _id_windows(seq: list[int], size: int, overlap: int) -> list[tuple[np.ndarray, int, int, int, int]]:
    step = max(1, size - overlap)
    out, start = [], 0
    while True:
        end = min(start + size, len(seq))
        out.append((np.asarray(seq[start:end], dtype=np.int64), start, end, 0, 0))
        if end == len(seq):
            return out
        start += step


async def embed_long(gw: Gateway, inputs: TextInputs, prompt: str | None, normalize: bool | None,
                     dims: int | None, priority: int = pb.PRIORITY_AUTO,
                     param: str = "input") -> tuple[np.ndarray, int, list[list[Window]]]:
    """Inputs → (vectors float32 [N, D], tokens embedded over all windows, windows per input).

    Raises APIError 400 naming ``param[i]`` for token ids outside the vocabulary, 413 when the
    windows hold more tokens than ``--max-request-tokens``.
    """
    tok = gw.tokenizer
    overlap = overlap_for(tok.max_len)
    if inputs.texts is not None:
        texts = [prompt + t for t in inputs.texts] if prompt else inputs.texts
        await gw.check_token_budget(texts, param)  # the windows hold at least every token of the text
        per_input = await gw.run_tokenizer(tok.windows, texts, overlap, len(prompt or ""))
        has_chars = True
    else:
        size = gw.spec.max_seq_length
        per_input = [_id_windows(s, size, overlap) for s in inputs.token_ids or []]
        has_chars = False
        for i, seq in enumerate(inputs.token_ids or []):
            try:  # the vocabulary check on the whole input (the ids are checked before any cut)
                tok.check_ids([seq], truncate=True)
            except BadTokenId as e:
                where = item_param(param, inputs, i)
                raise bad_request(f"{where} {e.detail}", where, "invalid_token_id") from None
    flat = [w[0].astype(np.int32) for ws in per_input for w in ws]
    tokens = int(sum(len(x) for x in flat))
    gw.check_tokens(tokens, param)  # every window counts: it all runs
    rows = await gw.infer(flat, None, normalize, dims, priority)
    do_norm = gw.spec.normalize if normalize is None else normalize
    vectors, windows, k = [], [], 0
    for ws in per_input:
        vecs = rows[k:k + len(ws)]
        k += len(ws)
        weights = np.asarray([max(1, e - s) for _, s, e, _, _ in ws], dtype=np.float64)
        mean = (vecs.astype(np.float64) * weights[:, None]).sum(0) / weights.sum()
        if do_norm:
            mean /= max(float(np.linalg.norm(mean)), 1e-12)
        vectors.append(mean.astype(np.float32))
        windows.append([Window(v, (s, e), (cs, ce) if has_chars else None) for v, (_, s, e, cs, ce) in zip(vecs, ws)])
    return np.stack(vectors), tokens, windows
