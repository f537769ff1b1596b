"""text-embeddings-inference (TEI) compatible routes: ``/embed``, ``/rerank``, ``/similarity``, ``/tokenize``,
``/decode``, ``/info`` (``/predict``, ``/`` and ``/invocations``: routes_predict.py).

Request and response bodies follow TEI's OpenAPI document (``docs/openapi.json`` of
huggingface/text-embeddings-inference); errors use TEI's ``{"error", "error_type"}`` shape.
Differences, by design: ``truncate`` defaults to the server's ``--no-truncate`` setting (TEI's
to false), and invalid input is 400 (TEI uses 413/422 for some validation errors).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
from starlette.responses import Response

from bouquet.gateway.catalog import Catalog
from bouquet.gateway.core import PRIORITIES, Gateway, item_param, tokenizer_threads
from bouquet.gateway.errors import APIError, bad_request, json_type, shown
from bouquet.gateway.http import json_response
from bouquet.gateway.inputs import (TextInputs, check_dimensions, direction, is_token_id, long_input_mode, opt_bool,
                                    opt_int, opt_str, parse_inputs, required_field)
from bouquet.gateway.pipeline import embed
from bouquet.gateway.routes_scoring import common_options, parse_query, parse_texts, ranked
from bouquet.gateway.routes_openai import VERSION
from bouquet.gateway.scoring import PairFields, score_pairs
from bouquet.tokenized import BadTokenId


async def embed_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/embed`` → ``[[float, ...], ...]``, one vector per input (also for a single string)."""
    _embedding_model(gw, "use /rerank")
    inputs = parse_inputs(required_field(body, "inputs"), "inputs", gw.cfg.max_inputs)
    mode = long_input_mode(body, gw.cfg.truncate)
    if mode == "chunks":
        raise bad_request("long_input 'chunks' is only available on /v1/embeddings; use 'chunk_mean' here",
                          "long_input", "invalid_value")
    dims = check_dimensions(opt_int(body, "dimensions"), gw.spec.dimension, gw.spec.matryoshka_dims)
    prompt = gw.resolve_prompt(body, inputs)
    priority = PRIORITIES[opt_str(body, "priority", tuple(PRIORITIES)) or "auto"]
    normalize = opt_bool(body, "normalize")
    # TEI's EmbedRequest defaults normalize to true, whatever the model's sentence-transformers
    # modules say (those decide on /v1/embeddings): a TEI client gets unit vectors unless it asks
    res = await embed(gw, inputs, mode, direction(body), prompt, True if normalize is None else normalize, dims,
                      priority, "inputs")
    return json_response(res.vectors)


def _embedding_model(gw: Gateway, route: str) -> None:
    if gw.spec.task != "embed":
        raise APIError(424, f"model '{gw.public_id}' is not an embedding model; {route}", "inputs", "wrong_task")
    if gw.spec.sparse:
        raise APIError(424, f"model '{gw.public_id}' is a sparse (SPLADE) model; use /embed_sparse", "inputs", "wrong_task")


async def similarity_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/similarity``: ``inputs`` = {``source_sentence``, ``sentences``}, optional ``parameters`` =
    {``prompt_name``, ``truncate``, ``truncation_direction``} → ``[float, ...]``: per sentence, in
    order, the cosine of its embedding with the source sentence's (sentence-transformers'
    ``util.cos_sim``), whatever the model's own normalization. One engine call embeds them all.
    Raises APIError 400 naming ``inputs.source_sentence`` / ``inputs.sentences[i]``, 424 for a
    model that is not a dense embedding model."""
    _embedding_model(gw, "use /rerank")
    inp = body.get("inputs")
    if not isinstance(inp, dict):
        raise bad_request(f"'inputs' must be an object with 'source_sentence' and 'sentences', got {json_type(inp)}",
                          "inputs", "invalid_type" if inp is not None else "missing_required_parameter")
    source = inp.get("source_sentence")
    if not isinstance(source, str) or not source:
        raise bad_request(f"'inputs.source_sentence' must be a non-empty string, got {shown(source)}",
                          "inputs.source_sentence", "invalid_type" if source else "empty_input")
    sentences = parse_texts(inp.get("sentences"), "inputs.sentences", gw.cfg.max_inputs)
    params = body.get("parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise bad_request(f"'parameters' must be an object, got {json_type(params)}", "parameters", "invalid_type")
    mode = long_input_mode(params, gw.cfg.truncate)
    if mode == "chunks":
        raise bad_request("long_input 'chunks' is only available on /v1/embeddings; use 'chunk_mean' here",
                          "parameters.long_input", "invalid_value")
    prompt = gw.resolve_prompt(params)
    priority = PRIORITIES[opt_str(body, "priority", tuple(PRIORITIES)) or "auto"]
    try:
        res = await embed(gw, TextInputs([source, *sentences], None, False), mode, direction(params), prompt, True,
                          None, priority, "inputs")
    except APIError as e:  # "inputs[k]" is the k-th text of [source, *sentences]: name the field it came from
        m = re.match(r"inputs\[(\d+)\]", e.param or "")
        if m:
            k = int(m.group(1))
            where = "inputs.source_sentence" if k == 0 else f"inputs.sentences[{k - 1}]"
            e.message = e.message.replace(m.group(0), where, 1)
            e.param = where
        raise
    v = res.vectors.astype(np.float64)  # [1 + n, D], L2-normalized
    cos = np.clip(v[1:] @ v[0], -1.0, 1.0)  # rounding can put equal vectors a hair past 1
    return json_response([float(c) for c in cos])


async def decode_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/decode``: ``ids`` (a list of token ids or a list of such lists), ``skip_special_tokens``
    (default true) → ``["text", ...]``, one string per sequence (also for a single list), as
    ``tokenizers.Tokenizer.decode_batch`` writes it. Raises APIError 400 for text, empty lists and
    ids outside the vocabulary (naming ``ids`` or ``ids[i]``)."""
    value = body.get("ids")
    first = value[0] if isinstance(value, list) and value else None
    if isinstance(value, str) or isinstance(first, str):
        raise bad_request("'ids' must be a list of token ids or a list of token-id lists, not text", "ids", "invalid_type")
    # parse_inputs also takes text, and its messages say so: the other wrong shapes are named here
    if value is not None and not isinstance(value, list):
        raise bad_request(f"'ids' must be a list of token ids or a list of token-id lists, got {json_type(value)}",
                          "ids", "invalid_type")
    if first is not None and not (isinstance(first, list) or is_token_id(first)):
        raise bad_request(f"ids[0] must be a token id or a list of token ids, got {json_type(first)}", "ids[0]",
                          "invalid_type")
    inputs = parse_inputs(value, "ids", gw.cfg.max_inputs)
    seqs: list[list[int]] = inputs.token_ids or []  # type: ignore[assignment]
    skip = opt_bool(body, "skip_special_tokens") is not False
    gw.check_tokens(sum(map(len, seqs)), "ids")
    try:
        texts = await gw.run_tokenizer(gw.tokenizer.decode, seqs, skip)
    except BadTokenId as e:
        where = item_param("ids", inputs, e.index)
        raise bad_request(f"{where} {e.detail}", where, "invalid_token_id") from None
    return json_response(texts)


async def rerank_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/rerank``: ``query``, ``texts``, ``raw_scores``, ``return_text`` → ``[{"index", "score",
    "text"?}]`` sorted by score, descending."""
    query = parse_query(body)
    texts = parse_texts(required_field(body, "texts"), "texts", gw.cfg.max_inputs)
    return_text = bool(opt_bool(body, "return_text"))
    # TEI truncates the pair; here over-long pairs lose document tokens only: "Left" keeps the
    # document's end, "Right" (the default) its start
    s = await score_pairs(gw, [query] * len(texts), texts, **common_options(gw, body),
                          fields=PairFields(docs="texts"), side=direction(body))
    out = []
    for i in ranked(s.values, None):
        item: dict[str, Any] = {"index": i, "score": float(s.values[i])}
        if return_text:
            item["text"] = texts[i]
        out.append(item)
    return json_response(out)


async def tokenize_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/tokenize``: ``inputs`` (string or list), ``add_special_tokens`` (default true),
    ``prompt_name`` → per input a list of ``{"id", "text", "special", "start", "stop"}``:
    character offsets into the text tokenized (the prompt, when one applies, then the input),
    null for special tokens; spans never overlap and ``text`` is always ``input[start:stop]``
    (``token_spans``). With special tokens, the tokens the model reads: the EOS the gateway appends
    for a decoder embedder whose tokenizer does not (e5-mistral's ``</s>``) ends the list, as
    ``usage`` counts it."""
    texts = parse_texts(body.get("inputs"), "inputs", gw.cfg.max_inputs)
    add_special = opt_bool(body, "add_special_tokens")
    prompt = gw.resolve_prompt(body)
    if prompt:
        texts = [prompt + t for t in texts]
    await gw.check_token_budget(texts, "inputs")  # before the encodings: a token's offsets and string each
    encs = await gw.run_tokenizer(gw.tokenizer.encodings, texts, add_special is not False)
    gw.check_tokens(sum(len(e.ids) for e in encs), "inputs")  # the reply holds an object per token
    out = []
    for text, enc in zip(texts, encs):
        spans = token_spans(text, enc.tokens, enc.offsets, enc.special_tokens_mask)
        out.append([{"id": tid, "text": tok if span is None else text[span[0]:span[1]], "special": span is None,
                     "start": None if span is None else span[0], "stop": None if span is None else span[1]}
                    for tid, tok, span in zip(enc.ids, enc.tokens, spans)])
        eos = gw.tokenizer.appended_eos(enc.ids) if add_special is not False else None
        if eos is not None:
            out[-1].append({"id": eos[0], "text": eos[1], "special": True, "start": None, "stop": None})
    return json_response(out)


async def info_route(models: Catalog) -> Response:
    """TEI ``/info``: model id, dtype, type (embedding pooling or reranker labels) and limits, of
    the first model (TEI serves one; with several, ``/v1/models`` lists them all)."""
    gw = models.gateways[0]
    spec = gw.spec
    first = next((r.info for r in gw.pool.replicas if r.info is not None), None)
    if spec.task == "embed":
        model_type: dict[str, Any] = {"embedding": {"pooling": spec.pooling}}
    else:  # TEI: "classifier" for several labels, "reranker" for one; /predict names its scores with these
        labels = spec.labels
        model_type = {"classifier" if len(labels) > 1 else "reranker": {
            "id2label": {str(i): name for i, name in enumerate(labels)},
            "label2id": {name: i for i, name in enumerate(labels)}}}
    return json_response({
        "model_id": gw.public_id, "model_sha": None, "model_dtype": first.dtype if first else "",
        "quantization": gw.cfg.quantization,  # not TEI's: "none", "fp8" (GPU) or "int8" (CPU), as configured
        "model_type": model_type, "max_concurrent_requests": 0, "max_input_length": spec.max_seq_length,
        "max_batch_tokens": first.max_batch_tokens if first else 0, "max_batch_requests": None,
        "max_client_batch_size": gw.cfg.max_inputs, "auto_truncate": gw.cfg.truncate,
        # threads that can tokenize at once: this process's pool in each gateway worker
        "tokenization_workers": max(1, gw.cfg.gateway_workers) * tokenizer_threads(gw.cfg), "version": VERSION,
        "sha": None, "docker_label": None, "dimension": spec.dimension, "task": spec.task,
        "layout": {"gateway_workers": max(1, gw.cfg.gateway_workers), "tokenizer_threads": tokenizer_threads(gw.cfg),
                   "replicas": len(gw.cfg.servers), "replicas_per_gpu": max(1, gw.cfg.replicas_per_gpu),
                   "batch_one_replica_per_gpu": gw.cfg.batch_one_replica_per_gpu,
                   "chosen": gw.cfg.layout or "as configured"},
    })


def token_spans(text: str, tokens: list[str], offsets: list[tuple[int, int]], special: list[int]) -> list[tuple[int, int] | None]:
    """Character spans of an encoding's tokens that never overlap (None for special tokens).

    ``tokenizers`` can report overlapping offsets: SentencePiece-style (Metaspace) tokenizers emit a
    synthetic "▁" word-start token labelled with the first character of the word that follows it
    (XLM-R: "中文" → "▁" at [0, 1], "中文" at [0, 2]), and byte-level BPE labels every piece of a
    split character with the whole character. Here a token made only of "▁" over input that is not
    whitespace covers no characters ([a, a]), and a token starting before the previous one's end
    starts there instead, so ``text[start:stop]`` is each token's own share of the input.
    """
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for tok, (a, b), sp in zip(tokens, offsets, special):
        if sp:
            spans.append(None)
            continue
        if tok and tok.strip("\u2581") == "" and not text[a:b].isspace():
            b = a  # a word-start marker, not a character of the input
        a = max(a, cursor)
        b = max(b, a)
        spans.append((a, b))
        cursor = b
    return spans
