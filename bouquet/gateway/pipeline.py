"""Inputs to vectors: the one embedding pipeline under the OpenAI and TEI routes and cosine scoring.

Tokenize (or check token ids), run on the replicas, and for inputs longer than the model allows
window them (long_inputs.py). What it does not own: parsing request fields (inputs.py, the
routes), response shapes (the routes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bouquet.gateway.core import Gateway
from bouquet.gateway.errors import bad_request
from bouquet.gateway.inputs import TextInputs
from bouquet.gateway.long_inputs import embed_long
from bouquet.proto import bouquet_pb2 as pb


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray  # float32 [N, D], one row per input
    tokens: int  # tokens embedded (every window counted in chunk modes)
    chunks: list[list[Any]] | None = None  # long_input "chunks": per input, its long_inputs.Window list


async def embed(gw: Gateway, inputs: TextInputs, mode: str, side: str, prompt: str | None,
                normalize: bool | None, dims: int | None, priority: int = pb.PRIORITY_AUTO,
                param: str = "input") -> EmbedResult:
    """Inputs → EmbedResult. ``mode`` is a long_input mode (inputs.LONG_INPUT_MODES), ``side``
    the truncation side, ``param`` the request field holding the inputs (named in errors as
    ``param[i]``). Raises APIError (400 for inputs that cannot be embedded, 413 beyond
    ``--max-request-tokens``, 429/503/504 from the replicas)."""
    skip = gw.tokenizer.prompt_skip(prompt)
    if mode in ("chunk_mean", "chunks"):
        if skip:
            # Only the first window carries the prompt; pooling that leaves it out would need a
            # count per window, which one call does not carry: refused rather than approximated.
            raise bad_request(f"long_input {mode!r} is not supported with a prompt for this model, whose pooling "
                              "leaves the prompt out (include_prompt=false); use 'truncate' or 'error', or send no "
                              "prompt", "long_input", "invalid_value")
        vectors, tokens, chunks = await embed_long(gw, inputs, prompt, normalize, dims, priority, param)
        return EmbedResult(vectors, tokens, chunks if mode == "chunks" else None)
    enc = await gw.tokenize(inputs, mode == "truncate", side, prompt, param)
    vectors = await gw.infer(enc.ids, None, normalize, dims, priority, skip)
    return EmbedResult(vectors, enc.num_tokens)
