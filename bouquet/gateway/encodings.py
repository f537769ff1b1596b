"""Vector encodings of the embedding routes: float, base64 (float32 / float16), int8, uint8, binary, ubinary.

One place for the compact forms vector databases store, used by ``/v1/embeddings``
(``encoding_format``) and ``/v2/embed`` (``embedding_types``). Every encoding of a row depends on
that row alone, never on the other rows of the request: a text's stored vector must not change
with the texts it was sent with.

- ``binary`` / ``ubinary``: one bit per dimension, ``x > 0``, packed 8 to a byte, most significant
  bit first (numpy ``packbits``), ``ceil(D / 8)`` values per row; ``binary`` is the byte minus 128
  as int8. The same as sentence-transformers' ``quantize_embeddings`` (precision "binary" /
  "ubinary"); Cohere documents its types as packed bits of this length and range.
- ``int8``: ``clip(round(127 · x / ‖x‖₂), -127, 127)``: a fixed scale for unit vectors, whose
  components lie in [-1, 1]. sentence-transformers' int8 instead maps per-dimension min/max ranges
  calibrated on a set of embeddings (by default the batch itself), so one text's codes would change
  with its neighbours; a server cannot do that. Rows are scaled to unit length first (for models
  without normalization, or ``normalize: false``), so cosine and ranking survive; dot products of
  non-unit vectors do not. Dequantize as ``q / 127``.
- ``uint8``: ``int8 + 128`` (0..255), the offset sentence-transformers' uint8 has to its int8.
  Subtract 128 before a cosine or dot product: the constant offset otherwise swamps the signal.
- ``base64``: little-endian float32 bytes of the row (OpenAI's and Cohere's base64); ``float16``:
  little-endian IEEE half-precision bytes, base64.
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

# /v1/embeddings encoding_format values, in the order docs/api.md lists them
OPENAI_FORMATS = ("float", "base64", "float16", "int8", "uint8", "binary", "ubinary")
# /v2/embed embedding_types (Cohere's names)
COHERE_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
INT8_SCALE = 127.0


def to_int8(vectors: np.ndarray) -> np.ndarray:
    """[N, D] float → [N, D] int8 on the fixed scale: ``round(127 · x / ‖x‖)`` (module docstring).
    A zero row stays zero."""
    v = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    unit = v / np.where(norms > 0, norms, 1.0)
    return np.clip(np.rint(unit * INT8_SCALE), -INT8_SCALE, INT8_SCALE).astype(np.int8)


def to_uint8(vectors: np.ndarray) -> np.ndarray:
    """[N, D] float → [N, D] uint8: ``to_int8 + 128``."""
    return (to_int8(vectors).astype(np.int16) + 128).astype(np.uint8)


def to_ubinary(vectors: np.ndarray) -> np.ndarray:
    """[N, D] float → [N, ceil(D/8)] uint8: the sign bits ``x > 0``, packed MSB first."""
    return np.packbits(np.asarray(vectors) > 0, axis=-1)


def to_binary(vectors: np.ndarray) -> np.ndarray:
    """[N, D] float → [N, ceil(D/8)] int8: ``to_ubinary - 128``."""
    return (to_ubinary(vectors).astype(np.int16) - 128).astype(np.int8)


def _b64_rows(rows: np.ndarray) -> list[str]:
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]


def encode_vectors(vectors: np.ndarray, fmt: str) -> list[Any]:
    """[N, D] float32 → one JSON value per row in encoding ``fmt`` (one of OPENAI_FORMATS or
    COHERE_TYPES): numpy rows (orjson writes them as numbers) or base64 strings. Raises
    ValueError for another name (the routes validate first)."""
    if fmt == "float":
        return list(vectors)
    if fmt == "base64":
        return _b64_rows(np.ascontiguousarray(vectors, dtype="<f4"))
    if fmt == "float16":
        return _b64_rows(np.ascontiguousarray(vectors, dtype="<f2"))
    quantize = {"int8": to_int8, "uint8": to_uint8, "binary": to_binary, "ubinary": to_ubinary}.get(fmt)
    if quantize is None:
        raise ValueError(f"unknown vector encoding {fmt!r}")
    return list(quantize(vectors))
