"""Scoring (query, document) pairs, shared by ``/v1/rerank``, ``/v1/score`` and TEI's ``/rerank`` and
``/predict`` (which also reads every label's score: ``encode_pairs`` and ``activate``).

Three kinds of model, one contract (``score_pairs`` → one float per pair):

- cross-encoder (``*ForSequenceClassification``): the pair is encoded as two segments with token
  types; the engine returns logits ``[B, num_labels]``. Score = sigmoid(logit) for one label, the
  softmax probability of the last label otherwise; ``raw`` returns that label's logit.
- causal-LM reranker (Qwen3-Reranker): the pair is written into the model's prompt template
  (``spec.pair_template``, placeholders ``{instruction}`` ``{query}`` ``{document}``) and tokenized
  as one sequence; the engine returns ``[B, 1]`` = logit("yes") − logit("no"), so
  sigmoid = P("yes"), the model card's relevance score; ``raw`` returns the logit difference.
- embedding model (bi-encoder): cosine similarity of the two embeddings, in [-1, 1]; ``raw`` changes
  nothing. Query-side texts get the model's ``query`` prompt, document-side ones its ``document``
  (or ``passage``) prompt, when the model defines them.

Over-long inputs lose document tokens, never query tokens: a query that alone does not fit gets 400.
``side`` says which: "right" (the default) keeps the document's start, "left" its end (TEI's
``truncation_direction``).
"""
from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Callable, Literal

import numpy as np

from bouquet.gateway.core import Gateway, shard_of
from bouquet.gateway.errors import APIError, bad_request
from bouquet.gateway.inputs import TextInputs
from bouquet.proto import bouquet_pb2 as pb
from bouquet.text_window import Side
from bouquet.tokenized import Encoded, NoRoom, TooLong

Activation = Literal["auto", "softmax", "sigmoid", "none"]
_PLACEHOLDERS = re.compile(r"\{instruction\}|\{query\}")  # of a pair template's part before {document}


@dataclass(frozen=True)
class PairFields:
    """The request fields that hold each side of the pairs, so errors name them in ``param``: a
    list side's item i is pair i (``documents[3]``), a one-text side is named bare (``query``)."""

    query: str = "query"
    query_list: bool = False
    docs: str = "documents"
    docs_list: bool = True

    def query_at(self, i: int) -> str:
        return f"{self.query}[{i}]" if self.query_list else self.query

    def doc_at(self, i: int) -> str:
        return f"{self.docs}[{i}]" if self.docs_list else self.docs


@dataclass(frozen=True)
class Scores:
    values: np.ndarray  # float64 [N], one per pair, in request order
    tokens: int  # tokens run through the model


async def score_pairs(gw: Gateway, queries: list[str], docs: list[str], *, raw: bool = False, truncate: bool = True,
                      instruction: str | None = None, priority: int = pb.PRIORITY_AUTO,
                      fields: PairFields = PairFields(), side: Side = "right") -> Scores:
    """Score pair i = (queries[i], docs[i]); over-long documents are cut on ``side``. Raises
    APIError (400 for inputs that cannot fit, its ``param`` the request field of ``fields`` at
    fault, and for ``instruction`` sent to a model that takes none; 413 when the pairs' tokens,
    queries and documents together, exceed ``--max-request-tokens``)."""
    check_instruction(gw, instruction)
    if gw.spec.task == "embed":
        return await _cosine(gw, queries, docs, truncate, priority, fields, side)
    enc = await encode_pairs(gw, queries, docs, truncate=truncate, instruction=instruction, fields=fields, side=side)
    gw.check_tokens(enc.num_tokens, None)
    logits = (await gw.infer(enc.ids, enc.type_ids, None, None, priority)).astype(np.float64)  # [N, num_labels]
    return Scores((logits if raw else activate(logits))[:, -1], enc.num_tokens)


def check_instruction(gw: Gateway, instruction: str | None) -> None:
    """Raises APIError 400 for an ``instruction`` sent to a model without a prompt to put it in."""
    if instruction is not None and not gw.spec.pair_template:
        raise bad_request("'instruction' applies only to instruction-following rerankers (Qwen3-Reranker)",
                          "instruction", "unsupported_parameter")


async def encode_pairs(gw: Gateway, queries: list[str], docs: list[str], *, truncate: bool, instruction: str | None,
                       fields: PairFields, side: Side) -> Encoded:
    """Pair i = (queries[i], docs[i]) tokenized as a scoring model reads it: a cross-encoder's two
    segments with token types, or a causal-LM reranker's filled template (one sequence, no token
    types). Over-long pairs lose document tokens on ``side``. The request's token limit is the
    caller's to check. Raises APIError 400 for a pair that cannot fit (``param`` from ``fields``)."""
    template = gw.spec.pair_template  # set by modelspec for causal-LM rerankers (Qwen3-Reranker)
    if template:
        instr = instruction or gw.spec.default_instruction or ""
        shards = await gw.run_sharded(_templated, list(zip(queries, docs)), gw, template, instr, truncate, fields, side)
        texts = [t for shard in shards for t in shard]
        return Encoded(texts, None, int(sum(len(t) for t in texts)))
    try:
        pairs = list(zip(queries, docs))
        return Encoded.joined(await gw.run_sharded(shard_of(gw.tokenizer.encode_pairs), pairs, side, truncate))
    except TooLong as e:
        where = fields.doc_at(e.index)
        counted = f"at least {e.count} tokens (counted in its document's start only)" if e.at_least else f"{e.count} tokens"
        raise bad_request(f"{where}: pair {e.index} has {counted}, more than the model's maximum of {e.limit} "
                          "(truncation is off)", where, "context_length_exceeded") from None
    except NoRoom as e:  # the request field of that pair's query, as _templated names it
        where = fields.query_at(e.index)
        raise bad_request(f"{where}: the query of pair {e.index} does not fit the model's {gw.spec.max_seq_length} "
                          f"tokens with any document: {e.detail}", where, "context_length_exceeded") from None


def activate(logits: np.ndarray, fn: Activation = "auto") -> np.ndarray:
    """Scores from a scoring model's logits float64 [N, L] → float64 [N, L]: "auto" is TEI's
    ``predict`` (core/src/infer.rs): the softmax over the labels, or the sigmoid of a lone label;
    "softmax" / "sigmoid" apply that function (the sigmoid to each label on its own, as
    transformers' text-classification pipeline's ``function_to_apply``), "none" returns the logits."""
    if fn == "none":
        return logits
    if fn == "sigmoid" or (fn == "auto" and logits.shape[1] == 1):
        return _sigmoid(logits)
    z = np.exp(logits - logits.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _templated(pairs: list[tuple[str, str]], first: int, gw: Gateway, template: str, instruction: str,
               truncate: bool, fields: PairFields, side: Side) -> list[np.ndarray]:
    """Fill the template per pair (pairs ``first``… of the request) and tokenize it (no special
    tokens: the template has them). An over-long pair is re-built with the document cut at a token
    boundary (its end cut for ``side`` "right", its start for "left") until it fits."""
    tok, limit = gw.tokenizer, gw.tokenizer.max_len
    head_t, _, tail = template.partition("{document}")
    # One pass over the template's own placeholders (as str.format fills them): the instruction's
    # text is the client's, and a "{query}" in it is text, not a place for the query.
    head_of = {q: _PLACEHOLDERS.sub(lambda m: instruction if m.group() == "{instruction}" else q, head_t)
               for q in dict.fromkeys(q for q, _ in pairs)}
    heads = [head_of[q] for q, _ in pairs]
    docs = [d for _, d in pairs]
    if truncate:  # a huge document: only the window that its kept tokens come from
        docs = tok.kept_parts(docs)
    out = []
    for i, ids in enumerate(tok.plain_ids([h + d + tail for h, d in zip(heads, docs)]), first):
        if len(ids) > limit:
            if not truncate:
                where = fields.doc_at(i)
                raise bad_request(f"{where}: pair {i} has {len(ids)} tokens, more than the model's maximum of {limit} "
                                  "(truncation is off)", where, "context_length_exceeded")
            ids = _cut_document(tok, heads[i - first], docs[i - first], tail, limit, len(ids) - limit, side)
            if ids is None:
                where = fields.query_at(i)
                raise bad_request(f"{where}: the query of pair {i} does not fit the model's {limit} tokens with any "
                                  "document", where, "context_length_exceeded")
        out.append(tok.finish(ids))
    return out


def _cut_document(tok: Any, head: str, doc: str, tail: str, limit: int, excess: int, side: Side) -> list[int] | None:
    offsets = tok.encodings([doc], add_special_tokens=False)[0].offsets
    keep = len(offsets) - excess
    while keep > 0:
        kept = doc[: offsets[keep - 1][1]] if side == "right" else doc[offsets[len(offsets) - keep][0]:]
        ids = tok.encodings([head + kept + tail], add_special_tokens=False)[0].ids
        if len(ids) <= limit:
            return ids
        keep -= len(ids) - limit  # tokens can merge differently at the cut; shrink and retry
    return None


def _renamed(e: APIError, texts: list[str], unique: list[str], at: Callable[[int], str]) -> APIError:
    """``e`` from embedding ``unique`` (the distinct texts, param ``input[k]``) naming the request
    field instead: the first pair whose text is unique[k] (``at`` gives its field)."""
    if e.code == "too_many_tokens":  # the request's tokens, queries and documents together: no one field
        e.param = None
        return e
    m = re.fullmatch(r"input(?:\[(\d+)\])?", e.param or "")
    if m is None:
        return e
    where = at(texts.index(unique[int(m.group(1) or 0)]))
    e.param = where
    e.message = re.sub(r"^input(\[\d+\])?", lambda _: where, e.message)
    return e


async def _cosine(gw: Gateway, queries: list[str], docs: list[str], truncate: bool, priority: int,
                  fields: PairFields, side: Side) -> Scores:
    prompts = gw.spec.prompts
    q_prompt, d_prompt = prompts.get("query"), prompts.get("document", prompts.get("passage"))
    uq, ud = list(dict.fromkeys(queries)), list(dict.fromkeys(docs))
    # Both sides are tokenized before either runs, so the request's token limit counts them together.
    # The query side is never truncated (a too-long query is an error); documents follow `truncate`.
    try:
        q = await gw.tokenize(TextInputs(uq, None, False), False, "right", q_prompt)
    except APIError as e:
        if e.code == "context_length_exceeded":  # worded for the query, whatever `truncate` says
            e.message = e.message.replace("(truncation is off)", "(queries are never truncated; shorten it)")
        raise _renamed(e, queries, uq, fields.query_at) from None
    try:
        d = await gw.tokenize(TextInputs(ud, None, False), truncate, side, d_prompt, spent=q.num_tokens)
    except APIError as e:
        raise _renamed(e, docs, ud, fields.doc_at) from None
    q_rows = await gw.infer(q.ids, None, True, None, priority, gw.tokenizer.prompt_skip(q_prompt))
    d_rows = await gw.infer(d.ids, None, True, None, priority, gw.tokenizer.prompt_skip(d_prompt))
    qi = {t: i for i, t in enumerate(uq)}
    di = {t: i for i, t in enumerate(ud)}
    qv = q_rows[[qi[t] for t in queries]].astype(np.float64)
    dv = d_rows[[di[t] for t in docs]].astype(np.float64)
    cos = (qv * dv).sum(1) / np.maximum(np.linalg.norm(qv, axis=1) * np.linalg.norm(dv, axis=1), 1e-12)
    # Rounding can put equal vectors a hair past 1 (1.0000000000000002): the documented range is [-1, 1].
    return Scores(np.clip(cos, -1.0, 1.0), q.num_tokens + d.num_tokens)
