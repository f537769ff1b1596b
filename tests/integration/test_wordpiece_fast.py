"""The tokie path for BERT WordPiece (bouquet/wordpiece_fast.py) against Hugging Face ``tokenizers``
(the reference) on the real all-MiniLM-L6-v2 tokenizer.json (bert-base-uncased's vocabulary) and
its cased variants: the same ids on every STSb sentence, hard scripts, random Unicode and every
character ``safe`` admits, in several contexts; texts with other characters through ``tokenizers``;
TextTokenizer's outputs (single texts and (query, document) pairs, truncation on both sides,
TooLong, a query that leaves no room) the same as with ``tokenizers`` alone; files it does not
reproduce refused.
"""
from __future__ import annotations

import dataclasses
import json
import random
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from bouquet.tokenized import TooLong
from bouquet.wordpiece_fast import MAX_CHARS, FastWordPiece, Ineligible, fast_wordpiece, safe
from tests.helpers import read_sts
from tests.integration.test_bpe_fast import _prose, _random_text, _sts, hard_texts


def _minilm() -> str:
    return str(load_spec(None).tokenizer_path)


def _variant(change) -> tuple[Tokenizer, str]:
    j = json.loads(open(_minilm(), encoding="utf-8").read())
    j["padding"] = j["truncation"] = None
    change(j)
    return Tokenizer.from_str(json.dumps(j)), json.dumps(j)


def _of(tok: Tokenizer, text: str, tmp_path) -> FastWordPiece:
    path = tmp_path / "tokenizer.json"
    path.write_text(text, encoding="utf-8")
    return FastWordPiece.of(tok, str(path))


@pytest.fixture(scope="module")
def hf() -> Tokenizer:
    tok = Tokenizer.from_file(_minilm())
    tok.no_padding()  # the file pads and truncates to 128
    tok.no_truncation()
    return tok


@pytest.fixture(scope="module")
def fast(hf: Tokenizer) -> FastWordPiece:
    return FastWordPiece.of(hf, _minilm())


def _bert_texts() -> list[str]:
    return [*hard_texts(), "[CLS] hello [SEP] x[MASK]y [UNK][PAD] a[SEP]b [cls] [SEP]", "unaffable " * 30,
            *("x" * n for n in (99, 100, 101, 150)), *(c * n for c in "éж中" for n in (99, 100, 101)),
            "ǅungla ǈ ǋ İstanbul ΣΑΣ ß ẞ ﬃ Ⅻ ① ＡＢＣ", "e\u0301\u0302\u0323 \u0301\u0301x \u0338y a\u0308"]


def _bad(hf: Tokenizer, fast: FastWordPiece, texts: list[str]) -> list[str]:
    ref = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    return [t for t, e in zip(texts, ref) if fast.ids(t) != e]


def test_minilm_file_is_eligible(hf: Tokenizer, fast: FastWordPiece) -> None:
    assert fast.template.prefix == (101,) and fast.template.suffix == (102,) and fast.template.pair_added == 3
    assert fast_wordpiece(hf, _minilm()) is not None
    spec = load_spec(None)
    tt = TextTokenizer(spec)
    assert isinstance(tt._fast, FastWordPiece) and not tt.spreads_batches


def test_same_ids_on_every_sts_sentence(hf: Tokenizer, fast: FastWordPiece) -> None:
    texts = _sts()
    assert len(texts) > 5_000 and sum(map(safe, texts)) > 5_000  # nearly all on tokie
    bad = _bad(hf, fast, texts)
    assert not bad, f"{len(bad)} sentences differ, first {bad[0]!r}"


def test_same_ids_on_hard_texts(hf: Tokenizer, fast: FastWordPiece) -> None:
    bad = _bad(hf, fast, _bert_texts())
    assert not bad, [t[:60] for t in bad]


def test_same_ids_on_random_unicode(hf: Tokenizer, fast: FastWordPiece) -> None:
    r = random.Random(20261206)
    texts = [_random_text(r) for _ in range(6_000)]
    bad = _bad(hf, fast, texts)
    assert not bad, f"{len(bad)} of {len(texts)} differ, first {bad[0]!r}"
    # random text of admitted characters only, so that tokie (not the fallback) is what is compared
    pool = [chr(c) for c in range(0x30000) if safe(chr(c))]
    texts = ["".join(r.choice(pool) if r.random() < 0.4 else r.choice("ab cd,.!'\n\t-") for _ in range(r.randrange(1, 150)))
             for _ in range(6_000)]
    assert all(map(safe, texts))
    bad = _bad(hf, fast, texts)
    assert not bad, f"{len(bad)} of {len(texts)} differ, first {bad[0]!r}"


def _contexts(c: str) -> str:
    return f"{c} a{c}b {c}{c}{c} x{c}1 é{c}! {c}\u0301 [SEP]{c} {c}"


def test_same_ids_on_every_admitted_character(hf: Tokenizer, fast: FastWordPiece) -> None:
    """Every character ``safe`` admits, alone and inside words, next to digits, accents, marks and
    special tokens; and every character it refuses goes to ``tokenizers``."""
    admitted = [chr(c) for c in (*range(0xD800), *range(0xE000, 0x110000)) if safe(chr(c))]
    assert len(admitted) > 100_000 and not safe("\x7f") and not safe("\U0001F600")
    for i in range(0, len(admitted), 50_000):
        bad = _bad(hf, fast, [_contexts(c) for c in admitted[i:i + 50_000]])
        assert not bad, f"{len(bad)} differ, first U+{ord(bad[0][0]):04X}"
    # what is refused is rare in text: every character of these blocks is admitted
    for a, b in ((0x20, 0x7E), (0xA0, 0x17F), (0x391, 0x3A1), (0x3A3, 0x3C9), (0x410, 0x44F), (0x2010, 0x2027),
                 (0x3041, 0x3094), (0x30A1, 0x30FA), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0xFF01, 0xFF5E)):
        refused = [hex(c) for c in range(a, b + 1) if not safe(chr(c))]
        assert not refused, (hex(a), refused[:5])


def test_texts_of_64_kib_and_more(hf: Tokenizer, fast: FastWordPiece) -> None:
    """tokie 0.1.4 cuts a text of 64 KiB into chunks at byte offsets (found by a new-user trial
    through /v1/embeddings: 4 tokens counted for "a" * 65536 instead of 3; ideographic spaces at a
    cut panic): texts over MAX_CHARS go to tokenizers, a panic anyway to tokenizers too."""
    texts = ["a" * 65536, "a" * 65537, "é" * 40000, "a" * 99999 + " b", "x " + "中" * 70000,
             "\x1c".join(["a" * 100] * 700), "\u3000".join(["b" * 200] * 400), "x" * (MAX_CHARS + 1)]
    assert not _bad(hf, fast, texts)
    assert not any(map(safe, texts)) and safe("x" * MAX_CHARS)
    got, ref = _pair(512, "embed")
    for side in ("right", "left"):
        a, b = got.encode(texts, True, side), ref.encode(texts, True, side)
        assert not _differ(a.ids, b.ids), side
    panics = "\u3000".join(["b" * 200] * 400)  # straight to tokie's pieces: its panic is caught
    assert fast.pieces(panics) == hf.encode(panics, add_special_tokens=False).ids
    assert fast.ids("still well after it") == hf.encode("still well after it", add_special_tokens=False).ids


def test_million_characters(hf: Tokenizer, fast: FastWordPiece) -> None:
    text = _prose(1_000_000, 5) + "[SEP]" + "中文" * 1000
    assert fast.ids(text) == hf.encode(text, add_special_tokens=False).ids  # through tokenizers


@pytest.mark.parametrize("lower, strip", [(False, None), (False, False), (True, True)])
def test_cased_and_accent_variants(lower: bool, strip: bool | None, tmp_path) -> None:
    tok, text = _variant(lambda j: j["normalizer"].update(lowercase=lower, strip_accents=strip))
    tok.no_truncation()
    tok.no_padding()
    fast = _of(tok, text, tmp_path)
    r = random.Random(7)
    texts = _sts()[:2_000] + _bert_texts() + [_random_text(r) for _ in range(2_000)]
    texts += [_contexts(chr(c)) for c in range(0x2000) if safe(chr(c))]
    bad = _bad(tok, fast, texts)
    assert not bad, f"{len(bad)} differ, first {bad[0][:60]!r}"


@pytest.mark.parametrize("change, why", [
    (lambda j: j["normalizer"].update(clean_text=False), "normalizer"),
    (lambda j: j["normalizer"].update(lowercase=False, strip_accents=True), "strip_accents"),
    (lambda j: j.update(normalizer={"type": "NFKC"}), "normalizer"),
    (lambda j: j.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer Whitespace"),
    (lambda j: j["model"].update(max_input_chars_per_word=200), "max_input_chars_per_word=200"),
    (lambda j: j["model"].update(continuing_subword_prefix="@@"), "prefix"),
    (lambda j: j["added_tokens"][0].update(normalized=True), "normalized"),
    (lambda j: j["added_tokens"][1].update(lstrip=True), "lstrip"),
    (lambda j: j.update(post_processor={"type": "RobertaProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101],
                                        "trim_offsets": False, "add_prefix_space": False}), "post-processor RobertaProcessing"),
])
def test_files_it_does_not_reproduce_are_refused(change, why: str, tmp_path) -> None:
    tok, text = _variant(change)
    with pytest.raises(Ineligible, match=why):
        _of(tok, text, tmp_path)
    path = tmp_path / "tokenizer.json"
    assert fast_wordpiece(tok, str(path)) is None


def test_bpe_files_are_refused() -> None:
    from tests.integration.test_bpe_fast import _qwen_json

    tok = Tokenizer.from_file(str(_qwen_json()))
    with pytest.raises(Ineligible, match="model BPE"):
        FastWordPiece.of(tok, str(_qwen_json()))


def test_without_tokie_tokenizers_does_it(hf: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokie", None)  # `import tokie` raises ImportError
    assert fast_wordpiece(hf, _minilm()) is None
    assert TextTokenizer(load_spec(None)).spreads_batches


# ---- TextTokenizer: every output as with tokenizers alone -----------------------------------------
def _pair(limit: int, task: str) -> tuple[TextTokenizer, TextTokenizer]:
    """(the tokie-backed TextTokenizer, the same with its fast path switched off)."""
    spec = dataclasses.replace(load_spec(None), max_seq_length=limit, task=task)
    got, ref = TextTokenizer(spec), TextTokenizer(spec)
    ref._fast = None
    assert isinstance(got._fast, FastWordPiece) and ref.spreads_batches
    return got, ref


def _differ(a: list[np.ndarray], b: list[np.ndarray]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x.dtype != np.int32 or not np.array_equal(x, y)]


@pytest.mark.parametrize("limit", [16, 128, 512])
def test_text_tokenizer_outputs_are_unchanged(limit: int) -> None:
    got, ref = _pair(limit, "embed")
    s1, s2, _ = read_sts("test")
    assert_texts_unchanged(got, ref, s1[:300] + s2[:300] + _bert_texts() + [_prose(1_000_000, 11), "😀 " * 400], limit)


def assert_texts_unchanged(got: TextTokenizer, ref: TextTokenizer, texts: list[str], limit: int) -> None:
    """``got`` (a fast path) encodes ``texts`` as ``ref`` (tokenizers alone) does: truncated on
    either side, the kept parts, untruncated, and the same TooLong; the template adds 2 tokens."""
    for side in ("right", "left"):
        a, b = got.encode(texts, True, side), ref.encode(texts, True, side)
        assert not _differ(a.ids, b.ids) and a.num_tokens == b.num_tokens, f"{side}: texts {_differ(a.ids, b.ids)} differ"
        assert max(len(x) for x in a.ids) == limit
        assert got.kept_parts(texts, side) == ref.kept_parts(texts, side)
    plain = ref.plain_ids(texts)
    assert got.plain_ids(texts) == plain
    short = [t for t, ids in zip(texts, plain) if len(ids) + 2 <= limit]
    a, b = got.encode(short, False), ref.encode(short, False)
    assert not _differ(a.ids, b.ids) and a.num_tokens == b.num_tokens
    with pytest.raises(TooLong) as e1:
        got.encode(texts, False)
    with pytest.raises(TooLong) as e2:
        ref.encode(texts, False)
    assert (e1.value.index, e1.value.count, e1.value.limit) == (e2.value.index, e2.value.count, e2.value.limit)


def assert_pairs_unchanged(got: TextTokenizer, ref: TextTokenizer, pairs: list[tuple[str, str]], limit: int,
                           added: int) -> None:
    """``got`` encodes (query, document) ``pairs`` as ``ref`` does: ids and type ids, documents
    cut on either side, untruncated where they fit (the pair template adds ``added`` tokens), and
    the same TooLong."""
    for side in ("right", "left"):
        a, b = got.encode_pairs(pairs, side), ref.encode_pairs(pairs, side)
        assert not _differ(a.ids, b.ids) and not _differ(a.type_ids, b.type_ids) and a.num_tokens == b.num_tokens, side
        assert max(len(x) for x in a.ids) == limit
    fits = [(q, d) for q, d in pairs if len(ref.plain_ids([q])[0]) + len(ref.plain_ids([d])[0]) + added <= limit]
    assert len(fits) > (100 if limit == 512 else 0)
    a, b = got.encode_pairs(fits, truncate=False), ref.encode_pairs(fits, truncate=False)
    assert not _differ(a.ids, b.ids) and not _differ(a.type_ids, b.type_ids)
    with pytest.raises(TooLong) as e1:
        got.encode_pairs(pairs, truncate=False)
    with pytest.raises(TooLong) as e2:
        ref.encode_pairs(pairs, truncate=False)
    assert (e1.value.index, e1.value.count) == (e2.value.index, e2.value.count)


@pytest.mark.parametrize("limit", [24, 512])
def test_pairs_are_unchanged(limit: int) -> None:
    """Cross-encoder pairs: ids and token types, documents cut on either side, long documents
    through their window, a document of other characters through tokenizers, TooLong without
    truncation, and the same refusal of a query that leaves its document no room."""
    got, ref = _pair(limit, "score")
    s1, s2, _ = read_sts("test")
    docs = s2[:200] + [_prose(n, n) for n in (1_000, 3_000, 50_000)] + _bert_texts()[:40] + ["😀 " * 300, "x"]
    pairs = [(s1[i % 50], d) for i, d in enumerate(docs)]
    assert_pairs_unchanged(got, ref, pairs, limit, 3)
    assert {int(t) for x in got.encode_pairs(pairs).type_ids for t in x} == {0, 1}
    long_query = [("word " * (limit - 3), "document"), ("word " * (limit - 4), "document text")]
    with pytest.raises(Exception) as e1:
        got.encode_pairs(long_query[:1])
    with pytest.raises(Exception) as e2:
        ref.encode_pairs(long_query[:1])
    assert not isinstance(e1.value, TooLong) and not isinstance(e2.value, TooLong)
    assert str(e1.value) == str(e2.value)  # one wording on both paths
    a, b = got.encode_pairs(long_query[1:]), ref.encode_pairs(long_query[1:])  # one document token left
    assert not _differ(a.ids, b.ids) and len(a.ids[0]) == limit


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5])
def test_pairs_at_limits_near_the_template(limit: int) -> None:
    """A limit of at most the pair template's 3 tokens: tokenizers truncates nothing below it and
    both sequences to nothing at it (("", "a") at 3 is [CLS] [SEP] [SEP]); just above, the same
    ids or the same refusal."""
    got, ref = _pair(limit, "score")
    for q, d in [("", ""), ("", "a"), ("a", ""), ("a", "a"), ("hello world", "foo bar baz"), ("", "foo bar")]:
        for side in ("right", "left"):
            try:
                b = ref.encode_pairs([(q, d)], side)
            except Exception:  # noqa: BLE001 - tokenizers' bare Exception: the query leaves no room
                with pytest.raises(Exception) as e:
                    got.encode_pairs([(q, d)], side)
                assert not isinstance(e.value, TooLong)
                continue
            a = got.encode_pairs([(q, d)], side)
            assert not _differ(a.ids, b.ids) and not _differ(a.type_ids, b.type_ids), (q, d, side, a.ids, b.ids)


@pytest.mark.parametrize("side, text", [
    ("right", "x" * 101 + " a" * 72),  # [CLS] [UNK] a a a a a [SEP]
    ("right", "x" * 60 + "\u16a0" + " a" * 80),  # a 61-character word: the rune is not in the vocabulary
    ("left", " a" * 72 + " " + "e\u0301" * 150),  # 300 characters, 150 once the accents go
])
def test_window_cut_inside_an_unknown_word(side: str, text: str) -> None:
    """Truncation of a long text keeps what tokenizers keeps from the whole text, on both paths,
    also when the window's cut falls inside a word that WordPiece reads as one [UNK] (found by an
    adversarial trial: the one-character-longer check window agreed with the cut's pieces)."""
    spec = dataclasses.replace(load_spec(None), max_seq_length=8)
    got, ref = TextTokenizer(spec), TextTokenizer(spec)
    ref._fast = None
    hf = Tokenizer.from_file(_minilm())
    hf.no_padding()
    hf.enable_truncation(8, direction=side)
    assert got.encode([text], True, side).ids[0].tolist() == ref.encode([text], True, side).ids[0].tolist()
    assert got.encode([text], True, side).ids[0].tolist() == hf.encode(text).ids
