"""XLM-R's Unigram through ``tokie`` (3-7x less CPU per text than ``tokenizers`` 0.23 here), for the
one tokenizer.json shape it is tested to reproduce; every other file stays on ``tokenizers``.

The shape is the one transformers writes for XLM-R and the models built on its vocabulary
(multilingual-e5, bge-m3, the XLM-R cross-encoders): SentencePiece's precompiled character map
(``Precompiled``), runs of spaces folded into one (``Replace``), ``Metaspace`` ("▁" before every
word, always prepended, split on it), a ``Unigram`` model without byte fallback, and a template
post-processor. Both libraries read the same character map and scores from the file, so they agree
on what a character becomes, and ``Unigram``'s best segmentation is the same dynamic program:
tests/integration/test_unigram_fast.py compares every code point in eight contexts, 240,000 random
texts and texts of up to 200,000 characters with ``tokenizers``, and changes to any of the parts
above (prepend "first" or "never", no split, no ``Replace``, an added ``Lowercase``) that do make
the two differ.

One difference, handled here: a text that normalizes to nothing (control characters the map
drops, such as U+001F) is no token for ``tokenizers`` and a lone "▁" for tokie, so a lone "▁" from
tokie is checked with ``tokenizers`` (a whitespace-only text is a lone "▁" for both).
"""
from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, models

from bouquet.fast_ids import (Ineligible, Template, TokieSplit, added_of, reference_of, template_of, tokenizer_json,
                              tokie_of, tokie_path)

METASPACE = "\u2581"
# Texts up to this long were compared with tokenizers (200,000 characters, across 64 KiB); longer
# ones go to tokenizers, as does any text tokie fails on. A long input that is truncated reaches
# this module as a window of a few times the token limit (TextTokenizer._bounded).
MAX_CHARS = 200_000


def fast_unigram(tokenizer: Tokenizer, path: str) -> FastUnigram | None:
    """``FastUnigram.of(tokenizer, path)``, or None (the caller keeps ``tokenizers``) when the file
    is not eligible or tokie is not installed; the backend chosen is logged once."""
    return tokie_path(lambda: FastUnigram.of(tokenizer, path), path, "Unigram")


class FastUnigram(TokieSplit):
    """``tokie``'s tokenizer for one XLM-R-shaped Unigram ``tokenizer.json``, built once.

    ``ids`` equals ``Tokenizer.encode(text, add_special_tokens=False).ids``; ``template`` describes
    what ``add_special_tokens=True`` adds, single and pair."""

    def __init__(self, fast: Any, reference: Tokenizer, added: dict[str, int], template: Template,
                 space_id: int | None) -> None:
        super().__init__(fast, reference, added, template)
        self._lone_space = None if space_id is None else [space_id]

    @classmethod
    def of(cls, tokenizer: Tokenizer, path: str) -> FastUnigram:
        """Raises Ineligible naming the first part of the file that is not reproduced exactly (or a
        probe text whose ids differ), ImportError without tokie."""
        j = tokenizer_json(tokenizer, models.Unigram)
        try:
            _check(j)
            template = template_of(j.get("post_processor"), want_pair=True)
            added = added_of(j.get("added_tokens") or [])
            space_id = next((i for i, (piece, _) in enumerate(j["model"]["vocab"]) if piece == METASPACE), None)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:  # a shape not known here
            raise Ineligible(f"unexpected tokenizer.json shape ({type(e).__name__}: {e})") from None
        out = cls(tokie_of(path), reference_of(tokenizer), added, template, space_id)
        out.check(_PROBES)
        return out

    def ids(self, text: str) -> list[int]:
        return super().ids(text) if len(text) <= MAX_CHARS else self.reference_ids(text)

    def pieces(self, text: str) -> list[int]:
        ids = super().pieces(text)
        if ids == self._lone_space:  # all whitespace, or nothing once normalized (module docstring)
            return self.reference_ids(text)
        return ids


def _check(j: dict[str, Any]) -> None:
    n, p, m = j.get("normalizer") or {}, j.get("pre_tokenizer") or {}, j.get("model") or {}
    steps = (n.get("normalizers") or []) if n.get("type") == "Sequence" else [n]
    kinds = [s.get("type") for s in steps]
    if kinds != ["Precompiled", "Replace"] or steps[1].get("pattern") != {"Regex": " {2,}"} or steps[1].get("content") != " ":
        raise Ineligible(f"normalizer {kinds}")
    if p.get("type") != "Metaspace" or p.get("replacement") != METASPACE or p.get("prepend_scheme") != "always" \
            or not p.get("split", True):
        raise Ineligible(f"pre-tokenizer {p.get('type')} prepend_scheme={p.get('prepend_scheme')} split={p.get('split')}")
    if m.get("type") != "Unigram" or m.get("byte_fallback") or m.get("unk_id") is None:
        raise Ineligible(f"model {m.get('type')} byte_fallback={m.get('byte_fallback')} unk_id={m.get('unk_id')}")


_PROBES = (
    "The quick brown fox, naïve café résumé — “quoted” 中文字符 한국어 العربية Ωmega ＡＢＣ ﬁ ① 🙂!",
    "a<mask>b <s> x</s>y  two  spaces\tand\ttabs\nnew\r\nline 1,234.56 e-mail@x.org",
    "x" * 100 + " " + "é" * 101 + " " + "ж" * 99 + " \u3000 \x1f \x00 e\u0301 ｶﾞ ᄀ\u1161\u11a8",
    "\x1f",
)
