"""BERT's WordPiece through ``tokie`` (10-25x less CPU per text than ``tokenizers`` 0.23 here), for the
texts whose ids it reproduces; every other text and every other file stays on ``tokenizers``.

A BERT tokenizer.json (``BertNormalizer``, ``BertPreTokenizer``, ``WordPiece``) works character by
character until the word lookup: the normalizer maps each character on its own (control characters
dropped, whitespace to a space, CJK ideographs padded with spaces, NFD and accents dropped with
lowercasing: a lone mark is dropped whatever its neighbours), the pre-tokenizer splits on each
character's class (whitespace, punctuation), and WordPiece's greedy longest match over the words is
the same algorithm over the same vocabulary. So two implementations agree on every text whose
characters each agree, in any context, on what they become and which class they are in.

The two libraries read characters through different Unicode tables: ``tokie`` 0.1.4 an older one
than ``tokenizers`` 0.23 (a character assigned since is kept by one and dropped or classed apart by
the other), and a few characters are classed apart by the two (``EXCEPTIONS``: DEL, which
``tokenizers`` drops as a control character, and four whose category changed). ``safe`` admits the
characters assigned in Unicode 3.2 (a table every Python carries) but those:
tests/integration/test_wordpiece_fast.py checks every one of them in several contexts, random text
from them, and the STSb sentences. A text with any other character (a recent emoji, say) is
tokenized by ``tokenizers``, as is a text of more than ``MAX_CHARS`` characters (tokie cuts texts
of 64 KiB into chunks).
"""
from __future__ import annotations

import bisect
import functools
import unicodedata
from typing import Any

from tokenizers import Tokenizer, models

from bouquet.fast_ids import (Ineligible, TokieSplit, added_of, reference_of, template_of, tokenizer_json, tokie_of,
                              tokie_path)

# The normalizer settings tested against ``tokenizers`` (uncased and cased BERT).
TESTED_NORMALIZERS = frozenset({(True, None), (True, True), (False, None), (False, False)})  # (lowercase, strip_accents)
# Characters assigned in Unicode 3.2 that the two libraries read apart (found by testing every one):
# DEL, U+166D (Po -> So), U+1734 (Mn -> Mc), U+1885 and U+1886 (Lo -> Mn).
EXCEPTIONS = frozenset({0x7F, 0x166D, 0x1734, 0x1885, 0x1886})
# tokie 0.1.4 encodes a text of 64 KiB or more in parallel chunks cut at byte offsets: a word across
# a cut comes out as two ("a" * 65536: two [UNK] where tokenizers gives one) and a multi-byte space
# at a cut panics. Longer texts go to tokenizers; a long input that is truncated reaches this module
# as a window of a few thousand characters (TextTokenizer._bounded).
MAX_CHARS = 8192  # at most 32 KiB in UTF-8: half the size where tokie starts to cut
# Planes 0-2 and 14 are read through the table; planes 3-13, 15 and 16 (nothing there in Unicode 3.2
# but private use) always go to ``tokenizers``.
_CHECKED_PLANES = (range(0x30000), range(0xE0000, 0xE1000))


@functools.cache
def _unsafe_starts() -> tuple[list[int], list[int]]:
    """Sorted (starts, ends) of the code point ranges ``safe`` refuses, inclusive (~40 ms, once)."""
    old = unicodedata.ucd_3_2_0
    starts: list[int] = []
    ends: list[int] = []
    for plane in _CHECKED_PLANES:
        for c in plane:
            if c in EXCEPTIONS or old.category(chr(c)) == "Cn":
                if ends and ends[-1] == c - 1:
                    ends[-1] = c
                else:
                    starts.append(c)
                    ends.append(c)
    starts.append(0xD800)  # surrogates (never in a valid str from JSON, but a str may hold them)
    ends.append(0xDFFF)
    starts.append(0x30000)
    ends.append(0xDFFFF)
    starts.append(0xE1000)
    ends.append(0x10FFFF)
    order = sorted(range(len(starts)), key=starts.__getitem__)
    return [starts[i] for i in order], [ends[i] for i in order]


def safe(text: str) -> bool:
    """Whether ``text`` is one ``tokie`` reads as ``tokenizers`` does: at most ``MAX_CHARS`` long,
    every character admitted (module docstring)."""
    if len(text) > MAX_CHARS:
        return False
    if text.isascii():
        return "\x7f" not in text
    starts, ends = _unsafe_starts()
    for ch in set(text):
        c = ord(ch)
        k = bisect.bisect_right(starts, c) - 1
        if k >= 0 and c <= ends[k]:
            return False
    return True


def fast_wordpiece(tokenizer: Tokenizer, path: str) -> FastWordPiece | None:
    """``FastWordPiece.of(tokenizer, path)``, or None (the caller keeps ``tokenizers``) when the file
    is not eligible or tokie is not installed; the backend chosen is logged once."""
    return tokie_path(lambda: FastWordPiece.of(tokenizer, path), path, "WordPiece")


class FastWordPiece(TokieSplit):
    """``tokie``'s tokenizer for one BERT WordPiece ``tokenizer.json``, built once.

    Thread-safe (immutable; tokie releases the GIL while it encodes). ``ids`` equals
    ``Tokenizer.encode(text, add_special_tokens=False).ids`` (``tokenizers`` itself for a text
    ``safe`` refuses); ``template`` describes what ``add_special_tokens=True`` adds, single and pair."""

    @classmethod
    def of(cls, tokenizer: Tokenizer, path: str) -> FastWordPiece:
        """Raises Ineligible naming the first part of the file that is not reproduced exactly (or a
        probe text whose ids differ), ImportError without tokie."""
        j = tokenizer_json(tokenizer, models.WordPiece)
        try:
            _check(j)
            template = template_of(j.get("post_processor"), want_pair=True)
            added = added_of(j.get("added_tokens") or [])
        except (KeyError, TypeError, AttributeError, IndexError) as e:  # a shape this module does not know
            raise Ineligible(f"unexpected tokenizer.json shape ({type(e).__name__}: {e})") from None
        out = cls(tokie_of(path), reference_of(tokenizer), added, template)
        out.check(_PROBES)
        return out

    def ids(self, text: str) -> list[int]:
        return super().ids(text) if safe(text) else self.reference_ids(text)


def _check(j: dict[str, Any]) -> None:
    n, p, m = j.get("normalizer") or {}, j.get("pre_tokenizer") or {}, j.get("model") or {}
    if n.get("type") != "BertNormalizer" or not n.get("clean_text") or not n.get("handle_chinese_chars"):
        raise Ineligible(f"normalizer {n}")
    if (bool(n.get("lowercase")), n.get("strip_accents")) not in TESTED_NORMALIZERS:
        raise Ineligible(f"normalizer lowercase={n.get('lowercase')} strip_accents={n.get('strip_accents')}")
    if p.get("type") != "BertPreTokenizer":
        raise Ineligible(f"pre-tokenizer {p.get('type')}")
    if m.get("type") != "WordPiece" or m.get("continuing_subword_prefix") != "##" or m.get("max_input_chars_per_word") != 100:
        raise Ineligible(f"model {m.get('type')} prefix={m.get('continuing_subword_prefix')!r} "
                         f"max_input_chars_per_word={m.get('max_input_chars_per_word')}")
    if m.get("unk_token") not in m.get("vocab", {}):
        raise Ineligible("the unknown token is not in the vocabulary")


_PROBES = (
    "The quick brown fox, naïve café résumé — “quoted” 中文字符 and ÀÉÎÕÜ ǅ ß ﬁ!",
    "unaffable [CLS] x[SEP]y [MASK] tab\there\nnew\r\nline 1,234.56 e-mail@x.org #hash ##x",
    "x" * 100 + " " + "y" * 101 + " " + "é" * 100 + " " + "ж" * 101,
    "a\x00b\x01c\u200bd\ufeffe\u00a0f\u3000g\u2028h e\u0301 \u0301 Å Ω",
)
