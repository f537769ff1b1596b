"""Where a long text's kept tokens come from: the window at the kept end that ``TextTokenizer``
tokenizes instead of the whole text when truncation is on (bouquet/tokenization.py, ``_bounded``).
Pure string work; no tokenizer here."""
from __future__ import annotations

import functools
import re
import string
from typing import Literal

Side = Literal["left", "right"]

# A window of text tokenized for ``keep`` kept tokens starts at (keep + margin) * FIRST_CHARS_PER_TOKEN
# characters (~1-1.5 characters per token in CJK, ~4.5 in English, for all three tokenizer kinds)
# and grows by the characters per token it showed until it yields keep + margin tokens; the margin
# holds the tokens that the cut can change. Texts shorter than WINDOWED_CHARS_PER_TOKEN characters
# per kept token are tokenized whole.
FIRST_CHARS_PER_TOKEN = 2
WINDOWED_CHARS_PER_TOKEN = 6
# Truncation off, a text longer than this is refused from a window at its start when that window
# already holds too many tokens, its count then a lower bound; a shorter one is counted whole for an
# exact count in the 400 (at most ~0.1 s of the slowest text: WordPiece's 99-letter words).
PROBED_CHARS = 32_768
# A cut inside a word is kept only when the windows 1 .. UNCLEAN_CHECKS characters longer agree with it
# on the kept tokens: Unigram's segmentation of a run can depend on its length by a period longer
# than 2 ("x" * n by n mod 3; "ab" * n by n mod 4 in XLM-R, where n and n + 1 can agree and n + 2 not).
UNCLEAN_CHECKS = 4
# A word boundary for every tokenizer kind: a plain space after a non-space character (inside a run
# of whitespace, BPE merges and Unigram's segmentation of the run depend on its length).
SPACE = re.compile(r"(?<=\S) ")
# BERT's pre-tokenizer splits at every whitespace and around every punctuation character, and its
# normalizer pads CJK ideographs with spaces (``handle_chinese_chars``): a cut next to one of them
# is a boundary too. Only characters whose normalized form is certain stay a boundary: ASCII
# whitespace that the normalizer keeps (it drops other controls, \x0b and \x0c among them), ASCII
# punctuation, and the two main ideograph blocks, which NFD leaves as they are. Without these, a
# text of punctuation or CJK alone (no space to cut at) was tokenized whole, and twice over.
_BERT_CHARS = " \t\n\r" + re.escape(string.punctuation)
_CJK = "\u3400-\u4dbf\u4e00-\u9fff"


def bert_boundary(chinese_chars: bool) -> re.Pattern[str]:
    """The cut positions (zero-width matches) of a tokenizer with BERT's normalizer and
    pre-tokenizer (Hugging Face ``tokenizers``' ``BertNormalizer``,
    ``BertPreTokenizer``); ``chinese_chars``: the normalizer's ``handle_chinese_chars``."""
    chars = _BERT_CHARS + (_CJK if chinese_chars else "")
    return re.compile(f"(?<=[{chars}])|(?=[{chars}])")


def margin(keep: int) -> int:
    return 16 + keep // 16


def window(text: str, side: Side, chars: int, boundary: re.Pattern[str] = SPACE) -> tuple[str, bool]:
    """(the first (``right``) or last (``left``) ``chars`` characters of ``text``, whether the cut
    is clean): all of the text when shorter (clean); else cut where a ``boundary`` match starts
    within the window's outer eighth when there is one (clean: the prefix ends before it, the
    suffix starts with it; ``SPACE`` or ``bert_boundary``), else at ``chars`` (not clean: inside
    a word or a run of whitespace)."""
    if chars >= len(text):
        return text, True
    reach = max(1, chars // 8)
    if side == "right":
        last = _last(boundary).match(text, chars - reach, chars)
        if last is not None:
            return text[:last.start(1)], True
        return text[:chars], False
    start = len(text) - chars
    m = boundary.search(text, start, start + reach)
    return (text[m.start():], True) if m is not None else (text[start:], False)


@functools.cache
def _last(boundary: re.Pattern[str]) -> re.Pattern[str]:
    """``boundary``'s last match in a span, found from the span's end (group 1): one backtracking
    match in C instead of a Python loop over every match (BERT's cuts match at most characters)."""
    return re.compile(f"(?s:.*)({boundary.pattern})")


def same_end(a: list[int], b: list[int], keep: int, side: Side) -> bool:
    return a[:keep] == b[:keep] if side == "right" else a[-keep:] == b[-keep:]
