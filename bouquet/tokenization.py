"""Tokenization in the gateway, with Hugging Face ``tokenizers`` (Rust; ``encode_batch`` releases
the GIL and runs in parallel). The raw ``Tokenizer`` object is used, never a ``transformers``
wrapper (shared wrappers fail across threads with "Already borrowed"). Ids without offsets of a
byte-level BPE file that tiktoken reproduces exactly (Qwen's) come from tiktoken (bouquet/bpe_fast.py),
of a BERT WordPiece file from tokie, for texts it is tested to read alike (bouquet/wordpiece_fast.py),
of an XLM-R Unigram file from tokie (bouquet/unigram_fast.py).

Truncation is decided per request. With truncation on, a text much longer than the model's limit
is tokenized only at the end that is kept (``_bounded``), so a huge input costs what its kept
tokens cost; with truncation off, texts are tokenized whole, so the true token count is known.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import numpy as np
import tokenizers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from bouquet.bpe_fast import FastBPE, fast_bpe
from bouquet.modelspec import ModelSpec
from bouquet.tokenized import BadTokenId, Encoded, NoRoom, TooLong, appended_tokens, read_tokenizer
from bouquet.text_window import (FIRST_CHARS_PER_TOKEN, PROBED_CHARS, SPACE, UNCLEAN_CHECKS, WINDOWED_CHARS_PER_TOKEN,
                                 Side, bert_boundary, margin, same_end, window)
from bouquet.unigram_fast import FastUnigram, fast_unigram
from bouquet.wordpiece_fast import FastWordPiece, fast_wordpiece

log = logging.getLogger(__name__)


def _spliced(items: list[Any], picked: list[int], on_picked: Any, on_rest: Any) -> list[Any]:
    """``on_picked`` over the items at ``picked`` and ``on_rest`` over the others (each one batch
    call, skipped when empty), results back in the items' order."""
    if not picked:
        return on_rest(items)
    out: list[Any] = [None] * len(items)
    for i, r in zip(picked, on_picked([items[i] for i in picked])):
        out[i] = r
    rest = [i for i, r in enumerate(out) if r is None]
    if rest:
        for i, r in zip(rest, on_rest([items[i] for i in rest])):
            out[i] = r
    return out


def _pair(index: int, join: Any, query: Any, *args: Any) -> Any:
    """``join(query, *args)``; its failure (the query leaves the document no room: a bare Exception
    from ``tokenizers``, a ValueError from ``Template.wrap_pair``) as NoRoom for pair ``index``, in
    one wording for both (``query``: its ids or its Encoding)."""
    try:
        return join(query, *args)
    except Exception:  # noqa: BLE001 - tokenizers' error type
        n = len(getattr(query, "ids", query))
        raise NoRoom(index, f"its {n} tokens and the pair template's leave the document none") from None


def _encode_ids(tok: Tokenizer, inputs: list[Any]) -> list[Any]:
    """``encode_batch`` without character offsets (``encode_batch_fast``, tokenizers ≥ 0.20;
    ~5% less CPU per token on this tokenizer) where the caller reads ids and type ids only."""
    fast = getattr(tok, "encode_batch_fast", None)
    return fast(inputs) if fast is not None else tok.encode_batch(inputs)


class TextTokenizer:
    """Thread-safe for concurrent ``encode*`` calls (the Rust tokenizer is immutable here)."""

    def __init__(self, spec: ModelSpec) -> None:
        """Raises ModelError naming tokenizer.json when ``tokenizers`` cannot read it."""
        base = read_tokenizer(spec)
        base.no_padding()
        base.no_truncation()
        self.spec = spec
        # Causal embedding models (Qwen3-Embedding) pool on a trailing <|endoftext|>. Their real
        # tokenizer.json appends it in its post-processor (then truncation keeps it and it counts
        # in the limit); with a tokenizer that does not, the gateway appends it after encoding and
        # keeps one token of room for it.
        self.eos = spec.append_eos_id
        self.appended = appended_tokens(spec, base)  # 1 (the EOS) or 0
        self.max_len = spec.max_seq_length - self.appended
        self._plain = base
        self._whole_words = isinstance(base.model, models.WordPiece)  # see _bounded
        norm = base.normalizer
        bert = (self._whole_words and isinstance(base.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
                and isinstance(norm, normalizers.BertNormalizer))
        self._cuts = bert_boundary(norm.handle_chinese_chars) if bert else SPACE  # where a window may end (_bounded)
        path = str(spec.tokenizer_path)
        self._fast: FastBPE | FastWordPiece | FastUnigram | None = (
            fast_bpe(base, path) or fast_wordpiece(base, path) or fast_unigram(base, path))
        if self._fast is None:
            log.info("tokenizer: tokenizers %s for %s", tokenizers.__version__, spec.tokenizer_path)
        # Truncation is a setting of the Rust tokenizer, so each (side, single/pair) has its own copy.
        # A copy of a large tokenizer.json costs ~1 s (XLM-R's 17 MB), so only what the model's
        # task uses by default is built here (none on a fast path); a left-side or other-task copy
        # on first use.
        self._trunc: dict[str, Tokenizer] = {}
        self._trunc_lock = threading.Lock()
        if self._fast is None or (spec.task == "score" and self._fast.template.pair is None):
            self._truncating("right_pair" if spec.task == "score" else "right")
        self.vocab_size = spec.vocab_size
        self._windowers: dict[int, Tokenizer] = {}  # by overlap; built on first long input
        self._prompt_lengths: dict[str, int] = {}

    def _truncating(self, kind: str) -> Tokenizer:
        """The copy that truncates to ``max_len``: ``kind`` is "left" / "right" (one text,
        longest_first) or "left_pair" / "right_pair" (the second text only), built once."""
        t = self._trunc.get(kind)
        if t is None:
            with self._trunc_lock:
                t = self._trunc.get(kind)
                if t is None:
                    side, _, pair = kind.partition("_")
                    t = Tokenizer.from_str(self._plain.to_str())
                    t.enable_truncation(self.max_len, strategy="only_second" if pair else "longest_first",
                                        direction=side)
                    self._trunc[kind] = t
        return t

    def _finish(self, ids: list[int]) -> np.ndarray:
        # np.fromiter with a count: half the time of np.asarray on a list of ~500 ints
        if self.eos is not None and (not ids or ids[-1] != self.eos):
            return np.fromiter(itertools.chain(ids, (self.eos,)), dtype=np.int32, count=len(ids) + 1)
        return np.fromiter(ids, dtype=np.int32, count=len(ids))

    def _bounded(self, texts: list[str], side: Side, encodings: bool = False) -> tuple[list[str], list[Any]]:
        """(parts, their ids without special tokens: lists, or ``tokenizers`` Encodings when
        ``encodings``): the part of each text that truncation to ``max_len`` on ``side`` keeps from:
        the whole text, or a window at that end (``_window``)
        that yields at least ``max_len + margin`` tokens, so that the kept tokens are those of
        the whole text (tests/integration/test_tokenizer_equality.py checks this on every tokenizer kind).

        A window cut inside a run of non-space characters is tokenized again 1 .. ``UNCLEAN_CHECKS``
        characters longer and kept only when all agree on the kept tokens: Unigram's best segmentation
        of a long word can depend on where the word ends ("x" * n by n mod 3, "ab" * n by n mod 4 in
        XLM-R, where one character longer agrees and two do not). WordPiece reads
        a word over 100 characters, or with one character outside its vocabulary, as one [UNK]
        wherever that character is, so for it such a cut is never kept: the window grows instead."""
        keep = self.max_len
        need = keep + margin(keep)
        chars = [need * FIRST_CHARS_PER_TOKEN] * len(texts)
        out: list[Any] = [None] * len(texts)
        parts = list(texts)
        todo = list(range(len(texts)))
        while todo:
            batch: list[str] = []
            slots = []
            for i in todo:
                part, clean = window(texts[i], side, chars[i], self._cuts)
                parts[i] = part
                slots.append((i, len(batch), len(part) == len(texts[i]), clean))
                batch.append(part)
                if not clean and not self._whole_words:
                    for n in range(len(part) + 1, min(len(part) + UNCLEAN_CHECKS, len(texts[i])) + 1):
                        batch.append(texts[i][:n] if side == "right" else texts[i][len(texts[i]) - n:])
            encs = self._plain.encode_batch_fast(batch, add_special_tokens=False) if encodings else self.plain_ids(batch)
            seqs = [e.ids for e in encs] if encodings else encs
            todo = []
            for i, k, whole, clean in slots:
                ids = seqs[k]
                extra = min(UNCLEAN_CHECKS, len(texts[i]) - len(parts[i]))
                settled = clean or (not self._whole_words and all(same_end(ids, seqs[k + j], keep, side)
                                                                  for j in range(1, extra + 1)))
                if whole or (len(ids) >= need and settled):
                    out[i] = encs[k]
                else:  # too few tokens: grow by the characters per token seen; an unsettled cut: double
                    short = need / max(1, len(ids))
                    chars[i] = int(chars[i] * (max(2.0, short * 1.25) if short > 1 else 2.0))
                    todo.append(i)
        return parts, out

    def kept_parts(self, texts: list[str], side: Side = "right") -> list[str]:
        """Each text, or a window at its ``side`` end whose tokens include the ``max_len`` tokens
        that truncation keeps from the whole text (see ``_bounded``): for callers that build their
        own sequences around a text (templated rerankers) and cut it to fit."""
        long_idx = self._windowed(texts)
        out = list(texts)
        for i, part in zip(long_idx, self._bounded([texts[i] for i in long_idx], side)[0]):
            out[i] = part
        return out

    def _windowed(self, texts: list[str]) -> list[int]:
        """Indices of the texts long enough that tokenizing a window of them pays."""
        limit = (self.max_len + margin(self.max_len)) * WINDOWED_CHARS_PER_TOKEN
        return [i for i, t in enumerate(texts) if len(t) > limit]

    def encode(self, texts: list[str], truncate: bool = True, side: Side = "right") -> Encoded:
        """Texts → token ids. Raises TooLong (first offending index) when truncation is off."""
        if not truncate and len(texts) > 1 and sum(map(len, texts)) > PROBED_CHARS:
            return self._encode_stepwise(texts)
        first = None if truncate else self._too_long_start(texts)
        if first is not None:  # refused without tokenizing it whole, unless a text before it is too long
            self.encode(texts[:first[0]], False)
            raise TooLong(*first, self.spec.max_seq_length, at_least=True)
        fast, long_idx = self._fast, self._windowed(texts) if truncate else []
        keep = self.max_len - fast.template.added if fast is not None and truncate else None
        if fast is not None and (keep is None or keep > 0):  # the fast path's ids, cut and wrapped as the post-processor does
            wrap = lambda xs: [fast.template.wrap(x, keep, side) for x in xs]  # noqa: E731
            seqs = _spliced(texts, long_idx, lambda xs: wrap(self._bounded(xs, side)[1]), lambda xs: wrap(map(fast.ids, xs)))
        elif truncate:  # the truncating copy in one pass; long texts through a window at their kept end,
            # truncated by the same copy's post-processor (what its ``encode`` runs after the model)
            trunc = self._truncating(side)
            seqs = [e.ids for e in _spliced(texts, long_idx, lambda xs: [trunc.post_process(e) for e in self._bounded(xs, side, True)[1]],
                                            lambda xs: _encode_ids(trunc, xs))]
        else:
            seqs = [e.ids for e in _encode_ids(self._plain, texts)]
        for i, x in enumerate(seqs if not truncate else ()):
            if len(x) > self.max_len:
                raise TooLong(i, len(x) + self.spec.max_seq_length - self.max_len, self.spec.max_seq_length)
        ids = [self._finish(x) for x in seqs]
        return Encoded(ids, None, int(sum(len(x) for x in ids)))

    def _encode_stepwise(self, texts: list[str]) -> Encoded:
        """Truncation off: ``encode`` of consecutive batches of at most PROBED_CHARS characters (a
        longer text alone), so that the first too-long text spares the rest their tokenization
        (4,096 texts of rare 99-letter words took 16 s before their 400)."""
        bounds, start, size = [], 0, 0
        for i, t in enumerate(texts):
            if i > start and size + len(t) > PROBED_CHARS:
                bounds.append((start, i))
                start, size = i, 0
            size += len(t)
        bounds.append((start, len(texts)))
        out = []
        for a, b in bounds:
            try:
                out.append(self.encode(texts[a:b], False))
            except TooLong as e:
                raise TooLong(a + e.index, e.count, e.limit, e.at_least) from None
        return Encoded.joined(out)

    def start_tokens(self, text: str, chars: int) -> tuple[int, int] | None:
        """(characters, tokens without special tokens) of a window at the start of ``text`` of about
        ``chars`` characters, cut at a word boundary (``window``), so that its tokens are the whole
        text's first ones; None when no boundary is near ``chars``."""
        part, clean = window(text, "right", chars, self._cuts)
        return (len(part), len(self.plain_ids([part])[0])) if clean else None

    def _too_long_start(self, texts: list[str]) -> tuple[int, int] | None:
        """(index, its tokens) of the first text over PROBED_CHARS characters (and ``_windowed``)
        whose start, cut clean at a word boundary (``window``), already holds more than
        ``max_len`` tokens; None when none does. Truncation off, such a text is refused from a
        window of ~1,700 characters (256-token models) instead of the whole text: a 4 MB body took
        up to 16 s of tokenization to count its tokens exactly."""
        long_idx = [i for i in self._windowed(texts) if len(texts[i]) > PROBED_CHARS]
        chars = (self.max_len + margin(self.max_len)) * WINDOWED_CHARS_PER_TOKEN
        cuts = [window(texts[i], "right", chars, self._cuts) for i in long_idx]
        for i, (_, clean), ids in zip(long_idx, cuts, self.plain_ids([c[0] for c in cuts]) if cuts else []):
            if clean and len(ids) > self.max_len:
                return i, len(ids)
        return None

    def encode_pairs(self, pairs: list[tuple[str, str]], side: Side = "right", truncate: bool = True) -> Encoded:
        """(query, document) pairs → ids and token types; over-long pairs lose document tokens
        only (``only_second``), never query tokens. Raises TooLong when ``truncate`` is off, and
        NoRoom (the first such pair) when a query alone leaves no room for its document.

        Each side is tokenized once (a query shared by many pairs once in all) and the pair is put
        together by the tokenizer's own ``post_process`` (truncation, then the pair template),
        which is what ``Tokenizer.encode((query, document))`` runs after tokenizing the two
        sequences apart: same ids and token types, without tokenizing an over-long pair twice. On a
        fast path (tokie's WordPiece) its ``Template.wrap_pair`` does the same (tested equal)."""
        unique = list(dict.fromkeys(q for q, _ in pairs))
        docs = [d for _, d in pairs]
        first = None if truncate else self._too_long_start(docs)  # a document too long alone: as ``encode``
        if first is not None:
            self.encode_pairs(pairs[:first[0]], side, False)
            raise TooLong(*first, self.spec.max_seq_length, at_least=True)
        long_docs = self._windowed(docs) if truncate else []
        fast = self._fast
        # A limit of at most the pair template's own tokens is left to tokenizers, whose post_process
        # then truncates nothing (below: the room left wraps around) or both sequences to nothing (at it).
        if fast is not None and fast.template.pair is not None and (not truncate or self.max_len > fast.template.pair_added):
            q_ids = {q: fast.ids(q) for q in unique}
            d_ids = _spliced(docs, long_docs, lambda xs: self._bounded(xs, side)[1], lambda xs: [fast.ids(x) for x in xs])
            limit = self.max_len if truncate else None
            built = [_pair(i, fast.template.wrap_pair, q_ids[q], d, limit, side) for i, ((q, _), d) in enumerate(zip(pairs, d_ids))]
            return self._pairs_out([b[0] for b in built], [b[1] for b in built], truncate)
        join = self._truncating(side + "_pair") if truncate else self._plain
        q_encs = dict(zip(unique, self._plain.encode_batch_fast(unique, add_special_tokens=False)))
        d_encs = _spliced(docs, long_docs, lambda xs: self._bounded(xs, side, True)[1],
                          lambda xs: self._plain.encode_batch_fast(xs, add_special_tokens=False))
        encs = [_pair(i, join.post_process, q_encs[q], d) for i, ((q, _), d) in enumerate(zip(pairs, d_encs))]
        return self._pairs_out([e.ids for e in encs], [e.type_ids for e in encs], truncate)

    def _pairs_out(self, seqs: list[list[int]], types: list[list[int]], truncate: bool) -> Encoded:
        if not truncate:
            for i, x in enumerate(seqs):
                if len(x) > self.max_len:
                    raise TooLong(i, len(x), self.spec.max_seq_length)
        ids = [self._finish(x) for x in seqs]
        tts = [np.fromiter(t, dtype=np.int32, count=len(x)) if len(x) == len(t)
               else np.pad(np.asarray(t, dtype=np.int32), (0, len(x) - len(t))) for t, x in zip(types, ids)]
        return Encoded(ids, tts, int(sum(len(x) for x in ids)))

    def check_ids(self, seqs: list[list[int]], truncate: bool = True, side: Side = "right") -> Encoded:
        """Pre-tokenized input: validate ids against the vocabulary, truncate or refuse long ones.
        Raises BadTokenId naming the sequence and the bad id, or TooLong."""
        out = []
        for i, s in enumerate(seqs):
            arr = np.asarray(s, dtype=np.int32)  # parse_inputs checked the int32 range
            if arr.size == 0:
                raise BadTokenId(i, "is an empty list of token ids")
            self._check_vocab(i, arr)
            if arr.size > self.spec.max_seq_length:
                if not truncate:
                    raise TooLong(i, int(arr.size), self.spec.max_seq_length)
                arr = arr[: self.spec.max_seq_length] if side == "right" else arr[-self.spec.max_seq_length:]
            out.append(arr)
        return Encoded(out, None, int(sum(len(x) for x in out)))

    def prompt_skip(self, prompt: str | None) -> int:
        """The leading tokens of ``prompt + text`` that pooling leaves out: 0 unless the model's
        Pooling sets ``include_prompt: false``; then the tokens of ``prompt`` encoded alone with
        the special tokens, less a trailing special token, as sentence-transformers 6.2 counts
        them (``Transformer._get_prompt_length``: the start token counts, the end token does not)."""
        if not prompt or self.spec.include_prompt:
            return 0
        n = self._prompt_lengths.get(prompt)
        if n is None:
            ids = self._truncating("right").encode(prompt).ids
            special = self._plain.get_added_tokens_decoder()
            n = len(ids) - (1 if ids and ids[-1] in special and special[ids[-1]].special else 0)
            if len(self._prompt_lengths) < 1024:  # bounded: clients may send prompts of their own
                self._prompt_lengths[prompt] = n
        return n

    def decode(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Token ids → text per sequence (``tokenizers.Tokenizer.decode_batch``), for TEI's
        ``/decode``. Raises BadTokenId naming the sequence and the first id outside the vocabulary."""
        for i, s in enumerate(seqs):
            self._check_vocab(i, np.asarray(s, dtype=np.int64))
        return self._plain.decode_batch(seqs, skip_special_tokens=skip_special_tokens)

    def _check_vocab(self, i: int, arr: np.ndarray) -> None:
        bad = np.flatnonzero((arr < 0) | (arr >= self.vocab_size))
        if bad.size:
            j = int(bad[0])
            raise BadTokenId(i, f"has token id {int(arr[j])} at position {j}, outside the vocabulary [0, {self.vocab_size})")

    # ---- helpers for the TEI /tokenize route, templated rerankers and long inputs -----------
    def plain_ids(self, texts: list[str]) -> list[list[int]]:
        """Texts → token ids without special tokens, never truncated (no character offsets: cheaper
        than ``encodings``; a fast path's where there is one)."""
        if self._fast is not None:
            return [self._fast.ids(t) for t in texts]
        return [e.ids for e in self._plain.encode_batch_fast(texts, add_special_tokens=False)]

    @property
    def spreads_batches(self) -> bool:
        """Whether one call spreads a batch over the cores (``tokenizers``); a fast path's stays on its thread."""
        return self._fast is None

    def encodings(self, texts: list[str], add_special_tokens: bool = True) -> list[Any]:
        """Texts → ``tokenizers.Encoding`` objects (ids, tokens, offsets), never truncated."""
        return self._plain.encode_batch(texts, add_special_tokens=add_special_tokens)

    def appended_eos(self, ids: list[int]) -> tuple[int, str] | None:
        """(id, token string) of the EOS ``finish`` appends to ``ids``, or None when it appends none."""
        if self.eos is None or (ids and ids[-1] == self.eos):
            return None
        return self.eos, self._plain.id_to_token(self.eos) or ""

    def finish(self, ids: list[int]) -> np.ndarray:
        """Token ids → int32 array, with the model's pooled EOS appended when it needs one."""
        return self._finish(ids)

    def windows(self, texts: list[str], overlap: int, prefix_chars: int = 0) -> list[list[tuple[np.ndarray, int, int, int, int]]]:
        """Split each text into overlapping windows that each fit the model.

        Returns per text a list of (ids int32 [n], token_start, token_end, char_start, char_end):
        offsets count the text's own tokens (special tokens excluded, end exclusive) and index its
        characters; consecutive windows share ``overlap`` tokens. Special tokens are added to every
        window. ``prefix_chars``: every text starts with a prompt of this many characters, which
        the first window carries; offsets leave it out (they start after it, at 0).
        """
        t = self._windowers.get(overlap)
        if t is None:
            t = Tokenizer.from_str(self._plain.to_str())
            t.enable_truncation(self.max_len, stride=overlap, strategy="longest_first", direction="right")
            self._windowers[overlap] = t
        out = []
        for enc in t.encode_batch(texts):
            parts, start = [enc, *enc.overflowing], 0
            wins = []
            prompt_tokens = 0  # the prompt's tokens: those ending inside it, in the first window
            for k, part in enumerate(parts):
                content = [o for o, sp in zip(part.offsets, part.special_tokens_mask) if not sp]
                if k == 0 and prefix_chars:
                    prompt_tokens = sum(1 for _, e in content if e <= prefix_chars)
                n = len(content)
                if k:
                    start = wins[-1][2] + prompt_tokens - overlap
                a, b = (content[0][0], content[-1][1]) if content else (0, 0)
                wins.append((self._finish(part.ids), max(0, start - prompt_tokens), start + n - prompt_tokens,
                             max(0, a - prefix_chars), max(0, b - prefix_chars)))
            out.append(wins)
        return out

