"""Byte-level BPE through ``tiktoken`` (~5x faster per text than ``tokenizers`` 0.23 here), used only
for a ``tokenizer.json`` whose ids it provably reproduces; every other file stays on ``tokenizers``.

What ``tokenizers`` runs on one text, and what this module runs instead:

1. added tokens are cut out of the raw text (leftmost-longest, Aho-Corasick): the same cut in
   Python (bouquet/fast_ids.py, ``AddedSplit``);
2. each piece between them is normalized (NFC or nothing): by the file's own normalizer object,
   so the Unicode version is the library's;
3. the pre-tokenizer's regular expression splits the piece (``Split``, behavior ``Isolated``, then
   ``ByteLevel`` without its regex; or a lone ``ByteLevel`` with GPT-2's expression): tiktoken splits
   with the same expression (fancy-regex instead of Oniguruma: tests/integration/test_bpe_fast.py
   compares them on every code point);
4. BPE over the pre-token's bytes.

Step 4 is where the two libraries differ in kind. ``tokenizers`` merges the adjacent pair with the
lowest *merge index* among the pairs listed as merges; tiktoken merges the adjacent pair whose
concatenation has the lowest *id* among pairs whose concatenation is any token (and returns a
pre-token that is a token as it is). Both take the leftmost on ties. They agree on every input when
(checked in ``FastBPE.of``):

- (a) each token that the merges can make is made by exactly one merge, and merge order is id order;
- (b) ``tokenizers`` turns each such token's own bytes into that one token.

Sketch: with (a), the runs only part where tiktoken takes a pair (x', y') that is not the merge
making t = x' + y'. Before that step no merge crossed t's span, so the run inside the span is
tiktoken's run on t's bytes alone, whose last merge would then be (x', y'); by induction on length
with (b), that run is ``tokenizers``' run, whose last merge is t's own: a contradiction. Tokens that
``tokenizers`` never makes from their own bytes (added tokens kept in the vocabulary, merges over
them) are left out of tiktoken's table: by the same span argument no context makes them either.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from tokenizers import Tokenizer, models

from bouquet.fast_ids import AddedSplit, Ineligible, Template, added_of, template_of, tokenizer_json

log = logging.getLogger(__name__)
# GPT-2's expression, as ``tokenizers``' ByteLevel pre-tokenizer runs it with ``use_regex``
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Split expressions tiktoken's fancy-regex is known to read as Oniguruma does (tested on every code
# point): Qwen2/2.5/3's, and GPT-2's. Another expression may use a construct the two read apart. Both
# match every character (a letter, a number, whitespace or anything else): tiktoken drops text that
# no match covers, where ``Split`` (Isolated) keeps it as a piece.
KNOWN_PATTERNS = frozenset({
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    GPT2_PATTERN,
})


def fast_bpe(tokenizer: Tokenizer, name: str) -> FastBPE | None:
    """``FastBPE.of(tokenizer)``, or None (the caller keeps ``tokenizers``) when the file is not
    eligible or tiktoken is not installed; the backend chosen is logged once (``name``: the file)."""
    import tokenizers

    try:
        fast = FastBPE.of(tokenizer)
    except (Ineligible, ImportError) as e:
        log.debug("tokenizer: no tiktoken path for %s: %s", name, e)
        return None
    import tiktoken

    log.info("tokenizer: tiktoken %s for %s (byte-level BPE, ids as tokenizers %s gives them)",
             tiktoken.__version__, name, tokenizers.__version__)
    return fast


def byte_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: character → byte. Printable Latin-1 bytes ('!'..'~', '¡'..'¬',
    '®'..'ÿ') stand for themselves; the other 68 bytes, in order, for U+0100, U+0101, ..."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in out.values()]
    out.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return out


class FastBPE(AddedSplit):
    """The ``tiktoken.Encoding`` equivalent to one byte-level BPE ``tokenizer.json``, built once.

    Thread-safe (immutable; tiktoken releases the GIL while it encodes). ``ids`` equals
    ``Tokenizer.encode(text, add_special_tokens=False).ids``; ``template`` describes what
    ``add_special_tokens=True`` adds to a single text."""

    def __init__(self, encoding: Any, added: dict[str, int], normalize: Callable[[str], str] | None,
                 template: Template) -> None:
        super().__init__(added)
        self._encode = encoding.encode_ordinary
        self._normalize = normalize
        self.template = template

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> FastBPE:
        """Raises Ineligible naming the first part of the file that is not reproduced exactly,
        ImportError without tiktoken. Costs ~1 s on Qwen3's 151,643 tokens (most of it check (b))."""
        import tiktoken

        j = tokenizer_json(tokenizer, models.BPE)
        try:
            normalize = _normalizer(j.get("normalizer"))
            pattern = _pattern(j.get("pre_tokenizer"))
            template = template_of(j.get("post_processor"))
            added = added_of(j.get("added_tokens") or [])
            ranks = _ranks(tokenizer, j.get("model") or {})
        except (KeyError, TypeError, AttributeError) as e:  # a shape this module does not know
            raise Ineligible(f"unexpected tokenizer.json shape ({type(e).__name__}: {e})") from None
        encoding = tiktoken.Encoding("bouquet-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        return cls(encoding, added, normalize, template)

    def pieces(self, text: str) -> list[int]:
        return self._encode(self._normal(text))

    def _normal(self, text: str) -> str:
        # ASCII is NFC already; the library's own NFC otherwise (Unicode tables of one version)
        return text if self._normalize is None or text.isascii() else self._normalize(text)


def _normalizer(n: dict[str, Any] | None) -> Callable[[str], str] | None:
    if n is None:
        return None
    if n.get("type") == "Sequence" and not n.get("normalizers"):
        return None
    if n.get("type") == "NFC":
        from tokenizers.normalizers import NFC

        return NFC().normalize_str
    raise Ineligible(f"normalizer {n.get('type')}")


def _pattern(p: dict[str, Any] | None) -> str:
    def byte_level(b: dict[str, Any], regex: bool) -> None:
        if b.get("type") != "ByteLevel" or b.get("add_prefix_space") or bool(b.get("use_regex", True)) != regex:
            raise Ineligible(f"pre-tokenizer {b}")

    if p is None:
        raise Ineligible("no pre-tokenizer")
    if p.get("type") == "ByteLevel":
        byte_level(p, True)
        return GPT2_PATTERN
    parts = (p.get("pretokenizers") or []) if p.get("type") == "Sequence" else []
    if len(parts) != 2:
        raise Ineligible(f"pre-tokenizer {p.get('type')}")
    split, bl = parts
    byte_level(bl, False)
    regex = (split.get("pattern") or {}).get("Regex")
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert") or regex is None:
        raise Ineligible(f"pre-tokenizer {split}")
    if regex not in KNOWN_PATTERNS:
        raise Ineligible(f"split expression {regex!r} is not one of those tested")
    return regex


def _ranks(tokenizer: Tokenizer, m: dict[str, Any]) -> dict[bytes, int]:
    """The vocabulary as tiktoken's byte-string → rank table, after checks (a) and (b) of the
    module docstring; tokens that ``tokenizers`` cannot make are left out."""
    if m.get("type") != "BPE":
        raise Ineligible(f"model {m.get('type')}")
    for key, ok in (("dropout", None), ("continuing_subword_prefix", ""), ("end_of_word_suffix", ""),
                    ("byte_fallback", False), ("ignore_merges", False)):
        if (m.get(key) or ok) != ok:
            raise Ineligible(f"BPE {key} = {m.get(key)!r}")
    vocab: dict[str, int] = m["vocab"]
    alphabet = byte_chars()
    if any(c not in vocab for c in alphabet) or len(set(vocab.values())) != len(vocab):
        raise Ineligible("the vocabulary lacks a byte or repeats an id")
    # (b): each token's characters through the model alone, as pre-tokenized words (one word each),
    # 16 sequences for the library's threads; word by word only in a sequence that is not all made
    words = [w for w in vocab if len(w) > 1 and alphabet.keys() >= set(w)]
    alone = Tokenizer(tokenizer.model)
    made: set[str] = set()
    chunks = [words[i::16] for i in range(16)]
    for chunk, enc in zip(chunks, alone.encode_batch_fast(chunks, is_pretokenized=True, add_special_tokens=False)):
        if enc.ids == [vocab[w] for w in chunk]:
            made.update(chunk)
        else:
            made.update(w for w, e in zip(chunk, alone.encode_batch_fast(chunk, add_special_tokens=False))
                        if e.ids == [vocab[w]])
    # (a): over the merges that make those tokens (no other merge ever fires)
    last = -1
    producers: set[str] = set()
    for pair in m.get("merges") or []:  # "a b" (tokenizers < 0.20) or ["a", "b"]
        result = pair.replace(" ", "", 1) if isinstance(pair, str) else pair[0] + pair[1]
        if result not in made:
            continue
        if result in producers or vocab[result] <= last:
            raise Ineligible(f"merge {pair!r}: its token {vocab[result]} is made twice or out of id order")
        producers.add(result)
        last = vocab[result]
    to_latin1 = str.maketrans({c: chr(b) for c, b in alphabet.items()})  # then .encode("latin-1"): the bytes
    return {w.translate(to_latin1).encode("latin-1"): vocab[w] for w in (*alphabet, *made)}
