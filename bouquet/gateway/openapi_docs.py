"""JSON Schemas of request and response bodies, for ``/openapi.json`` only.

Routes parse bodies with orjson and gateway/inputs.py (no pydantic on the hot path); these schemas
document what those parsers accept, and ``route_docs`` turns them into FastAPI ``openapi_extra`` /
``responses`` arguments. Keep them in step with the parsers (tests/integration/test_api_server.py::test_openapi_and_json_404_405
checks that every route is described).
"""
from __future__ import annotations

from typing import Any

_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_VEC = {"type": "array", "items": _NUM}
# inputs as the parsers take them (gateway/inputs.py): no empty string, no empty list (→ 400 empty_input)
_TEXT = {"type": "string", "minLength": 1}
_TEXT_IDS = {**_IDS, "minItems": 1}
_TEXTS = {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1}]}
_INPUT = {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1}, _TEXT_IDS,
                    {"type": "array", "items": _TEXT_IDS, "minItems": 1}],
          "description": "A string, a list of strings, a list of token ids, or a list of token-id lists (none empty)."}


def _optional_int(minimum: int, description: str = "") -> dict[str, Any]:
    """An integer field the parsers also take as null (= not sent)."""
    out: dict[str, Any] = {"type": ["integer", "null"], "minimum": minimum}
    return {**out, "description": description} if description else out

_LONG = {"type": "string", "enum": ["truncate", "error", "chunk_mean", "chunks"],
         "description": "Over-long inputs: truncate | error (400) | chunk_mean (token-weighted mean of overlapping "
                        "windows) | chunks (also one vector per window). Must agree with `truncate` when both are sent."}
_PRIORITY = {"type": "string", "enum": ["interactive", "batch", "auto"]}
_USAGE = {"type": "object", "properties": {"prompt_tokens": _INT, "total_tokens": _INT}}
_SPARSE_OPTIONS = {  # sparse (SPLADE) models only
    "top_k": {"type": "integer", "minimum": 1, "description": "Sparse models: keep the k largest terms"},
    "threshold": {"type": "number", "minimum": 0, "description": "Sparse models: keep terms above this (default 0)"},
}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or []}


# OpenAPI 3.1 (JSON Schema): null as a type, not 3.0's "nullable", which 3.1 validators ignore
OPENAI_ERROR = _obj({"error": _obj({"message": _STR, "type": _STR, "param": {"type": ["string", "null"]},
                                   "code": {"type": ["string", "null"]}})}, ["error"])
TEI_ERROR = _obj({"error": _STR, "error_type": _STR}, ["error", "error_type"])
COHERE_ERROR = _obj({"message": _STR}, ["message"])
_SPARSE_VEC = _obj({"indices": _IDS, "values": _VEC})

EMBEDDINGS_REQUEST = _obj({
    "input": _INPUT, "model": _STR,
    "encoding_format": {"type": "string", "enum": ["float", "base64", "float16", "int8", "uint8", "binary", "ubinary"],
                        "description": "base64: little-endian float32; float16: base64 of little-endian float16; "
                                       "int8/uint8/binary/ubinary: integer lists (docs/api.md)"},
    "dimensions": _optional_int(1, "Matryoshka: keep the first N values, re-normalize"),
    "user": _STR, "truncate": _BOOL, "truncation_side": {"type": "string", "enum": ["left", "right"]},
    "long_input": _LONG, "prompt_name": _STR, "prompt": _STR, "normalize": _BOOL, "priority": _PRIORITY,
    "output": {"type": "string", "enum": ["dense", "sparse", "multi_vector"],
               "description": "sparse: SPLADE and bge-m3 lexical weights; multi_vector: per-token (ColBERT) vectors"},
    **_SPARSE_OPTIONS,
}, ["input"])
_COHERE_TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]  # encodings.COHERE_TYPES
COHERE_EMBED_REQUEST = _obj({
    "model": _STR, "texts": {"type": "array", "items": _TEXT, "minItems": 1},
    "input_type": {"type": "string", "enum": ["search_document", "search_query", "classification", "clustering"],
                   "description": "Mapped to the model's prompt of that kind (docs/api.md); none when it has none"},
    "embedding_types": {"type": "array", "items": {"type": "string", "enum": _COHERE_TYPES}, "minItems": 1,
                        "description": "Default [\"float\"]; int8/uint8/binary/ubinary as docs/api.md defines them"},
    "truncate": {"type": "string", "enum": ["NONE", "START", "END"],
                 "description": "START drops the start, END the end; NONE: 400 for an over-long text"},
    "output_dimension": _optional_int(1, "Matryoshka: keep the first N values, re-normalize"),
}, ["model", "texts", "input_type"])
_INT_ROWS = {"type": "array", "items": {"type": "array", "items": _INT}}
COHERE_EMBED_RESPONSE = _obj({
    "id": _STR, "response_type": _STR, "texts": {"type": "array", "items": _STR},
    "embeddings": _obj({"float": {"type": "array", "items": _VEC}, "int8": _INT_ROWS, "uint8": _INT_ROWS,
                        "binary": _INT_ROWS, "ubinary": _INT_ROWS, "base64": {"type": "array", "items": _STR}}),
    "meta": _obj({"api_version": _obj({"version": _STR}), "billed_units": _obj({"input_tokens": _INT})}),
})
_CHUNK = _obj({"embedding": {"oneOf": [_VEC, _STR]}, "tokens": {**_IDS, "description": "[start, end) token offsets"},
               "chars": {**_IDS, "description": "[start, end) character offsets"}})
EMBEDDINGS_RESPONSE = _obj({
    "object": _STR, "model": _STR, "usage": _USAGE,
    "data": {"type": "array", "items": _obj({"object": _STR, "index": _INT,
                                             "embedding": {"oneOf": [_VEC, _STR, _SPARSE_VEC,
                                                                     {"type": "array", "items": _VEC}]},
                                             "chunks": {"type": "array", "items": _CHUNK}})},
})
_SCORING_EXT = {"raw_scores": _BOOL, "truncate": _BOOL, "instruction": _STR, "priority": _PRIORITY}
RERANK_REQUEST = _obj({
    "query": _TEXT, "model": _STR, "top_n": _optional_int(1), "return_documents": _BOOL,
    "documents": {"oneOf": [_TEXT, {"type": "array", "minItems": 1,
                                    "items": {"oneOf": [_TEXT, _obj({"text": _TEXT}, ["text"])]}}]}, **_SCORING_EXT,
}, ["query", "documents"])
RERANK_RESPONSE = _obj({"id": _STR, "model": _STR, "usage": _USAGE, "results": {"type": "array", "items": _obj(
    {"index": _INT, "relevance_score": _NUM, "document": _obj({"text": _STR})})}})
COHERE_RERANK_REQUEST = _obj({k: v for k, v in RERANK_REQUEST["properties"].items() if k != "priority"},
                             ["model", "query", "documents"])
COHERE_RERANK_RESPONSE = _obj({"id": _STR, "results": {"type": "array", "items": _obj(
    {"index": _INT, "relevance_score": _NUM, "document": _obj({"text": _STR})})},
    "meta": _obj({"api_version": _obj({"version": _STR}), "billed_units": _obj({"input_tokens": _INT})})})
SCORE_REQUEST = _obj({"text_1": _TEXTS, "text_2": _TEXTS, "model": _STR, **_SCORING_EXT}, ["text_1", "text_2"])
SCORE_RESPONSE = _obj({"id": _STR, "object": _STR, "created": _INT, "model": _STR, "usage": _USAGE,
                       "data": {"type": "array", "items": _obj({"index": _INT, "object": _STR, "score": _NUM})}})
TEI_EMBED_REQUEST = _obj({
    "inputs": _INPUT, "normalize": {**_BOOL, "default": True}, "truncate": _BOOL, "truncation_direction": {"type": "string", "enum": ["Left", "Right"]},
    "dimensions": _optional_int(1), "prompt_name": _STR, "prompt": _STR, "priority": _PRIORITY,
    "long_input": {**_LONG, "enum": ["truncate", "error", "chunk_mean"]},
}, ["inputs"])
TEI_EMBED_RESPONSE = {"type": "array", "items": _VEC}
TEI_EMBED_SPARSE_REQUEST = _obj({
    "inputs": _INPUT, "truncate": _BOOL, "truncation_direction": {"type": "string", "enum": ["Left", "Right"]},
    "prompt_name": _STR, "prompt": _STR, "priority": _PRIORITY, **_SPARSE_OPTIONS,
}, ["inputs"])
TEI_EMBED_SPARSE_RESPONSE = {"type": "array", "items": {"type": "array", "items": _obj({"index": _INT, "value": _NUM})}}
TEI_EMBED_ALL_REQUEST = _obj({
    "inputs": _INPUT, "truncate": _BOOL, "truncation_direction": {"type": "string", "enum": ["Left", "Right"]},
    "prompt_name": _STR, "prompt": _STR, "priority": _PRIORITY,
}, ["inputs"])
TEI_EMBED_ALL_RESPONSE = {"type": "array", "items": {"type": "array", "items": _VEC}}
TEI_RERANK_REQUEST = _obj({"query": _TEXT, "texts": _TEXTS, "return_text": _BOOL,
                           "truncation_direction": _STR, **_SCORING_EXT}, ["query", "texts"])
TEI_RERANK_RESPONSE = {"type": "array", "items": _obj({"index": _INT, "score": _NUM, "text": _STR})}
TEI_TOKENIZE_REQUEST = _obj({"inputs": _TEXTS, "add_special_tokens": _BOOL, "prompt_name": _STR, "prompt": _STR},
                            ["inputs"])
_NULLABLE_INT = {"type": ["integer", "null"]}
TEI_TOKENIZE_RESPONSE = {"type": "array", "items": {"type": "array", "items": _obj(
    {"id": _INT, "text": _STR, "special": _BOOL, "start": _NULLABLE_INT, "stop": _NULLABLE_INT})}}
_TEI_DIRECTION = {"type": "string", "enum": ["Left", "Right"]}  # any case is accepted (routes_tei._direction)
TEI_DECODE_REQUEST = _obj({"ids": {"oneOf": [_TEXT_IDS, {"type": "array", "items": _TEXT_IDS, "minItems": 1}]},
                           "skip_special_tokens": _BOOL}, ["ids"])
TEI_DECODE_RESPONSE = {"type": "array", "items": _STR}
TEI_SIMILARITY_REQUEST = _obj({
    "inputs": _obj({"source_sentence": _TEXT, "sentences": _TEXTS}, ["source_sentence", "sentences"]),
    "parameters": {"type": ["object", "null"], "properties": {
        "prompt_name": _STR, "truncate": _BOOL, "truncation_direction": _TEI_DIRECTION,
        "long_input": {**_LONG, "enum": ["truncate", "error", "chunk_mean"]}}},
    "priority": _PRIORITY}, ["inputs"])
TEI_SIMILARITY_RESPONSE = {"type": "array", "items": _NUM}
_PAIR = {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 2}
TEI_PREDICT_REQUEST = _obj({
    "inputs": {"oneOf": [_TEXT, _PAIR, {"type": "array", "items": _PAIR, "minItems": 1}],
               "description": "One input (a string, [text] or a pair [text, text_pair]), or a batch of them as lists: "
                              "[[text], [text, text_pair], ...]. A list of strings is one input, never a batch."},
    "raw_scores": {**_BOOL, "description": "The logits instead of softmax (several labels) or sigmoid (one label)"},
    "truncate": _BOOL, "truncation_direction": _TEI_DIRECTION, "instruction": _STR, "priority": _PRIORITY,
    "parameters": {"type": ["object", "null"], "description": "As huggingface_hub's text_classification sends it",
                   "properties": {"function_to_apply": {"type": "string", "enum": ["softmax", "sigmoid", "none"]},
                                  "top_k": _optional_int(1, "Keep the k best labels of each input")}},
}, ["inputs"])
_PREDICTIONS = {"type": "array", "items": _obj({"score": _NUM, "label": _STR}),
                "description": "Every label of the model (config.json's id2label), by score descending"}
TEI_PREDICT_RESPONSE = {"oneOf": [_PREDICTIONS, {"type": "array", "items": _PREDICTIONS}],
                        "description": "One list for one input; a list of lists for a batch"}
TEI_COMPAT_REQUEST = {
    **_obj({**TEI_EMBED_REQUEST["properties"], **TEI_RERANK_REQUEST["properties"], **TEI_PREDICT_REQUEST["properties"],
            "inputs": {"anyOf": [_INPUT, TEI_PREDICT_REQUEST["properties"]["inputs"],
                                 TEI_SIMILARITY_REQUEST["properties"]["inputs"]]}}),
    "oneOf": [{"required": ["query", "texts"]}, {"required": ["inputs"]}],
    "description": "query + texts: as POST /rerank; inputs: as the model's own route (/predict for a scoring model, "
                   "/similarity for an inputs object, /embed_sparse for a SPLADE model, else /embed)",
}
TEI_COMPAT_RESPONSE = {"anyOf": [TEI_EMBED_RESPONSE, TEI_RERANK_RESPONSE, TEI_PREDICT_RESPONSE, TEI_SIMILARITY_RESPONSE,
                                 TEI_EMBED_SPARSE_RESPONSE]}
TEI_INFO_RESPONSE = _obj({"model_id": _STR, "model_dtype": _STR, "quantization": _STR, "model_type": {"type": "object"},
                          "max_input_length": _INT, "max_batch_tokens": _INT, "max_client_batch_size": _INT,
                          "auto_truncate": _BOOL, "tokenization_workers": _INT, "version": _STR,
                          "layout": _obj({"gateway_workers": _INT, "tokenizer_threads": _INT, "replicas": _INT,
                                          "replicas_per_gpu": _INT, "batch_one_replica_per_gpu": _BOOL,
                                          "chosen": _STR})})

_STATUS_TEXT = {400: "Invalid request", 401: "Missing or wrong API key", 404: "Unknown model or route",
                411: "POST without Content-Length", 413: "Over a request limit: body, inputs, tokens or per-token output",
                415: "Content-Type not JSON, or a compressed body", 422: "Non-finite result (model overflow)",
                424: "Wrong model kind for this route", 429: "Replica queues full",
                503: "No healthy replica, or shutting down", 504: "Replica did not answer in time"}


def route_docs(request: dict[str, Any] | None, response: dict[str, Any], tei: bool = False,
               media_type: str = "application/json", error: dict[str, Any] | None = None,
               errors: dict[int, str] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``add_api_route``: the request body schema (``openapi_extra``) and the
    200 and error responses in the family's error shape (``error``, else TEI's or OpenAI's): every
    status of a route with a body, else those of ``errors`` (status → description)."""
    err = error or (TEI_ERROR if tei else OPENAI_ERROR)
    responses: dict[int | str, Any] = {200: {"content": {media_type: {"schema": response}}, "description": "OK"}}
    for code, text in (_STATUS_TEXT if request is not None else errors or {}).items():
        responses[code] = {"description": text, "content": {"application/json": {"schema": err}}}
    extra = {"requestBody": {"required": True, "content": {"application/json": {"schema": request}}}} if request else None
    return {"responses": responses, "openapi_extra": extra}
