"""What the faster tokenizer paths share (bouquet/bpe_fast.py: tiktoken for byte-level BPE,
bouquet/wordpiece_fast.py and bouquet/unigram_fast.py: tokie for BERT's WordPiece and XLM-R's
Unigram): the post-processor as fixed ids around the text's (``Template``), the added tokens cut
out of the raw text first, as ``tokenizers`` does, the refusal (``Ineligible``) of a
``tokenizer.json`` part they do not reproduce exactly, and tokie's loading and fallbacks.

``tokenizers`` stays the reference: each path is used only for files whose ids it is tested to
reproduce (tests/integration/test_bpe_fast.py, test_wordpiece_fast.py, test_unigram_fast.py), and
character offsets always come from ``tokenizers``.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Callable, Iterable, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class Ineligible(ValueError):
    """The tokenizer.json uses something a fast path does not reproduce exactly (the message says what)."""


@dataclass(frozen=True)
class Template:
    """A post-processor as fixed ids around the text's. Single sequence: ``prefix + ids + suffix``
    (None and ByteLevel: nothing around; TemplateProcessing: its ``single`` special tokens).
    ``pair``: the ``pair`` template's pieces in order, each (``"A"``, ``"B"`` or ``""`` for special
    tokens, the special tokens' ids, its type id); None when the file has no pair template."""

    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    pair: tuple[tuple[str, tuple[int, ...], int], ...] | None = None

    @property
    def added(self) -> int:
        return len(self.prefix) + len(self.suffix)

    @property
    def pair_added(self) -> int:
        return sum(len(ids) for _, ids, _ in self.pair or ())

    def wrap(self, ids: list[int], keep: int | None = None, side: str = "right") -> list[int]:
        """``ids`` cut to their first (``side`` "right") or last ("left") ``keep`` when longer (None:
        never), then the template's tokens around them: ``Tokenizer.post_process`` with truncation
        to ``keep + added`` tokens (``keep`` >= 1; ``tokenizers`` keeps room for the added tokens)."""
        if keep is not None and len(ids) > keep:
            ids = ids[:keep] if side == "right" else ids[len(ids) - keep:]
        return [*self.prefix, *ids, *self.suffix] if self.prefix or self.suffix else ids

    def wrap_pair(self, a: list[int], b: list[int], limit: int | None = None,
                  side: str = "right") -> tuple[list[int], list[int]]:
        """(ids, type ids) of the pair (a, b) as ``Tokenizer.post_process(a, b)`` gives them with
        truncation ``only_second`` to ``limit`` tokens in all (None: never): b loses its last
        (``side`` "right") or first ("left") tokens. Raises ValueError when a alone leaves b no
        token (``tokenizers``' "sequence too short" error)."""
        assert self.pair is not None
        if limit is not None:
            excess = len(a) + len(b) + self.pair_added - limit
            if excess > 0:
                if len(b) <= excess:
                    raise ValueError(f"the first sequence ({len(a)} tokens) leaves no room for the second in {limit}")
                b = b[: len(b) - excess] if side == "right" else b[excess:]
        ids: list[int] = []
        types: list[int] = []
        for part, specials, type_id in self.pair:
            seq = a if part == "A" else b if part == "B" else specials
            ids += seq
            types += [type_id] * len(seq)
        return ids, types


def tokenizer_json(tokenizer: Any, model: type) -> dict[str, Any]:
    """The tokenizer.json of a ``tokenizers.Tokenizer`` whose model is a ``model`` (a
    ``tokenizers.models`` class), parsed. Raises Ineligible for another model kind (checked before
    the JSON is written out: XLM-R's is 17 MB) or with ``encode_special_tokens`` set."""
    if getattr(tokenizer, "encode_special_tokens", False):
        raise Ineligible("encode_special_tokens is set")
    if not isinstance(tokenizer.model, model):
        raise Ineligible(f"model {type(tokenizer.model).__name__}")
    return json.loads(tokenizer.to_str())


def template_of(p: dict[str, Any] | None, want_pair: bool = False) -> Template:
    """The Template of a tokenizer.json ``post_processor``; ``want_pair``: its pair template too.
    Raises Ineligible for any other post-processor (or, with ``want_pair``, one without a pair)."""
    if p is None:
        return Template()
    kind = p.get("type")
    if kind == "Sequence":
        parts = [template_of(q, want_pair) for q in p.get("processors") or []]
        if sum(1 for t in parts if t.added or t.pair_added) > 1:
            raise Ineligible("post-processor: more than one template")
        return next((t for t in parts if t.added or t.pair_added), Template())
    if kind == "ByteLevel":  # offsets only
        return Template()
    if kind == "BertProcessing":  # [CLS] A [SEP] / [CLS] A [SEP] B:1 [SEP]:1
        cls, sep = (int(p["cls"][1]),), (int(p["sep"][1]),)
        return Template(cls, sep, (("", cls, 0), ("A", (), 0), ("", sep, 0), ("B", (), 1), ("", sep, 1)))
    if kind != "TemplateProcessing":
        raise Ineligible(f"post-processor {kind}")
    specials = p.get("special_tokens") or {}
    single = _pieces(p.get("single") or [], specials, "A")
    seen = [part for part, _, _ in single if part]
    if seen != ["A"]:
        raise Ineligible(f"post-processor single template {p.get('single')}")
    at = next(i for i, (part, _, _) in enumerate(single) if part)
    prefix = tuple(i for _, ids, _ in single[:at] for i in ids)
    suffix = tuple(i for _, ids, _ in single[at + 1:] for i in ids)
    pair = None
    if want_pair:
        pair = _pieces(p.get("pair") or [], specials, "AB")
        if [part for part, _, _ in pair if part] != ["A", "B"]:
            raise Ineligible(f"post-processor pair template {p.get('pair')}")
    return Template(prefix, suffix, pair)


def _pieces(template: list[dict[str, Any]], specials: dict[str, Any], names: str) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    out = []
    for piece in template:
        if "Sequence" in piece:
            name = piece["Sequence"].get("id")
            if name not in names:
                raise Ineligible(f"post-processor template piece {piece}")
            out.append((name, (), int(piece["Sequence"].get("type_id", 0))))
        else:
            tok = piece["SpecialToken"]
            out.append(("", tuple(int(i) for i in specials[tok["id"]]["ids"]), int(tok.get("type_id", 0))))
    return tuple(out)


def added_of(tokens: list[dict[str, Any]]) -> dict[str, int]:
    """tokenizer.json ``added_tokens`` → content: id. Raises Ineligible for a token matched other
    than as its exact raw text (single_word, lstrip, rstrip, normalized) or without content."""
    out: dict[str, int] = {}
    for t in tokens:
        flags = {k for k in ("single_word", "lstrip", "rstrip", "normalized") if t.get(k)}
        if flags or not t.get("content"):
            raise Ineligible(f"added token {t.get('content')!r} with {sorted(flags) or 'no content'}")
        out[t["content"]] = int(t["id"])
    return out


class AddedSplit:
    """Cuts the added tokens out of a raw text as ``tokenizers`` does before it normalizes
    (leftmost-longest: one regular expression of their escaped contents, longest first, since
    ``re`` takes the first alternative that matches at the leftmost position); ``pieces`` is the
    subclass's encoder of the text between them."""

    def __init__(self, added: dict[str, int]) -> None:
        self._added = added
        self._split = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))) if added else None

    def pieces(self, text: str) -> list[int]:
        """Token ids of a text without added tokens."""
        raise NotImplementedError

    def ids(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (no character offsets), untruncated: added
        tokens whole, ``pieces`` between them."""
        if self._split is None or not (found := self._split.search(text)):
            return self.pieces(text)
        out: list[int] = []
        start = 0
        while found is not None:
            if found.start() > start:
                out += self.pieces(text[start:found.start()])
            out.append(self._added[found.group()])
            start = found.end()
            found = self._split.search(text, start)
        if start < len(text):
            out += self.pieces(text[start:])
        return out


class TokieSplit(AddedSplit):
    """A tokie path (bouquet/wordpiece_fast.py, bouquet/unigram_fast.py): tokie's ids for the text
    between added tokens, the ``tokenizers`` reference for what tokie does not take (a text it
    panics on, a ``str`` with lone surrogates, whatever a subclass sends there), and the post-processor
    as ``template``. Thread-safe (immutable; tokie releases the GIL while it encodes)."""

    def __init__(self, fast: Any, reference: Any, added: dict[str, int], template: Template) -> None:
        super().__init__(added)
        self._fast = fast
        self._reference = reference
        self.template = template

    def reference_ids(self, text: str) -> list[int]:
        return self._reference.encode(text, add_special_tokens=False).ids

    def check(self, probes: Iterable[str]) -> None:
        """Raises Ineligible at the first probe text whose ids differ from the reference's: a
        different tokie build, or a file outside what was tested, is refused rather than guessed at."""
        for text in probes:
            if self.ids(text) != self.reference_ids(text):
                raise Ineligible(f"tokie's ids differ on the probe text {text[:40]!r}")

    def pieces(self, text: str) -> list[int]:
        try:
            return self._fast.encode(text, add_special_tokens=False).ids
        except UnicodeEncodeError:  # lone surrogates: tokenizers answers them as it always has
            return self.reference_ids(text)
        except BaseException as e:  # a Rust panic arrives as pyo3's PanicException, a BaseException
            if type(e).__name__ != "PanicException":
                raise
            log.warning("tokenizer: tokie failed on a text of %d characters (%s); tokenizers takes it", len(text), e)
            return self.reference_ids(text)


def tokie_of(path: str) -> Any:
    """tokie's Tokenizer for ``path``. Raises ImportError without tokie, Ineligible where it cannot
    read the file."""
    import tokie

    try:
        return tokie.Tokenizer.from_json(path)
    except Exception as e:  # noqa: BLE001 - tokie raises its own error types for files it cannot read
        raise Ineligible(f"tokie cannot read it: {e}") from None


def reference_of(tokenizer: Any) -> Any:
    """``tokenizer`` itself where it neither truncates nor pads (as TextTokenizer's, which never sets
    either on it afterwards: it truncates through copies), else a copy that does neither (a copy of
    XLM-R's 17 MB file costs ~1 s)."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    copy = type(tokenizer).from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def tokie_path(build: Callable[[], T], path: str, kind: str) -> T | None:
    """``build()``, or None (the caller keeps ``tokenizers``) when it raises Ineligible or
    ImportError (no tokie); the backend chosen is logged once."""
    import tokenizers

    try:
        fast = build()
    except (Ineligible, ImportError) as e:
        log.debug("tokenizer: no tokie path for %s: %s", path, e)
        return None
    log.info("tokenizer: tokie %s for %s (%s, ids as tokenizers %s gives them; other texts through tokenizers)",
             version("tokie"), path, kind, tokenizers.__version__)
    return fast
